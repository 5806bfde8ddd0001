"""How accel-run styles what it prints: rich on a terminal, plain text in a pipe, and not one
escape under ``NO_COLOR`` (no-color.org), which wins over ``FORCE_COLOR`` as in Ruff; rich by
itself would drop only the colours and keep bold."""

from __future__ import annotations

import os

from rich.console import Console


def console(stderr: bool = False) -> Console:
    """A console that never re-wraps lines: paths and commands stay whole for copying."""
    plain = {"color_system": None} if os.environ.get("NO_COLOR") else {}
    return Console(stderr=stderr, highlight=False, soft_wrap=True, **plain)  # type: ignore[arg-type]
