"""accel-convert for Jupyter notebooks: the code cells are converted as one program, then split
back into the cells they came from.

A later cell uses what an earlier one built (the model of cell 3 is trained in cell 5), so the
cells are joined into one script with a unique marker comment after each, converted exactly as a
``.py`` file is, and split at the markers: the notebook's conversion *is* the script's. IPython
lines (``%magic``, ``!shell``) become a marked ``pass`` the converter leaves alone and come back
byte for byte; ``%%magic`` cells stay out of the program. When the split is not exact (a marker
lost, a cell that no longer parses on its own) the notebook is left unchanged with the reason.
Everything but code cells' sources (outputs, metadata, other cells, layout) is written back as it
came.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field, replace

import libcst as cst

from accelify.transform import ipynb, launcher
from accelify.transform.codes import conversion_code
from accelify.transform.convert import Result, convert
from accelify.transform.launcher import FUNCTION, NotLaunched, launch
from accelify.transform.lines import LineMap
from accelify.transform.plan import Note, Options
from accelify.transform.refusals import NOTEBOOK_SPLIT
from accelify.transform.sources import SourceError, python_syntax_error

_LAUNCHED = conversion_code(launcher.__name__)  # the notes of --notebook-launcher's move
Places = tuple[tuple[int, int], ...]  # per line of the program: (code cell, line in that cell)
_LINE = re.compile(r"[^\n]*\n|[^\n]+")


@dataclass(frozen=True)
class NotebookResult(Result):
    """A converted notebook: ``code`` and ``original`` are the notebook file's text, the notes'
    lines are the joined program's, and :meth:`place` turns them into a cell and a line."""

    program: Result = field(default_factory=lambda: Result(""))
    before: Places = ()
    after: Places = ()  # the converted program's lines

    def place(self, line: int, *, written: bool = False) -> tuple[int, int]:
        """``(cell, line)`` of a note's line: in the input, or with ``written`` in the output."""
        if not written:
            return _at(self.before, line)
        return _at(self.after, LineMap(self.program.original, self.program.code).new_line(line))


@dataclass(frozen=True)
class _Program:
    """The code cells joined into one script, and what the split needs to undo the join."""

    text: str
    token: str  # unique to this run: no cell holds it
    magics: tuple[str, ...]  # the IPython lines without their indentation, by placeholder number
    places: Places


def _marker(token: str, number: int | str) -> str:
    """The line after cell ``number`` (``number`` may be a regex group, for the split).

    A string statement, not a comment: code inserted before a cell's first statement then goes
    after the marker, into that cell, and the import block reads on through it."""
    return f'"{token} end of cell {number}"\n'


def _placeholder(token: str, indent: str, number: int | str) -> str:
    """The Python statement standing in for IPython line ``number``: no step edits a bare string,
    and a string is allowed wherever the line was."""
    return f'{indent}"{token} ipython {number}"'


def convert_notebook(
    text: str, options: Options, path: str, launcher: int | None = None
) -> NotebookResult:
    """Convert the notebook JSON ``text`` (with ``launcher``, its training launched on that many
    processes); raise a one-line :class:`SourceError` (with the cell) for a file that is no
    notebook or a cell that is not Python."""
    book = ipynb.load(path, text)
    sources = [ipynb.source_of(cell) for cell in ipynb.code_cells(book)]
    program = _join(sources, path)
    try:
        result = convert(program.text, options, path)
    except SourceError as err:
        cell, line = _at(program.places, err.line)
        raise ipynb.located(path, cell, line, err.message) from None
    result = replace(result, notes=tuple(_cited_in_cells(n, program.places) for n in result.notes))
    unchanged = NotebookResult(text, result.notes, text, result, program.places, program.places)
    if not result.changed:
        return unchanged
    if launcher is not None:
        result = _launched(result, program, launcher, options)
    split = _split(result.code, program, sources)
    if isinstance(split, Note):
        return NotebookResult(text, (split,), text, result, program.places, program.places)
    cells, after = split
    new = iter(cells)
    book["cells"] = [
        ipynb.with_source(cell, next(new)) if cell["cell_type"] == "code" else cell
        for cell in book["cells"]
    ]
    code = ipynb.dump(book, text, path)
    return NotebookResult(code, result.notes, text, result, program.places, after)


def _join(sources: list[str], path: str) -> _Program:
    """One script of the code cells, each checked to be Python on its own (as IPython runs it)."""
    token = f"accelify-{uuid.uuid4().hex}"
    magics: list[str] = []
    chunks = []
    for number, source in enumerate(sources, start=1):
        lines = [] if ipynb.is_cell_magic(source) else _LINE.findall(source)
        indents = list(ipynb.magic_indents(lines))  # read before the loop rewrites lines
        for index, (line, indent) in enumerate(zip(lines, indents, strict=True)):
            if indent is not None:
                end = line[len(line.rstrip("\r\n")) :]
                lines[index] = _placeholder(token, indent, len(magics)) + end
                body = line.removeprefix(indent) if line.startswith(indent) else line.lstrip()
                magics.append(body[: len(body) - len(end)])
        chunk = "".join(lines)
        chunk += "\n" if chunk and not chunk.endswith("\n") else ""
        _check_cell(chunk, path, number)
        chunks.append(chunk)
    text = "".join(chunk + _marker(token, n) for n, chunk in enumerate(chunks, start=1))
    return _Program(text, token, tuple(magics), _places(chunks))


