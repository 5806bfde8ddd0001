"""Terminal conventions shared by accel-convert and accel-lint.

Rich styling on a terminal, plain text in a pipe (rich detects it), never wrapped lines, and one
place that knows the exit codes CI gates on.
"""

from __future__ import annotations

from rich.console import Console

EXIT_OK = 0
EXIT_FOUND = 1  # --check/--diff found changes; the linter found problems
EXIT_ERROR = 2  # bad input or usage


def console(stderr: bool = False) -> Console:
    """A console that styles only on a terminal and never wraps (paths must stay greppable)."""
    return Console(stderr=stderr, soft_wrap=True, highlight=False)


def package_version() -> str:
    """Only ``--version`` asks, so the metadata machinery (~25 ms) is not loaded at start-up."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("accelify")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"
