"""The first code each accel-run worker runs: ``python bootstrap.py [-m] target args...``.

It runs the user's script (or module) as ``__main__`` and, when it raises, writes the traceback to
the error file torch's elastic agent gives each worker (``TORCHELASTIC_ERROR_FILE``, the format of
``torch.distributed.elastic``'s ``@record``) instead of printing it, so the launcher can show the
failing rank's traceback first rather than after every other rank's "peer closed" noise. It is run
by path and imports only the standard library: the user's script decides when torch is imported.
Being run by path, its folder is ``sys.path[0]`` while it starts, so no module in this folder may
be named like a standard-library one.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import faulthandler
import gc
import io
import json
import os
import runpy
import signal
import sys
import sysconfig
import time
import traceback
from types import TracebackType

ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
STACK_FILE = "stack.txt"
LAUNCHER_PID = "ACCELIFY_LAUNCHER_PID"  # the process that starts the workers; they die with it
TIMEOUT_ENV = "ACCELIFY_TIMEOUT"  # accel-run --timeout: the runtime's process-group timeout
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Launcher frames above the user's code, dropped from tracebacks (notebook.py wraps functions).
OWN_FRAMES = frozenset(
    {__file__, os.path.join(os.path.dirname(__file__), "notebook.py"), runpy.__file__}
    | {"<frozen runpy>"}
)
_LIBRARIES = tuple(
    {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}  # accelify.runtime
    | {sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
)


def main(argv: list[str]) -> None:
    die_with_the_launcher()
    _dump_stack_when_stopped()
    atexit.register(_leave_after_exit_handlers)  # registered first, so it runs last
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except KeyboardInterrupt:
        _status.append(130)
        sys.exit(130)  # Ctrl-C reached every worker; the launcher says so once
    except SystemExit as err:
        if err.code not in (0, None):
            record_error(err)  # the time tells a rank that gave up from the ranks it took down
            _failed(err)
        _status.append(err.code if isinstance(err.code, int) else int(err.code is not None))
        raise
    except BaseException as err:
        if not record_error(err):
            raise
        _failed(err)
        _status.append(1)
        sys.exit(1)
    _status.append(0)


def _failed(err: BaseException) -> None:
    """Say the script failed where the interpreter says it of an uncaught exception, so exit
    handlers (the runtime's wait for the other ranks) know not to wait for processes the
    launcher is about to stop."""
    sys.last_type, sys.last_value, sys.last_traceback = type(err), err, err.__traceback__


def die_with_the_launcher() -> None:
    """Be killed when the launcher dies, even by SIGKILL (the agent then never stops us).

    Without this a killed ``accel-run`` leaves its workers running, holding their GPUs. Linux's
    ``PR_SET_PDEATHSIG`` fires when the thread that started us ends; the agent starts workers
    from its main thread. A launcher already gone before the call is caught by the parent check.
    """
    launcher = os.environ.get(LAUNCHER_PID)
    if not launcher or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(launcher):
        os._exit(128 + signal.SIGKILL)


def _dump_stack_when_stopped() -> None:
    """When the agent stops this worker (another rank failed, or a timeout), write where it was
    to ``stack.txt`` beside the error file, for the launcher's report; then die of the signal."""
    path = os.environ.get(ERROR_FILE)
    if path:
        stack = open(os.path.join(os.path.dirname(path), STACK_FILE), "w")  # noqa: SIM115
        _kept_open.append(stack)  # faulthandler writes to its descriptor until the process ends
        faulthandler.register(signal.SIGTERM, file=stack, chain=True)


_kept_open: list[io.TextIOBase] = []


def is_library_file(filename: str) -> bool:
    """Whether a frame's file is torch's, the standard library's or accelify's, not the user's."""
    return filename.startswith(_LIBRARIES) or filename in OWN_FRAMES


# The exit status the script ended with; empty when it raised past main() unrecorded.
_status: list[int] = []


def _leave_after_exit_handlers() -> None:
    """Once every exit handler has run, a worker that used torch.distributed leaves without
    the interpreter's teardown, with the status its script chose.

    In that teardown a gloo worker thread that lets go of a tensor takes the GIL from a
    finalizing interpreter, and the process dies of SIGABRT ("terminate called without an active
    exception", pytorch/pytorch#190489) after a clean run: one 2-process CPU FSDP job in twenty
    in one CI run. What the teardown would still do for the script is flush the files it left
    open, so that is done first.
    """
    if not _status or "torch.distributed" not in sys.modules:
        return
    for obj in gc.get_objects():
        if issubclass(type(obj), io.IOBase):  # not isinstance: no object's __class__ is run
            with contextlib.suppress(Exception):  # the teardown would ignore it the same way
                if not obj.closed and obj.writable():
                    obj.flush()
    os._exit(_status[0])


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """Drop this file's and runpy's frames from the top: the user never wrote them."""
    while tb is not None and tb.tb_frame.f_code.co_filename in OWN_FRAMES and tb.tb_next:
        tb = tb.tb_next
    return tb


def record_error(err: BaseException) -> bool:
    """Write ``err`` where the agent looks for it; False when there is no such place."""
    err.__traceback__ = _user_frames(err.__traceback__)
    return write_error(f"{type(err).__name__}: {err}", "".join(traceback.format_exception(err)))


def write_error(message: str, callstack: str) -> bool:
    """Write a failure where the agent looks for it; False when there is no such place.

    Written like ``torch.distributed.elastic``'s ``@record`` (so the agent reads it) plus the
    time to the microsecond, which is what orders the failures of ranks in the report.
    """
    path = os.environ.get(ERROR_FILE)
    if not path:
        return False
    now = time.time()
    data = {
        "message": {
            "message": message,
            "extraInfo": {
                "py_callstack": callstack,
                "timestamp": str(int(now)),
                # Seconds are too coarse to tell the root cause from the ranks it took down.
                "accelify_time": now,
            },
        }
    }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    return True


if __name__ == "__main__":
    main(sys.argv[1:])
