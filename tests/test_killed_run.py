"""A run killed with SIGKILL takes its ``-j`` workers with it and leaves every file whole.

The pool never gets to stop its workers then; before, they waited for work forever (13 minutes
later still alive, holding the caller's pipes) and left temporary files behind. A worker told of
the end by the kernel unwinds like Ctrl-C; the run itself, killed by SIGKILL, cannot, so the one
file it was writing may leave its temporary file (never a half-written file).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# A script each tool changes: one to convert, one with findings --fix mends.
SCRIPTS = {
    "accel-convert": FIXTURES / "convert" / "sound" / "discarded_output.in.py",
    "accel-lint": FIXTURES / "lint" / "planted.py",
}


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie is dead, waiting for a parent that is gone


def _until(condition, patience: float = 60) -> bool:
    deadline = time.monotonic() + patience
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("tool", [["accel-convert", "--inplace"], ["accel-lint", "--fix"]])
def test_workers_end_with_a_killed_run_and_leave_every_file_whole(
    tool: list[str], tmp_path: Path
) -> None:
    original = SCRIPTS[tool[0]].read_text()
    whole = tmp_path / "whole.py"  # what the tool makes of one copy, run to the end
    whole.write_text(original)
    subprocess.run([str(BIN / tool[0]), *tool[1:], str(whole)], capture_output=True, check=False)
    done = whole.read_text()
    assert done != original
    whole.unlink()
    for i in range(2000):
        (tmp_path / f"train_{i}.py").write_text(original)
    run = subprocess.Popen(
        [str(BIN / tool[0]), *tool[1:], "-j", "2", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert _until(lambda: len(_children(run.pid)) >= 2), "the workers never started"
        workers = _children(run.pid)
        assert _until(lambda: sum(map(_cpu_seconds, workers)) > 0.3), "the workers never worked"
    finally:
        run.kill()
        run.wait()
    assert _until(lambda: not any(_running(pid) for pid in workers))
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    if tool[0] == "accel-lint":  # its workers write: SIGTERM unwinds them, temporary file too
        assert left == []
    else:  # the killed run writes, and SIGKILL cannot be caught: at most its file in flight
        assert len(left) <= 1, left
    assert {p.read_text() for p in tmp_path.glob("*.py")} <= {original, done}