def _check_cell(chunk: str, path: str, number: int) -> None:
    if (error := _syntax_error(chunk)) is not None:
        raise ipynb.located(path, number, error.lineno or 1, f"syntax error: {error.msg}")


def _syntax_error(chunk: str) -> SyntaxError | None:
    try:
        return python_syntax_error(chunk, "<cell>")
    except SyntaxError as err:  # nested beyond Python's limits
        return err


def _launched(result: Result, program: _Program, processes: int, options: Options) -> Result:
    """``result`` with its training moved under ``notebook_launcher``, or with the reason not."""
    created = next((n.line for n in result.notes if n.message == "created accelerator"), 1)

    def is_marker(statement: cst.BaseStatement) -> bool:
        code = cst.Module(body=[statement]).code.strip()
        return re.fullmatch(_marker(program.token, r"\d+").strip(), code) is not None

    try:
        code = launch(result.code, processes, options.target, is_marker)
    except NotLaunched as err:
        cells = re.split("^" + _marker(program.token, r"\d+"), result.code, flags=re.MULTILINE)
        cell, line = _at(_places(cells[:-1]), err.line)
        why = f"training not launched: cell {cell}:{line} {err.why}; move it by hand"
        note = Note(created, why, manual=True, step=_LAUNCHED)
        return replace(result, notes=(*result.notes, note))
    why = f"moved the training into {FUNCTION}(), run by notebook_launcher"
    note = Note(created, why, step=_LAUNCHED)
    return replace(result, code=code, notes=tuple(sorted({*result.notes, note})))


def _split(code: str, program: _Program, sources: list[str]) -> tuple[list[str], Places] | Note:
    """The converted program cut back into cells (and the cell and line of each of its lines),
    or the note saying why it cannot be."""
    pieces = re.split("^" + _marker(program.token, r"(\d+)"), code, flags=re.MULTILINE)
    chunks, numbers, tail = pieces[0:-1:2], pieces[1::2], pieces[-1]
    if numbers != [str(n) for n in range(1, len(sources) + 1)] or tail:
        return _refusal(program, 1, "a cell boundary moved in the conversion")
    # The indentation is the converted code's: a step may have moved the line into a block.
    restore = re.compile(
        _placeholder(program.token, r"^([ \t]*)", r"(\d+)") + r"(?=\r?$)", flags=re.MULTILINE
    )
    found = sorted(int(m.group(2)) for m in restore.finditer(code))
    if found != list(range(len(program.magics))):
        return _refusal(program, 1, "an IPython line was moved or dropped in the conversion")
    cells = []
    for number, (chunk, source) in enumerate(zip(chunks, sources, strict=True), start=1):
        if ipynb.is_cell_magic(source) and chunk:
            return _refusal(program, number, "converted code landed in a %%magic cell")
        if _syntax_error(chunk) is not None:
            return _refusal(program, number, "the converted code does not split at this cell")
        body = restore.sub(lambda m: m.group(1) + program.magics[int(m.group(2))], chunk)
        cells.append(source if ipynb.is_cell_magic(source) else _ending_like(body, source))
    return cells, _places(chunks)


def _ending_like(body: str, source: str) -> str:
    """``body`` ending in the newlines ``source`` ended in (the join added one; the converter may
    leave a blank line at a cell's end)."""
    stripped = source.rstrip("\n")
    return body.rstrip("\n") + source[len(stripped) :]


def _refusal(program: _Program, cell: int, why: str) -> Note:
    line = next((i for i, (c, _) in enumerate(program.places, start=1) if c == cell), 1)
    why = f"notebook left unchanged: {why}; convert by hand"
    return Note(line, why, manual=True, refusal=NOTEBOOK_SPLIT.code)


def _places(chunks: list[str]) -> Places:
    """Cell and line of each line of the joined program (a marker counts as its cell's last)."""
    places: list[tuple[int, int]] = []
    for number, chunk in enumerate(chunks, start=1):
        count = chunk.count("\n")
        places.extend((number, line) for line in range(1, count + 1))
        places.append((number, max(count, 1)))
    return tuple(places)


def _cited_in_cells(note: Note, places: Places) -> Note:
    """``note`` with the lines its message cites (``line 74``) named as the reader finds them,
    ``cell 15:line 4``: the converter counts lines of the joined program."""

    def cite(match: re.Match[str]) -> str:
        cell, line = _at(places, int(match.group(1)))
        return f"cell {cell}:line {line}"

    return replace(note, message=_CITED_LINE.sub(cite, note.message))


_CITED_LINE = re.compile(r"\bline (\d+)\b")


def _at(places: Places, line: int) -> tuple[int, int]:
    return places[min(max(line, 1), len(places)) - 1] if places else (1, line)
