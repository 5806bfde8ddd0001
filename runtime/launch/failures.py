"""Which worker failed first, and the report that shows its traceback before anything else.

When one rank dies the others fail too, a moment later ("connection closed by peer"), or are
stopped by the agent with SIGTERM; torch's own summary orders them by whole seconds and, for
function workers, names only one of them. Here every rank's error file is read and the ranks are
put back in causal order by :func:`_root_cause_key`.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelify.runtime.launch.bootstrap import STACK_FILE, is_library_file

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # how the agent (or Ctrl-C) stops the workers
_FRAME = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in ', re.MULTILINE)
# gloo's and NCCL's words for a collective that waited past the process group's timeout.
_TIMEOUT = re.compile(r"Timed out|timed out|Watchdog caught collective operation timeout")


@dataclass(frozen=True)
class Failure:
    """One failed rank: how it ended (None: not reported by the agent) and what it recorded."""

    rank: int
    exitcode: int | None = None
    pid: int | None = None
    error: Mapping[str, Any] = field(default_factory=dict)  # the error file's "message" object
    stack: str = ""  # where it was when the agent stopped it (faulthandler's dump), if it was


@dataclass(frozen=True)
class FailureReport:
    """What to print when workers failed, root cause first, and the exit code to leave with."""

    text: str
    exit_code: int


def collect(err: ChildFailedError, log_dir: str) -> list[Failure]:
    """The agent's failures plus the error files of ranks it did not report (same machine)."""
    offset = next(rank - f.local_rank for rank, f in err.failures.items())
    stacks = {offset + r: text for r, text in _rank_files(Path(log_dir), STACK_FILE).items()}
    found = {
        rank: Failure(rank, f.exitcode, f.pid, _message(f.error_file_data), stacks.get(rank, ""))
        for rank, f in err.failures.items()
    }
    for local_rank, text in _rank_files(Path(log_dir), "error.json").items():
        rank = offset + local_rank
        data = _message(json.loads(text))
        found.setdefault(rank, Failure(rank, error=data, stack=stacks.get(rank, "")))
    return list(found.values())


def _rank_files(log_dir: Path, name: str) -> dict[int, str]:
    """Last attempt's ``<log_dir>/<run>/attempt_<n>/<local_rank>/<name>``, by local rank."""
    attempts = sorted(log_dir.glob("*/attempt_*"), key=lambda p: int(p.name.split("_")[-1]))
    if not attempts:
        return {}
    files = (p for p in attempts[-1].glob(f"*/{name}") if re.fullmatch(r"\d+", p.parent.name))
    return {int(p.parent.name): p.read_text(encoding="utf-8") for p in files}


def _message(error_file_data: Mapping[str, Any]) -> Mapping[str, Any]:
    message = error_file_data.get("message")
    return message if isinstance(message, dict) else {}


def describe(failures: list[Failure], prog: str) -> FailureReport:
    """Root cause first, with its traceback; then one line for each rank it took down."""
    first, *others = sorted(failures, key=_root_cause_key)
    lines = [f"{prog}: rank {first.rank} failed first ({_how(first)}):"]
    lines.append(str(_extra(first).get("py_callstack", "")).rstrip() or f"  {_summary(first)}")
    # After a timeout the question is where each rank waited: show every stopped rank's stack.
    timed_out = bool(_TIMEOUT.search(str(first.error.get("message", ""))))
    for failure in sorted(others, key=lambda f: f.rank):
        lines.append(
            f"{prog}: rank {failure.rank} also failed ({_how(failure)}): {_summary(failure)}"
        )
        if timed_out and failure.stack.strip():
            lines.append(failure.stack.rstrip())
    return FailureReport("\n".join(lines), _exit_code(first))


def _exit_code(failure: Failure) -> int:
    """Its own code; 1 when it raised (even if stopped while exiting); 128+N for signal N."""
    if failure.exitcode and failure.exitcode > 0:
        return failure.exitcode
    if failure.error or not failure.exitcode:
        return 1
    return 128 - failure.exitcode


def _root_cause_key(failure: Failure) -> tuple[int, float, int]:
    """Killed from outside (OOM, segfault) < raised, earliest first < exited < stopped."""
    extra = _extra(failure)
    exitcode = failure.exitcode or 0
    if extra:
        tier = 1
    elif exitcode < 0:
        tier = 3 if -exitcode in _STOP_SIGNALS else 0
    else:
        tier = 2 if exitcode > 0 else 3
    return (tier, float(extra.get("accelify_time", extra.get("timestamp", 0))), failure.rank)


def _extra(failure: Failure) -> Mapping[str, Any]:
    extra = failure.error.get("extraInfo")
    return extra if isinstance(extra, dict) else {}


def _summary(failure: Failure) -> str:
    if failure.error.get("message"):
        return str(failure.error["message"]).splitlines()[0]
    exitcode = failure.exitcode or 0
    if exitcode >= 0:
        return "no traceback: the process exited without raising (os._exit?)"
    if -exitcode in _STOP_SIGNALS:
        where = _user_line(failure.stack)
        at = f", while at {where}" if where else ""
        return f"no traceback: stopped (by the launcher once a rank failed, or from outside){at}"
    if -exitcode == signal.SIGKILL:
        return "no traceback: killed from outside (out of memory?)"
    # SIGABRT, SIGSEGV, ...: a C++ abort ("terminate called ...") or a crash, printed just before.
    return "no traceback: crashed in native code (its last output, above, says how)"


def _user_line(stack: str) -> str:
    """``file:line`` of the innermost user frame in a faulthandler dump (most recent first)."""
    for match in _FRAME.finditer(stack):
        if not is_library_file(match["file"]):
            return f"{Path(match['file']).name}:{match['line']}"
    return ""


def _how(failure: Failure) -> str:
    if failure.exitcode is None:
        return "raised" if failure.error else "stopped with the others"
    if failure.exitcode < 0:
        return f"killed by {_signal_name(-failure.exitcode)}, pid {failure.pid}"
    return f"exit code {failure.exitcode}, pid {failure.pid}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
