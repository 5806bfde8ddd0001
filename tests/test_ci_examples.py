"""The README's CI examples, run as pasted: the pip line, the pre-commit snippet, the workflow.

Each block is read between its ``<!-- ci:NAME -->`` markers (as ``.ci/run`` reads the quick start).
The one thing changed is the repository URL: it points at a local git copy of this checkout (the
working tree as it is, so what is tested is what would be committed), tagged with the README's
``rev``. The user's side is a throwaway repository with a script to convert and one with findings.
GitHub itself is not run: the workflow's ``run:`` steps are, in order, with the shell options
GitHub uses; its ``uses:`` steps are checked for what they read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PRE_COMMIT = shutil.which("pre-commit", path=str(BIN))
SARIF_SCHEMA = ROOT / "tests" / "rules" / "sarif-schema-2.1.0.json"
# The repository URL as the README's blocks spell it (a user copies them unchanged).
REPOSITORY_URL = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+")
GITHUB_SHELL = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c"]
ENV = {
    **os.environ,
    "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}
# What the user's repository holds: a plain script with a place that needs a human, an
# Accelerate-style script with findings, and a file neither tool reads.
USER_FILES = {
    "train.py": ROOT / "fixtures" / "convert" / "metrics" / "dataset_average.in.py",
    "planted.py": ROOT / "fixtures" / "lint" / "planted.py",
}

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def readme_block(name: str) -> str:
    """The fenced block between ``<!-- ci:name -->`` and ``<!-- /ci:name -->``, fences removed."""
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- ci:{name} -->\n```\w*\n(.*?)```\n<!-- /ci:{name} -->", text, re.S)
    assert match, f"README.md has no ci:{name} block"
    return match.group(1)


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=repo, env=ENV, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def _repository(path: Path, files: dict[str, Path]) -> Path:
    """A git repository at ``path`` holding ``files`` (name -> where to copy it from), committed."""
    for name, source in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, path / name)
    _git(path, "init", "-q")
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "--no-verify", "-m", "snapshot")
    return path


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A local stand-in for the repository URL: this checkout's files, tagged with the README's
    ``rev``; the URL to use in its place."""
    listed = _git(ROOT, "ls-files", "--cached", "--others", "--exclude-standard", "-z")
    files = {name: ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()}
    repo = _repository(tmp_path_factory.mktemp("published"), files)
    _git(repo, "tag", yaml.safe_load(readme_block("pre-commit"))["repos"][0]["rev"])
    return f"file://localhost{repo.as_posix()}"  # pip's older URL parser wants a host


def as_pasted(block: str, url: str) -> str:
    """``block`` with the repository URL replaced by ``url``, and nothing else changed."""
    assert len(set(REPOSITORY_URL.findall(block))) == 1, block
    return REPOSITORY_URL.sub(url, block)


@pytest.fixture
def user_repo(tmp_path: Path) -> Path:
    files = {**USER_FILES, "notes.txt": ROOT / "README.md"}
    return _repository(tmp_path / "user", files)


def _run_step(command: str, repo: Path, env: dict[str, str] = ENV) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*GITHUB_SHELL, command], cwd=repo, env=env, capture_output=True, text=True, check=False
    )


def test_workflow_steps_run_as_pasted(user_repo: Path) -> None:
    workflow = yaml.safe_load(readme_block("workflow"))
    pip_line = readme_block("pip").strip()
    outcomes: dict[str, list[subprocess.CompletedProcess]] = {}
    for name, job in workflow["jobs"].items():
        ran = outcomes[name] = []
        for step in job["steps"]:
            if "uses" in step:
                action = step["uses"].split("@")[0]
                assert action in {"actions/checkout", "actions/setup-python"} or (
                    action == "github/codeql-action/upload-sarif"
                    and (user_repo / step["with"]["sarif_file"]).is_file()
                ), step
            elif step["run"].startswith("pip install"):
                assert step["run"] == pip_line  # what test_pip_line_installs_both_tools runs
            else:
                ran.append(_run_step(step["run"], user_repo))
    sarif_step, annotate_step = outcomes["lint"]
    assert sarif_step.returncode == 0, sarif_step.stderr
    log = json.loads((user_repo / "accel-lint.sarif").read_text())
    jsonschema.validate(log, json.loads(SARIF_SCHEMA.read_text()))
    uris = {
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        for r in log["runs"][0]["results"]
    }
    assert "planted.py" in uris  # relative to the checkout, as code scanning needs
    assert annotate_step.returncode == 1
    assert "::error file=planted.py,line=10," in annotate_step.stdout
    (review,) = outcomes["review-conversion"]
    assert review.returncode == 1, review.stderr
    annotations = review.stdout.splitlines()
    changes = [a for a in annotations if "title=accel-convert would change this::" in a]
    assert changes and all(a.startswith("::warning file=train.py,line=") for a in changes)
    assert any("%0A+" in a and "accelerator.backward(loss)" in a for a in changes)
    needs = [a for a in annotations if "title=accel-convert needs a human::" in a]
    assert [a.split(",")[1] for a in needs] == ["line=20"]  # the note's line in train.py
    assert "planted.py" not in review.stdout  # already an Accelerate script: nothing to change


@pytest.mark.slow
@pytest.mark.skipif(PRE_COMMIT is None, reason="needs pre-commit")
def test_pre_commit_snippet_runs_as_pasted(published: str, user_repo: Path, tmp_path: Path) -> None:
    """pre-commit installs the hooks from the tag, as for a user (with their dependencies)."""
    (user_repo / ".pre-commit-config.yaml").write_text(
        as_pasted(readme_block("pre-commit"), published)
    )
    env = {**ENV, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}
    result = subprocess.run(
        [str(PRE_COMMIT), "run", "--all-files"],
        cwd=user_repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    lint, convert = out.split("accel-convert --check")
    assert "planted.py:10:5: ACL201" in lint
    assert "train.py:20: ACL212 needs a human: " in convert
    assert "notes.txt" not in out


@pytest.mark.slow
def test_pip_line_installs_both_tools(published: str, tmp_path: Path) -> None:
    """The README's pip line in a fresh virtual environment, dependencies from the index."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**ENV, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    installed = _run_step(as_pasted(readme_block("pip"), published), tmp_path, env)
    assert installed.returncode == 0, installed.stderr[-2000:]
    for tool in ("accel-lint", "accel-convert"):
        version = _run_step(f"{tool} --version", tmp_path, env)
        assert version.stdout.startswith(f"{tool} "), version.stderr
