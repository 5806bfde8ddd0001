"""Jupyter notebook files as JSON, shared by accel-convert and accel-lint: reading the cells,
telling IPython syntax from Python, naming a place as ``path:cell N:line``, and writing the JSON
back in the layout it came in.

Cells are numbered among code cells (1-based), as both tools report them. A notebook whose
kernel is not Python is :class:`~accelify.transform.sources.Skipped`, as Ruff and VS Code skip
one; JSON that Python's json module cannot hold (nested too deeply, an integer of more digits
than ``int()`` converts) is a one-line error, never a traceback.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from accelify.transform.sources import Skipped, SourceError

# A line IPython runs but Python cannot parse: ``%magic``, ``!shell``, ``?help``, ``x = %magic``.
_MAGIC = re.compile(r"^(\s*)([%!?]|\w[\w.,\s]*=\s*[%!])")
# IPython's automagic: a line magic called without its ``%`` (``pip install -r requirements.txt``,
# ``cd data``), which IPython runs when the line is no Python.
_AUTOMAGIC = re.compile(
    r"^(\s*)(?:pip|conda|mamba|cd|ls|pwd|env|set_env|load_ext|reload_ext|matplotlib|pylab|time|"
    r"timeit|prun|run|mkdir|rm|rmdir|cp|mv|cat|who|whos|history|alias|autoreload|pushd|popd)"
    r"\s+\S"
)
_CELL_TYPES = frozenset({"code", "markdown", "raw"})
_INDENT = re.compile(r"\{\r?\n([ \t]+)")
_LINE = re.compile(r"[^\n]*\n|[^\n]+")  # split after "\n" only, as Jupyter stores lines
_PYTHON = re.compile(r"i?python\d*", re.IGNORECASE)
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')  # a string, or a bracket

Cell = dict[str, Any]


def located(path: str, cell: int, line: int, message: str) -> SourceError:
    """The one-line error at ``line`` of code cell ``cell``: ``path:cell N:line: message``."""
    return SourceError(f"{path}:cell {cell}", line, message)


def load(path: str, text: str) -> dict[str, Any]:
    """The notebook JSON ``text`` in nbformat 4's shape, or a one-line error saying what is off."""
    book = _parsed(path, text)
    language = _language(book)
    if language is not None and not _PYTHON.fullmatch(language):
        raise Skipped(path, 0, f"skipped: not a Python notebook (its language is {language!r})")
    cells = book.get("cells") if isinstance(book, dict) else None
    if not isinstance(cells, list):
        raise SourceError(path, 1, 'not a Jupyter notebook: no "cells" list')
    for index, cell in enumerate(cells, start=1):
        source = cell.get("source") if isinstance(cell, dict) else None
        text_ok = isinstance(source, str) or (
            isinstance(source, list) and all(isinstance(line, str) for line in source)
        )
        if not text_ok or cell.get("cell_type") not in _CELL_TYPES:
            raise SourceError(
                path,
                1,
                f"not a Jupyter notebook: cell {index} of {len(cells)} needs a "
                "cell_type (code, markdown, raw) and a source (a string or a list of strings)",
            )
    return book


def _parsed(path: str, text: str) -> Any:
    """``json.loads(text)``, its failures as one line each."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise SourceError(path, err.lineno, f"not a Jupyter notebook: {err.msg}") from None
    except RecursionError:
        raise too_deep(path, text) from None
    except ValueError as err:  # Python 3.11+ (3.10.7+): int() refuses over 4300 digits
        raise _long_number(path, text, err) from None


def too_deep(path: str, text: str) -> SourceError:
    """The error for notebook JSON nested deeper than Python's json module goes (nbformat, and
    so Jupyter, cannot read it either), at the line where it is deepest."""
    depth = deepest = at = 0
    for token in _JSON_TOKEN.finditer(text):
        if token.group() in "[{":
            depth += 1
            if depth > deepest:
                deepest, at = depth, token.start()
        elif token.group() in "]}":
            depth -= 1
    message = f"not read: JSON nested {deepest} deep, more than Python's json module reads"
    return SourceError(path, text.count("\n", 0, at) + 1, message)


def _long_number(path: str, text: str, err: ValueError) -> SourceError:
    """The error for an integer of more digits than Python converts to ``int``."""
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    found = re.search(rf"\d{{{limit + 1},}}", text) if limit else None
    if found is None:
        return SourceError(path, 1, f"not a Jupyter notebook: {err}")
    message = (
        f"not read: a number of {len(found.group())} digits, more than Python reads ({limit}; "
        "PYTHONINTMAXSTRDIGITS=0 lifts the limit)"
    )
    return SourceError(path, text.count("\n", 0, found.start()) + 1, message)


def _language(book: object) -> str | None:
    """The notebook's language as Jupyter records it: the running kernel's ``language_info``,
    else the ``kernelspec`` (the order Ruff and VS Code read them in); None when neither says."""
    metadata = book.get("metadata") if isinstance(book, dict) else None
    for section, key in (("language_info", "name"), ("kernelspec", "language")):
        entry = metadata.get(section) if isinstance(metadata, dict) else None
        value = entry.get(key) if isinstance(entry, dict) else None
        if isinstance(value, str):
            return value
    return None


def code_cells(book: dict[str, Any]) -> list[Cell]:
    """The code cells, in order: cell N of a report is ``code_cells(book)[N - 1]``."""
    return [cell for cell in book["cells"] if cell["cell_type"] == "code"]


def source_of(cell: Cell) -> str:
    """A cell's source as one string, whichever form the file stores it in."""
    source = cell["source"]
    return "".join(source) if isinstance(source, list) else source


