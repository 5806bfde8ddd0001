"""Everything done to one file: read, pick rules, fix, lint. Plain data in and out, so files can
be checked in worker processes (``--jobs``)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field

from accelify.rules import config, engine, notebook
from accelify.rules.checks import all_rules
from accelify.rules.checks.unconverted_training import UnconvertedTraining
from accelify.rules.engine import Finding
from accelify.rules.rule import Rule
from accelify.transform.sources import (
    STDIN,
    STDIN_NAME,
    Skipped,
    Source,
    SourceError,
    read,
    too_deep,
    write_atomic,
)


@dataclass(frozen=True)
class Options:
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    fix: bool = False
    unsafe_fixes: bool = False
    diff: bool = False  # compute fixes and show them, write nothing
    config: config.Config | None = None  # --config: one settings file for every path
    stdin_filename: str | None = None  # --stdin-filename: the name standard input is linted as


@dataclass
class FileResult:
    path: str
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None  # one line, ``path:line: message``
    diff: str = ""
    fixed: Counter[tuple[str, str]] = field(default_factory=Counter)  # (code, name): removed
    notes: list[str] = field(default_factory=list)
    # Trains with no accelerator in it, and ACL210 (which reads such files) is not selected.
    unchecked: bool = False


def check_file(path: str | SourceError, options: Options) -> FileResult:
    """Lint (and with ``--fix``/``--diff``, fix) one file; errors come back as one line, and so
    does a folder the walk could not list (``path`` is then its error)."""
    if isinstance(path, SourceError):
        return FileResult(path.path, error=str(path))
    name = path if path != STDIN else options.stdin_filename or STDIN_NAME
    result = FileResult(name)
    try:
        _check(path, options, result)
    except Skipped as note:  # a notebook in another language: a line, not a failure
        result.notes.append(str(note))
    except SourceError as err:
        named = err if err.path != STDIN_NAME else SourceError(name, err.line, err.message)
        result.error = str(named)
    except Exception as err:  # a bug in a rule must not hide the other files' findings
        result.error = (
            f"{result.path}:0: internal error (please report): {type(err).__name__}: {err}"
        )
    return result


def _check(path: str, options: Options, result: FileResult) -> None:
    source = read(path)
    name = result.path if path == STDIN and options.stdin_filename else path
    settings = config.for_file(name, options.config)
    rules = config.select_rules(all_rules(), settings, name, options.select, options.ignore)
    book = notebook.parse(result.path, source.text) if name.endswith(".ipynb") else None
    text = book.text if book is not None else source.text
    try:
        if (options.fix or options.diff) and book is None and path != STDIN:
            text = _fix(source, rules, options, result)
        findings = engine.lint(text, rules, None if name == STDIN else name)
    except SyntaxError as err:
        raise _located(err.lineno or 1, f"syntax error: {err.msg}", result.path, book) from None
    except RecursionError:
        deep = too_deep(result.path, text)
        raise _located(deep.line, deep.message, result.path, book) from None
    result.findings = [_in_cell(f, book) for f in findings] if book else findings
    result.unchecked = engine.trains_alone(text) and UnconvertedTraining not in rules


def _located(line: int, message: str, path: str, book: notebook.Notebook | None) -> SourceError:
    """The error at ``line`` of the linted text: in a notebook, at its cell and line."""
    if book is None:
        return SourceError(path, line, message)
    cell, line = book.place(line)
    return SourceError(f"{path}:cell {cell}", line, message)


def _fix(source: Source, rules: list[type[Rule]], options: Options, result: FileResult) -> str:
    """Apply fixes; write them back, or with ``--diff`` only describe them."""
    path, text = source.path, source.text
    before = engine.lint(text, rules)
    fixed, notes = engine.fix(text, rules, unsafe=options.unsafe_fixes)
    result.notes = [f"{result.path}:{note}" for note in notes]
    if fixed == text:
        return text
    if options.diff:
        import difflib  # only for --diff

        result.diff = "".join(
            difflib.unified_diff(
                text.splitlines(keepends=True),
                fixed.splitlines(keepends=True),
                path,
                path,
            )
        )
        return text
    write_atomic(path, source.encode(fixed))
    count = Counter((f.code, f.name) for f in before)
    count.subtract((f.code, f.name) for f in engine.lint(fixed, rules))
    result.fixed = +count  # drops rules whose findings did not go down
    return fixed


def _in_cell(finding: Finding, book: notebook.Notebook) -> Finding:
    cell, line = book.place(finding.line)
    end_cell, end_line = book.place(finding.end_line)
    end_line = end_line if end_cell == cell else line
    # Notebooks are never rewritten (cells would need re-splitting), so no fix is offered.
    return dataclasses.replace(finding, cell=cell, line=line, end_line=end_line, fix=None)
