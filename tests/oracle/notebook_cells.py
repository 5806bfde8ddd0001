"""Notebooks made from scripts, for the notebook tests and the notebook oracle: a script cut into
cells, and the nbformat 4 JSON holding them. Light imports, so that both test folders import it
cheaply (tests/convert as ``..oracle.notebook_cells``, the oracle by its name)."""

from __future__ import annotations

import itertools
import json

from accelify.transform.sources import python_ast


def statement_cells(script: str) -> list[str]:
    """``script`` cut into one cell per top-level statement (decorators with their function);
    joined again, the cells are the script."""
    lines = script.splitlines(keepends=True)
    starts = [
        min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
        for node in python_ast(script).body  # the oracle cuts scripts from two threads
    ]
    bounds = [1, *starts[1:], len(lines) + 1]
    return ["".join(lines[a - 1 : b - 1]) for a, b in itertools.pairwise(bounds)]


def book(*sources: str) -> str:
    """An nbformat 4 notebook of one code cell per source, never run (no outputs)."""
    cells = [
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": s}
        for s in sources
    ]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
