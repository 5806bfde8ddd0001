"""The install layout the design card asks for: three folders under one ``accelify`` namespace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    "transform": "accelify.transform",
    "runtime": "accelify.runtime",
    "rules": "accelify.rules",
}


def _run(code: str, cwd: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def test_every_package_folder_is_listed_in_pyproject() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    on_disk = {
        ".".join([FOLDERS[init.relative_to(ROOT).parts[0]], *init.relative_to(ROOT).parts[1:-1]])
        for folder in FOLDERS
        for init in (ROOT / folder).rglob("__init__.py")
    }
    assert on_disk == listed


def test_no_bare_top_level_modules_are_importable(tmp_path: Path) -> None:
    names = list(FOLDERS)
    code = f"import importlib.util as u; print([n for n in {names!r} if u.find_spec(n)])"
    assert _run(code, tmp_path) == "[]"


@pytest.mark.parametrize("module", ["accelify.transform.sources", "accelify.rules"])
def test_converter_and_linter_never_import_torch(module: str, tmp_path: Path) -> None:
    code = f"import sys, {module}; print('torch' in sys.modules)"
    assert _run(code, tmp_path) == "False"


@pytest.mark.slow
def test_the_tools_install_and_run_without_torch(tmp_path: Path) -> None:
    """``pip install accelify`` (no extras) is what the pre-commit hooks and CI jobs install: the
    converter and linter work, and the runtime says in one line what it is missing."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    bin_ = venv / "bin"
    subprocess.run([bin_ / "pip", "install", "-q", str(ROOT)], check=True, capture_output=True)

    def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, check=False)

    assert run(bin_ / "python", "-c", "import torch").returncode == 1
    lint = run(bin_ / "accel-lint", ROOT / "fixtures" / "lint" / "planted.py")
    assert lint.returncode == 1 and "ACL201" in lint.stdout
    convert = run(bin_ / "accel-convert", "--check", ROOT / "fixtures" / "convert" / "mnist.in.py")
    assert convert.returncode == 1 and "would be converted" in convert.stdout + convert.stderr
    needs = (
        "accelify.runtime needs torch: install the runtime extra "
        "(pip install -e '.[runtime]' in a checkout of accelify) or torch itself"
    )
    runtime = run(bin_ / "python", "-c", "from accelify.runtime import Accelerator")
    assert runtime.returncode == 1
    assert runtime.stderr.strip().splitlines()[-1] == f"ModuleNotFoundError: {needs}"
    # accel-run answers --help and writes configs without torch; a launch is one line, exit 2.
    assert run(bin_ / "accel-run", "--help").returncode == 0
    (tmp_path / "train.py").write_text("print('trained')\n")
    launch = run(bin_ / "accel-run", "--cpu", "train.py")
    assert (launch.returncode, launch.stdout, launch.stderr) == (
        2,
        "",
        f"accel-run: error: {needs}\n",
    )
