"""The published pre-commit hooks, run by real pre-commit in a throwaway git repository.

Installing the hooks the way users get them (``language: python``: pre-commit pip-installs this
repository and its dependencies) takes a minute, so this test turns the published hooks into
``repo: local`` hooks with ``language: system`` and this environment's console scripts: it checks
the published ids, entries, arguments and file types, not pip. ``tests/test_ci_examples.py`` runs
the README's snippet as pasted, which is the full install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import FIXTURES, ROOT

BIN = Path(sys.executable).parent
PRE_COMMIT = shutil.which("pre-commit", path=str(BIN)) or shutil.which("pre-commit")
PLAIN_TORCH = (
    "import torch\nmodel = torch.nn.Linear(2, 2).to('cuda')\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "for x in loader:\n    loss = model(x.to('cuda')).sum()\n    loss.backward()\n"
    "    opt.step()\n"
)

pytestmark = pytest.mark.skipif(
    PRE_COMMIT is None or shutil.which("git") is None, reason="needs pre-commit and git"
)


def _git_repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text)
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
    }
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    subprocess.run(["git", "init", "-q"], cwd=path, check=True, env=env)
    subprocess.run(["git", "add", "."], cwd=path, check=True, env=env)
    return path


def _run(repo: Path, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PRE_COMMIT_HOME": str(home)}
    return subprocess.run(
        [PRE_COMMIT, *args], cwd=repo, capture_output=True, text=True, env=env, check=False
    )


def test_published_hooks_run_under_pre_commit(tmp_path: Path) -> None:
    published = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert {h["id"]: h["language"] for h in published} == {
        "accel-lint": "python",
        "accel-convert-check": "python",
    }
    local = []
    for hook in published:
        command, *args = hook["entry"].split()
        local.append({**hook, "language": "system", "entry": " ".join([str(BIN / command), *args])})
    config = {"repos": [{"repo": "local", "hooks": local}]}
    files = {
        "planted.py": (FIXTURES / "planted.py").read_text(),
        "plain.py": PLAIN_TORCH,
        "notes.txt": "not Python",
    }
    repo = _git_repo(tmp_path / "repo", files)
    (repo / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config))
    result = _run(repo, "run", "--all-files", home=tmp_path / "home")
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert "accel-lint" in out and "accel-convert --check" in out
    assert "planted.py:10:5: ACL201" in out
    assert "notes.txt" not in out
    assert "plain.py" in out.split("accel-convert --check")[1]  # the script needs converting
