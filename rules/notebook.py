"""Jupyter notebooks as one Python text, cell after cell, with a map back to cell and line.

Code cells are joined in order, so a rule sees what an earlier cell did (CUDA touched in cell 2,
``notebook_launcher`` in cell 5). IPython syntax is not Python: ``%magic``/``!shell`` lines become
``pass`` at the same indentation and ``%%cell`` magics blank out their cell, keeping every other
line where it was.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from accelify.transform.sources import SourceError

_MAGIC = re.compile(r"^(\s*)([%!?]|\w[\w.,\s]*=\s*[%!])")


_CELL_TYPES = frozenset({"code", "markdown", "raw"})


@dataclass(frozen=True)
class Notebook:
    text: str
    places: tuple[tuple[int, int], ...]  # per line of ``text``: (code cell number, line in it)

    def place(self, line: int) -> tuple[int, int]:
        """``(cell, line in cell)`` for a 1-based line of :attr:`text`."""
        if 1 <= line <= len(self.places):
            return self.places[line - 1]
        return self.places[-1] if self.places else (1, line)


def _cells(path: str, text: str) -> list[dict]:
    """The cells of a notebook in nbformat 4's shape, or a one-line error saying what is off."""
    try:
        book = json.loads(text)
    except json.JSONDecodeError as err:
        raise SourceError(path, err.lineno, f"not a Jupyter notebook: {err.msg}") from None
    cells = book.get("cells") if isinstance(book, dict) else None
    if not isinstance(cells, list):
        raise SourceError(path, 1, 'not a Jupyter notebook: no "cells" list')
    for index, cell in enumerate(cells, start=1):
        source = cell.get("source") if isinstance(cell, dict) else None
        text = isinstance(source, str) or (
            isinstance(source, list) and all(isinstance(line, str) for line in source)
        )
        if not text or cell.get("cell_type") not in _CELL_TYPES:
            raise SourceError(
                path,
                1,
                f"not a Jupyter notebook: cell {index} of {len(cells)} needs a "
                "cell_type (code, markdown, raw) and a source (a string or a list of strings)",
            )
    return cells


def parse(path: str, text: str) -> Notebook:
    """Read the code cells of the notebook JSON ``text``."""
    cells = _cells(path, text)
    lines: list[str] = []
    places: list[tuple[int, int]] = []
    number = 0
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        number += 1
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        cell_lines = source.splitlines()
        skip_cell = bool(cell_lines) and cell_lines[0].lstrip().startswith("%%")
        for index, line in enumerate(cell_lines, start=1):
            match = _MAGIC.match(line)
            lines.append("" if skip_cell else f"{match.group(1)}pass" if match else line)
            places.append((number, index))
    return Notebook("".join(f"{line}\n" for line in lines), tuple(places))
