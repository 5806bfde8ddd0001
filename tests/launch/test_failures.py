"""Which rank the report blames: the one that died first, not the ranks it took down."""

from __future__ import annotations

import signal

from accelify.runtime.launch.failures import Failure, describe


def _raised(rank: int, at: float, message: str, exitcode: int | None = 1) -> Failure:
    error = {
        "message": message,
        "extraInfo": {"py_callstack": f"Traceback ...\n{message}\n", "accelify_time": at},
    }
    return Failure(rank, exitcode, 100 + rank, error)


PEER_GONE = "RuntimeError: Connection closed by peer"


def test_the_earliest_exception_is_the_root_cause_even_within_one_second() -> None:
    report = describe(
        [_raised(0, 10.25, PEER_GONE, -signal.SIGTERM), _raised(1, 10.2, "ValueError: bad")],
        "accel-run",
    )
    lines = report.text.splitlines()
    assert lines[0] == "accel-run: rank 1 failed first (exit code 1, pid 101):"
    assert lines[1:3] == ["Traceback ...", "ValueError: bad"]
    assert lines[3] == f"accel-run: rank 0 also failed (killed by SIGTERM, pid 100): {PEER_GONE}"
    assert report.exit_code == 1


def test_a_rank_that_raised_and_was_stopped_while_exiting_still_exits_1() -> None:
    report = describe(
        [_raised(1, 3.0, "ValueError: bad", -signal.SIGTERM), _raised(0, 3.1, PEER_GONE, -6)],
        "accel-run",
    )
    assert report.text.startswith("accel-run: rank 1 failed first (killed by SIGTERM, pid 101):")
    assert report.exit_code == 1


def test_a_rank_killed_from_outside_comes_before_the_peers_it_broke() -> None:
    report = describe(
        [_raised(0, 5.0, PEER_GONE), Failure(1, -signal.SIGKILL, 7), Failure(2, -signal.SIGTERM)],
        "accel-run",
    )
    lines = report.text.splitlines()
    assert lines[0] == "accel-run: rank 1 failed first (killed by SIGKILL, pid 7):"
    assert "no traceback: killed from outside" in lines[1]
    others = [line.split(" also")[0] for line in lines[2:]]
    assert others == ["accel-run: rank 0", "accel-run: rank 2"]
    assert report.exit_code == 128 + signal.SIGKILL


def test_an_exit_code_without_traceback_is_passed_on() -> None:
    report = describe([Failure(0, 3, 9), Failure(1, -signal.SIGTERM, 10)], "notebook_launcher")
    assert report.text.startswith("notebook_launcher: rank 0 failed first (exit code 3, pid 9):")
    assert report.exit_code == 3


def test_each_signal_says_what_it_usually_means() -> None:
    report = describe(
        [Failure(1, -signal.SIGABRT, 7), Failure(0, -signal.SIGTERM, 6), Failure(2, -9, 8)],
        "accel-run",
    )
    lines = report.text.splitlines()
    assert lines[:2] == [
        "accel-run: rank 1 failed first (killed by SIGABRT, pid 7):",
        "  no traceback: crashed in native code (its last output, above, says how)",
    ]
    assert lines[2].endswith(
        "(killed by SIGTERM, pid 6): no traceback: stopped (by the launcher "
        "once a rank failed, or from outside)"
    )
    assert lines[3].endswith(
        "(killed by SIGKILL, pid 8): no traceback: killed from outside (out of memory?)"
    )
    assert report.exit_code == 128 + signal.SIGABRT
