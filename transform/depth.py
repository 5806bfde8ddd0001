"""Room for code nested as deep as CPython compiles.

The tools recurse a few frames per level of nesting (libcst's code generation two per operator
of a ``a + b + ...`` chain), so Python's default limit of 1,000 frames stopped them at about 490
terms where CPython compiles 2,990. Raising the limit on the thread that hit it would overflow its
C stack; instead, work that ran out of frames runs again on a thread with a stack sized for a much
higher limit. The first try is the usual one: ordinary files pay nothing.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

# Frames per nesting level stay under ten in both tools; CPython itself compiles about three
# levels per frame of its default limit (3,000). Measured: 2,990 terms take about 6,000 frames.
DEEP_LIMIT = 30_000
# Virtual: pages are committed only as deep recursion touches them (about 20 KiB per frame at
# worst, through libcst's generators driven from C).
_STACK_BYTES = 768 * 1024 * 1024
_ONE_AT_A_TIME = threading.Lock()  # the recursion limit is the interpreter's, not the thread's
_DEEP = "accelify-deep"


def deep_enough(work: Callable[P, T]) -> Callable[P, T]:
    """``work``, run again with room for :data:`DEEP_LIMIT` frames when it runs out of
    recursion. A ``RecursionError`` from there is the caller's to report."""

    @functools.wraps(work)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return work(*args, **kwargs)
        except RecursionError:
            if threading.current_thread().name == _DEEP:  # already as deep as it goes
                raise
        return _on_deep_stack(functools.partial(work, *args, **kwargs))

    return run


def _on_deep_stack(work: Callable[[], T]) -> T:
    outcome: dict[str, T | BaseException] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as err:  # handed to the caller's thread below
            outcome["error"] = err

    with _ONE_AT_A_TIME:
        limit, stack = sys.getrecursionlimit(), threading.stack_size(_STACK_BYTES)
        try:
            sys.setrecursionlimit(max(limit, DEEP_LIMIT))
            thread = threading.Thread(target=run, name=_DEEP, daemon=True)
            thread.start()
            thread.join()
        finally:
            threading.stack_size(stack)
            sys.setrecursionlimit(limit)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[return-value]
