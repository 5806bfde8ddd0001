"""Jupyter notebooks as one Python text, cell after cell, with a map back to cell and line.

Code cells are joined in order, so a rule sees what an earlier cell did (CUDA touched in cell 2,
``notebook_launcher`` in cell 5). IPython syntax is not Python: ``%magic``/``!shell`` lines become
``pass`` at the same indentation and ``%%cell`` magics blank out their cell, keeping every other
line where it was. Reading the file is :mod:`accelify.transform.ipynb`'s, shared with accel-convert.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelify.transform import ipynb


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
    lines: list[str] = []
    places: list[tuple[int, int]] = []
    for number, cell in enumerate(ipynb.code_cells(ipynb.load(path, text)), start=1):
        source = ipynb.source_of(cell)
        cell_lines = source.splitlines()
        skip_cell = ipynb.is_cell_magic(source)
        indents = list(ipynb.magic_indents(cell_lines))
        for index, (line, indent) in enumerate(zip(cell_lines, indents, strict=True), start=1):
            lines.append("" if skip_cell else f"{indent}pass" if indent is not None else line)
            places.append((number, index))
    return Notebook("".join(f"{line}\n" for line in lines), tuple(places))
