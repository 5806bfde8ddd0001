"""A transient progress line for long runs over many files, as Ruff's and cargo's: drawn only on
a person's terminal, on the console the tool already reports through, and gone when the run ends.

Both CLIs wrap the per-file results they loop over::

    with progress(results, len(files), errors, show=not quiet, doing="Linting") as results:
        for result in results:
            errors.print(...)  # lands above the line, which stays at the bottom
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO, TypeVar

from accelify.transform.console import PlainConsole

if TYPE_CHECKING:
    from rich.console import Console

_Result = TypeVar("_Result")

MANY_FILES = 20  # fewer are done before a line about them could be read
SHOW_AFTER_S = 0.5  # a run done sooner draws nothing, rather than flashing a line


@contextmanager
def progress(
    results: Iterable[_Result],
    total: int,
    out: Console | PlainConsole,
    *,
    show: bool = True,
    doing: str = "Checking",
) -> Iterator[Iterator[_Result]]:
    """``results`` (one per file, ``total`` files) as they come, counted on a transient line at
    the bottom of ``out`` once the run has lasted ``SHOW_AFTER_S``.

    Drawn only when ``show`` (the caller's say: not under ``-q``, not for a machine-read format,
    not while another console writes to the terminal, as a diff on stdout would be drawn over),
    ``total`` is over ``MANY_FILES`` and ``out`` is a person's terminal; else ``results`` go
    through untouched. Meanwhile print through ``out``: rich prints above the line. Leaving the
    block, even by an error or Ctrl-C, erases it.
    """
    if not (show and total > MANY_FILES and _watched(out)):
        yield iter(results)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    line = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("files"),
        TimeElapsedColumn(),
        console=out,
        transient=True,
        # A stray print() to the same terminal goes above the line; a pipe is left alone.
        redirect_stdout=_isatty(sys.stdout),
    )
    task = line.add_task(doing, total=total)
    started = time.monotonic()

    def counted() -> Iterator[_Result]:
        for result in results:
            line.advance(task)
            if not line.live.is_started and time.monotonic() - started >= SHOW_AFTER_S:
                line.start()
            yield result

    try:
        yield counted()
    finally:
        line.stop()


def _watched(out: Console | PlainConsole) -> bool:
    """A person's terminal: one rich would animate, and a real one (``FORCE_COLOR`` also styles
    CI logs and pipes, where every redraw of the line would stay behind as a line of its own)."""
    if isinstance(out, PlainConsole):
        return False
    return out.is_interactive and _isatty(out.file)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except ValueError:  # a closed stream
        return False
