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


@dataclass(frozen=True)
class Notebook:
    text: str
    places: tuple[tuple[int, int], ...]  # per line of ``text``: (code cell number, line in it)

    def place(self, line: int) -> tuple[int, int]:
        """``(cell, line in cell)`` for a 1-based line of :attr:`text`."""
        if 1 <= line <= len(self.places):
            return self.places[line - 1]
        return self.places[-1] if self.places else (1, line)


def parse(path: str, text: str) -> Notebook:
    """Read the code cells of the notebook JSON ``text``."""
    try:
        cells = json.loads(text)["cells"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise SourceError(path, 1, f"not a Jupyter notebook ({err})") from None
    lines: list[str] = []
    places: list[tuple[int, int]] = []
    number = 0
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
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
