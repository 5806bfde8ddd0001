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
import gc
import io
import json
import os
import runpy
import sys
import time
import traceback
from types import TracebackType

ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
# Launcher frames above the user's code, dropped from tracebacks (notebook.py wraps functions).
_OWN_FRAMES = frozenset(
    {__file__, os.path.join(os.path.dirname(__file__), "notebook.py"), runpy.__file__}
    | {"<frozen runpy>"}
)


def main(argv: list[str]) -> None:
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
        _status.append(err.code if isinstance(err.code, int) else int(err.code is not None))
        raise
    except BaseException as err:
        if not record_error(err):
            raise
        _status.append(1)
        sys.exit(1)
    _status.append(0)


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
    while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FRAMES and tb.tb_next:
        tb = tb.tb_next
    return tb


def record_error(err: BaseException) -> bool:
    """Write ``err`` where the agent looks for it; False when there is no such place.

    Written like ``torch.distributed.elastic``'s ``@record`` (so the agent reads it) plus the
    time to the microsecond, which is what orders the failures of ranks in the report.
    """
    path = os.environ.get(ERROR_FILE)
    if not path:
        return False
    err.__traceback__ = _user_frames(err.__traceback__)
    now = time.time()
    data = {
        "message": {
            "message": f"{type(err).__name__}: {err}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(err)),
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
