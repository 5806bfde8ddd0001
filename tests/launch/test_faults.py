"""Faults end the job fast and leave nothing behind: a killed launcher, Ctrl-C, a hang, a raise.

Each asserts what happened (who was stopped, what the report says, which processes are left), not
how long it took: the timeouts below only turn a hang into a failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from accelify.runtime.launch.bootstrap import LAUNCHER_PID

pytestmark = pytest.mark.slow

# Each rank says it is ready (in one write: two processes' prints interleave word by word), then
# rank 1 sleeps while rank 0 waits for it in an all-reduce.
HANG = """\
import os, sys, time, torch
from accelify.runtime import Accelerator

accelerator = Accelerator(cpu=True)
sys.stdout.write(f"ready {os.getpid()}\\n")
sys.stdout.flush()
if accelerator.process_index == 1:
    time.sleep(120)  # the hang
accelerator.reduce(torch.ones(1))
"""


def _start(accel_run_argv: list[str], tmp_path: Path, *flags: str) -> tuple[subprocess.Popen, list]:
    """Start accel-run on the hanging script in its own session; return it and its worker pids."""
    script = tmp_path / "hang.py"
    script.write_text(HANG, encoding="utf-8")
    launcher = subprocess.Popen(
        [*accel_run_argv, "--cpu", "--num-processes", "2", *flags, str(script)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    workers = []
    while len(workers) < 2:
        line = launcher.stdout.readline()  # type: ignore[union-attr]
        assert line, launcher.communicate(timeout=60)[1]
        if line.startswith("ready "):
            workers.append(int(line.split()[1]))
    return launcher, workers


def _gone(pid: int, patience: float = 60) -> bool:
    """Whether ``pid`` has ended: no such process, or a zombie (dead; not our child to reap)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            return True
        if fields[0] in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_with_a_launcher_killed_by_sigkill(accel_run_argv, tmp_path: Path) -> None:
    launcher, workers = _start(accel_run_argv, tmp_path)
    launcher.kill()  # SIGKILL: the agent never gets to stop them
    launcher.communicate(timeout=60)
    try:
        assert all(_gone(pid) for pid in workers)
    finally:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_ctrl_c_stops_every_worker_and_says_so_once(accel_run_argv, tmp_path: Path) -> None:
    launcher, workers = _start(accel_run_argv, tmp_path)
    os.killpg(launcher.pid, signal.SIGINT)  # what a terminal sends its foreground group
    _, stderr = launcher.communicate(timeout=60)

    assert launcher.returncode == 130
    assert stderr.strip().splitlines()[-1] == "accel-run: stopped by SIGINT"
    assert "Traceback" not in stderr
    assert all(_gone(pid) for pid in workers)


def test_a_hang_ends_at_the_timeout_with_where_each_rank_was(accel_run_argv, tmp_path) -> None:
    launcher, _ = _start(accel_run_argv, tmp_path, "--timeout", "3")
    _, stderr = launcher.communicate(timeout=120)

    assert launcher.returncode == 1
    report = stderr[stderr.index("accel-run: rank") :].splitlines()
    assert report[0].startswith("accel-run: rank 0 failed first (exit code 1")
    assert "Timed out waiting 3000ms" in stderr  # gloo's words, in rank 0's traceback
    stopped = next(line for line in report if line.startswith("accel-run: rank 1 also failed"))
    sleeping = HANG.splitlines().index("    time.sleep(120)  # the hang") + 1
    assert stopped.endswith(f"while at hang.py:{sleeping}")
    # After a timeout the stopped rank's whole stack follows, its sleeping line included.
    stack = report[report.index(stopped) + 1 :]
    frame = f'  File "{tmp_path / "hang.py"}", line {sleeping}'
    assert any(line.startswith(frame) for line in stack)


def test_the_launcher_tells_its_workers_who_to_die_with(accel_run_argv, tmp_path) -> None:
    """The contract the two tests above rely on: the parent of each worker is that launcher."""
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            f"""\
            import os
            assert os.environ[{LAUNCHER_PID!r}] == str(os.getppid()), os.environ[{LAUNCHER_PID!r}]
            """
        ),
        encoding="utf-8",
    )
    done = subprocess.run(
        [*accel_run_argv, "--cpu", "--num-processes", "2", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_a_rank_that_raises_is_not_waited_for_at_exit(accel_run, tmp_path: Path) -> None:
    """Its exit handler used to wait for the other rank (still in its all-reduce) before leaving,
    and the launcher learns of a failure only when the rank leaves. The script makes that wait
    600 s, so a rank that waited would outlast the test's timeout by far."""
    script = tmp_path / "raises.py"
    script.write_text(
        textwrap.dedent(
            """\
            import torch
            from accelify.runtime import Accelerator, state

            state.EXIT_WAIT_S = 600
            accelerator = Accelerator(cpu=True)
            if accelerator.process_index == 1:
                raise ValueError("planted")
            accelerator.reduce(torch.ones(1))
            """
        ),
        encoding="utf-8",
    )
    done = accel_run("--cpu", "--num-processes", "2", str(script), timeout=120)
    assert done.returncode == 1
    assert "accel-run: rank 1 failed first" in done.stderr
    assert "ValueError: planted" in done.stderr


if sys.platform != "linux":  # PR_SET_PDEATHSIG is Linux's
    test_workers_die_with_a_launcher_killed_by_sigkill = pytest.mark.skip(reason="Linux only")(
        test_workers_die_with_a_launcher_killed_by_sigkill
    )
