"""Terminal conventions shared by accel-convert and accel-lint.

Rich styling on a terminal, plain text in a pipe (rich detects it), never wrapped lines, one
place that knows the exit codes CI gates on, and how ``--jobs`` spreads files over processes.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from rich.console import Console

_In = TypeVar("_In")
_Out = TypeVar("_Out")

EXIT_OK = 0
EXIT_FOUND = 1  # --check/--diff found changes; the linter found problems
EXIT_ERROR = 2  # bad input or usage


def console(stderr: bool = False) -> Console:
    """A console that styles only on a terminal and never wraps (paths must stay greppable).

    ``NO_COLOR`` (any value, no-color.org) turns every escape off, bold and dim included;
    ``FORCE_COLOR`` styles a pipe too (rich reads it)."""
    plain = {"color_system": None} if os.environ.get("NO_COLOR") else {}
    return Console(stderr=stderr, soft_wrap=True, highlight=False, **plain)


class VersionAction(argparse.Action):
    """``--version`` that reads the package metadata only when given, not at every start-up."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, help=help or "print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_args: object) -> None:
        print(f"{parser.prog} {package_version()}")
        parser.exit(EXIT_OK)


def package_version() -> str:
    """Only ``--version`` asks, so the metadata machinery (~25 ms) is not loaded at start-up."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("accelify")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


def exit_on_signals() -> None:
    """SIGTERM (a CI cancel, ``timeout``) ends a run the way Ctrl-C does, by unwinding: a file
    being rewritten is left whole and its temporary file goes (forked workers inherit this)."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def parallel_map(work: Callable[[_In], _Out], items: Sequence[_In], jobs: int) -> Iterator[_Out]:
    """``map(work, items)`` in input order, over up to ``jobs`` processes (0: one per CPU).

    ``work`` must be picklable (a module-level function or a ``partial`` of one).
    """
    jobs = jobs or os.cpu_count() or 1
    if jobs <= 1 or len(items) < 2:
        yield from map(work, items)
        return
    from concurrent.futures import ProcessPoolExecutor  # 15 ms of start-up most runs never use

    with ProcessPoolExecutor(min(jobs, len(items))) as pool:
        yield from pool.map(work, items, chunksize=4)
