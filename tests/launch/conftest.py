"""Shared fixtures: a private HF_HOME (no user config leaks in) and a way to run accel-run."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

RUN_MAIN = "from accelify.runtime.launch.cli import main; main()"


@pytest.fixture(autouse=True)
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    return home


@pytest.fixture
def accel_run_argv() -> list[str]:
    """The command line of ``accel-run`` without arguments (this interpreter, no PATH lookup)."""
    return [sys.executable, "-c", RUN_MAIN]


@pytest.fixture
def accel_run(
    tmp_path: Path, accel_run_argv: list[str]
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the real ``accel-run`` in a subprocess; a hang fails the test after ``timeout``."""

    def run(*args: str, cwd: Path = tmp_path, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*accel_run_argv, *args],
            cwd=cwd,
            env=os.environ.copy(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return run