def with_source(cell: Cell, text: str) -> Cell:
    """``cell`` holding ``text``, stored in the form its source came in (one string or lines)."""
    if isinstance(cell["source"], str):
        return {**cell, "source": text}
    return {**cell, "source": _LINE.findall(text)}


def is_cell_magic(source: str) -> bool:
    """A ``%%magic`` cell: the whole cell is another language (shell, HTML, timing harness)."""
    return source.split("\n", 1)[0].lstrip().startswith("%%")


def magic_indent(line: str) -> str | None:
    """The indentation of an IPython line (``%``/``!``/``?``, or a magic called without its
    ``%`` where the line is no Python), or None for a Python line."""
    match = _MAGIC.match(line) or _AUTOMAGIC.match(line)
    if match is None or (match.re is _AUTOMAGIC and _parses(line.strip())):
        return None
    return match.group(1)


def _parses(text: str) -> bool:
    try:
        compile(text, "<cell line>", "exec", dont_inherit=True)
    except SyntaxError:
        return False
    return True


def magic_indents(lines: Iterable[str]) -> Iterator[str | None]:
    """Per line, the indentation of the IPython command it is part of, or None for Python: a
    command ending in a backslash (``!pip install -q \\``) goes on over the lines after it.

    As in IPython, only a line that starts a logical line can be a command: inside brackets or a
    triple-quoted string, ``% (epoch, loss)`` is Python's formatting operator."""
    command: str | None = None
    python = _LogicalLines()
    for line in lines:
        if command is not None:
            indent: str | None = command
        else:
            indent = None if python.open else magic_indent(line)
        yield indent
        if indent is None:
            python.read(line)
        continued = indent is not None and line.rstrip("\r\n").endswith("\\")
        command = indent if continued else None


class _LogicalLines:
    """Just enough of Python's tokenizer to know whether the next physical line continues a
    logical line: open brackets, an open triple-quoted string, a trailing backslash."""

    def __init__(self) -> None:
        self.depth = 0
        self.quote = ""  # the open string's quote, '' outside strings
        self.open = False

    def read(self, line: str) -> None:
        text = line.rstrip("\r\n")
        i = 0
        comment = False
        while i < len(text):
            if self.quote:
                if text.startswith(self.quote, i):
                    i, self.quote = i + len(self.quote), ""
                else:
                    i += 2 if text[i] == "\\" else 1
                continue
            char = text[i]
            if char == "#":
                comment = True
                break
            if char in "([{":
                self.depth += 1
            elif char in ")]}":
                self.depth = max(0, self.depth - 1)
            elif char in "'\"":
                self.quote = char * 3 if text.startswith(char * 3, i) else char
                i += len(self.quote) - 1
            i += 1
        backslash = text.endswith("\\") and not comment and len(self.quote) < 3
        if len(self.quote) == 1 and not backslash:
            self.quote = ""  # an unclosed one-line string: a syntax error Python will report
        self.open = self.depth > 0 or len(self.quote) == 3 or backslash


def dump(book: dict[str, Any], like: str, path: str) -> str:
    """``book`` as JSON in the layout of the file text ``like``: its indentation, its escaping of
    non-ASCII text, its final newline. Key order is the dict's, which ``json.loads`` kept.

    JSON nested just under what ``json.loads`` took can be too deep for ``json.dumps``, called
    from deeper in the stack: that is :func:`too_deep` too."""
    indent = _INDENT.match(like.lstrip())
    try:
        text = json.dumps(
            book,
            indent=indent.group(1) if indent else None,
            ensure_ascii=like.isascii(),
        )
    except RecursionError:
        raise too_deep(path, like) from None
    return text + like[len(like.rstrip()) :]
