"""Project mode: a script converted together with the files it imports its training from.

Research code builds its objects in ``main.py`` and trains them with ``train_one_epoch`` from
``engine.py`` (or a ``Trainer`` from ``trainer.py``): neither file alone shows a whole training
setup, so each is refused on its own (ACR106). Given both (``accel-convert src/``, or both paths),
the script's ``from engine import ...`` is replaced by engine's code between two marker lines,
where Python's import runs it, and the single-file conversion runs unchanged on that one text;
its output is split back at the markers. The split is kept only when both markers come back
untouched and no file is left reading a name it does not define (a runtime import the converter
wrote in the script is copied to a module that now needs it); otherwise every file of the
program stays as it was, with the reason (ACR108).

Only whole-statement ``from <module> import <names>`` lines at the script's top level join, for a
module beside the script (Python's ``sys.path[0]``) that trains (a ``.backward()`` or a
``.zero_grad()`` call, see ``loss_scaler.module_trains``) and is among the files given. A module
imported that way by two scripts, or that imports training from a third file itself, keeps
every file involved unchanged: its edits would serve one caller only.
"""

from __future__ import annotations

import ast
import builtins
import symtable
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from accelify.transform.convert import Result, convert
from accelify.transform.loss_scaler import module_trains
from accelify.transform.plan import Note, Options
from accelify.transform.refusals import PROGRAM_SPLIT
from accelify.transform.sources import Source, SourceError, python_ast, read

__all__ = ["Converted", "Program", "convert_program", "programs"]

_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_BUILTINS = frozenset(dir(builtins)) | {"__file__", "__name__", "__builtins__", "__spec__"}


@dataclass(frozen=True)
class Program:
    """A script and the modules beside it whose training it imports, in import order."""

    script: str
    modules: tuple[str, ...]
    line: int = 1  # the script's first import of a module
    conflict: str | None = None  # why its files cannot be converted together


def programs(paths: Iterable[str]) -> list[Program]:
    """The scripts among ``paths`` that import training code from other files among them.

    Files that cannot be read or parsed are left to the one-file run, which reports them."""
    given = {_key(path): path for path in paths}
    facts: dict[str, _Facts] = {}
    for key, path in given.items():  # one file's tree at a time: only its imports are kept
        try:
            facts[key] = _facts(python_ast(read(path).text, path))
        except (SourceError, SyntaxError, ValueError, RecursionError, MemoryError):
            continue  # MemoryError: CPython's parser on thousands of nested unary operators
    training = {path for path, found in facts.items() if found.trains}
    joins = {path: list(_joined_imports(path, f.top, training)) for path, f in facts.items()}
    imports = {
        path: tuple(dict.fromkeys(module for _s, module in found))
        for path, found in joins.items()
        if found
    }
    users: dict[str, list[str]] = {}
    for script, modules in imports.items():
        for module in modules:
            users.setdefault(module, []).append(script)
    joined = {id(statement) for found in joins.values() for statement, _m in found}
    for path, found in facts.items():
        for module in _other_imports(path, found.imports, training, joined):
            users.setdefault(module, []).append(path)
    return [
        Program(
            given[script],
            tuple(given[m] for m in modules),
            joins[script][0][0].lineno,
            _conflict(script, modules, imports, users),
        )
        for script, modules in imports.items()
    ]


def _key(path: str) -> str:
    return str(Path(path))


class _Facts(NamedTuple):
    """What finding programs needs of a file: whether it trains, its top-level
    ``from ... import`` statements and every import it makes."""

    trains: bool
    top: list[ast.ImportFrom]
    imports: list[ast.Import | ast.ImportFrom]


def _facts(tree: ast.Module) -> _Facts:
    every = list(ast.walk(tree))
    return _Facts(
        module_trains(tree),
        [s for s in tree.body if isinstance(s, ast.ImportFrom)],
        [n for n in every if isinstance(n, ast.Import | ast.ImportFrom)],
    )


def _joined_imports(
    script: str, statements: Iterable[ast.stmt], training: set[str]
) -> Iterable[tuple[ast.ImportFrom, str]]:
    """The top-level ``from M import ...`` among ``statements`` of ``script`` that name a
    training file beside it, each with that file's key (its normalised path)."""
    folder = Path(script).parent
    for statement in statements:
        if isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module:
            target = _key(str(folder.joinpath(*statement.module.split(".")).with_suffix(".py")))
            if target in training and target != _key(script):
                yield statement, target


def _other_imports(
    path: str, imports: Iterable[ast.Import | ast.ImportFrom], training: set[str], joined: set[int]
) -> Iterable[str]:
    """The training files ``path`` imports in a way that is not joined (``import engine``,
    ``from pkg import engine``, an import inside a function): a call there would miss the
    accelerator the conversion hands the module's functions."""
    folder = Path(path).parent
    for node in imports:
        if isinstance(node, ast.Import):
            candidates = [folder.joinpath(*alias.name.split(".")) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and id(node) not in joined:
            if node.level - 2 >= len(folder.parents):
                continue
            base = folder.parents[node.level - 2] if node.level > 1 else folder
            package = base.joinpath(*node.module.split(".")) if node.module else base
            candidates = [package, *(package / alias.name for alias in node.names)]
        else:
            continue
        for candidate in candidates:
            key = _key(str(candidate.with_suffix(".py")))
            if key in training and key != _key(path):
                yield key


def _conflict(
    script: str,
    modules: Sequence[str],
    imports: Mapping[str, Sequence[str]],
    users: Mapping[str, Sequence[str]],
) -> str | None:
    for module in modules:
        if len(users[module]) > 1:
            others = " and ".join(sorted({Path(s).name for s in users[module]}))
            return f"{Path(module).name} is imported by {others}: its edits would serve one"
        if module in imports:
            return f"{Path(module).name} imports training code from another file in turn"
    if script in users:
        return f"{Path(script).name} is imported by another script that trains"
    return None


@dataclass
class _Joined:
    """The one text the conversion runs on, and where each of its lines comes from."""

    text: str
    origin: list[tuple[str, int]]  # joined line - 1 -> (path, line)
    pieces: list[_Piece]
    elsewhere: frozenset[str]  # the modules' top-level functions and classes


@dataclass
class _Piece:
    """A module spliced into the script in place of its import statement."""

    path: str
    statement: str  # the script's import statement, as written
    head: str  # the module's text above its code (comments, docstring, __future__ imports)
    tail: str  # its ``if __name__ == "__main__":`` block, which an import does not run
    begin: str
    end: str
    definitions: frozenset[str]  # its top-level functions and classes


Converted = tuple[Source | SourceError, Result | SourceError]


def convert_program(program: Program, options: Options) -> dict[str, Converted]:
    """Each file of ``program``, read, and converted together with the others or left as it
    was with the reason (or each one's error)."""
    sources: dict[str, Source] = {}
    results = _convert_program(program, options, sources)
    return {
        path: (sources.get(path, result), result)  # type: ignore[arg-type]
        for path, result in results.items()
    }


def _convert_program(
    program: Program, options: Options, sources: dict[str, Source]
) -> dict[str, Result | SourceError]:
    for path in (program.script, *program.modules):
        try:
            sources[path] = read(path)
        except SourceError as err:
            return _all_unchanged(sources, program, f"{err.path}: {err.message}", err)
    if program.conflict is not None:
        return _all_unchanged(sources, program, program.conflict)
    try:
        joined = _join(program, sources)
        options = replace(options, elsewhere=joined.elsewhere)
    except _NotJoined as why:
        return _all_unchanged(sources, program, str(why))
    except SourceError as err:
        return _all_unchanged(sources, program, f"{err.path}: {err.message}", err)
    try:
        result = convert(joined.text, options, path=program.script)
    except SourceError as err:
        path, line = joined.origin[max(min(err.line, len(joined.origin)), 1) - 1]
        return {**_unchanged(sources, {}), path: SourceError(path, line, err.message)}
    notes = _notes_by_file(result.notes, joined)
    if not result.changed:
        if result.reasons:  # a module trains for the script: its reason is the script's
            _say_why_in_script(program, notes)
            script = Path(program.script).name
            why = f"left unchanged with {script}, which it trains for (see {script}'s report)"
            for module in program.modules:
                if not any(n.manual or n.info for n in notes.get(module, ())):
                    notes.setdefault(module, []).append(Note(1, why, info=True))
        return _unchanged(sources, notes)
    try:
        codes = _split(result.code, joined, sources)
        _check_names(codes, sources)
        _check_tails(joined, codes, sources)
    except _NotJoined as why:
        return _all_unchanged(sources, program, str(why))
    return {
        path: Result(codes[path], tuple(sorted(notes.get(path, ()))), source.text)
        for path, source in sources.items()
    }


def _say_why_in_script(program: Program, notes: dict[str, list[Note]]) -> None:
    """A script whose program stays unchanged for a module's reason says so, with that reason."""
    if any(n.manual or n.info for n in notes.get(program.script, ())):
        return
    for module in program.modules:
        why = next((n for n in notes.get(module, ()) if n.manual or n.info), None)
        if why is not None:
            reason = why.message.removeprefix("left unchanged: ")
            message = f"left unchanged with {Path(module).name} (line {why.line}): {reason}"
            notes.setdefault(program.script, []).append(
                Note(program.line, message, info=True, refusal=why.refusal)
            )
            return


class _NotJoined(Exception):
    """Why the files cannot be converted together."""


def _join(program: Program, sources: Mapping[str, Source]) -> _Joined:
    script = sources[program.script]
    tree = python_ast(script.text, script.path)
    lines = script.text.splitlines(keepends=True)
    texts: list[str] = []
    origin: list[tuple[str, int]] = []
    pieces: list[_Piece] = []
    done = 0  # script lines already copied
    modules = {_key(m): m for m in program.modules}
    ours = _bindings(script)
    for statement, key in _joined_imports(script.path, tree.body, set(modules)):
        module = modules[key]
        start, stop = _lines_of(statement, tree)
        if any(alias.asname or alias.name == "*" for alias in statement.names):
            raise _NotJoined(f"{Path(module).name}'s names are imported under other names")
        if any(p.path == module for p in pieces):
            raise _NotJoined(f"{Path(module).name} is imported by two statements")
        for number in range(done + 1, start):
            texts.append(_ended(lines[number - 1]))
            origin.append((script.path, number))
        piece, body, body_start = _piece(
            sources[module], len(pieces), "".join(lines[start - 1 : stop])
        )
        _refuse_clashes(ours, sources[module], {a.name for a in statement.names})
        for text, (path, number) in (
            (piece.begin, (script.path, start)),
            *((line, (module, body_start + i)) for i, line in enumerate(body)),
            (piece.end, (script.path, start)),
        ):
            texts.append(_ended(text))
            origin.append((path, number))
        pieces.append(piece)
        done = stop
    for number in range(done + 1, len(lines) + 1):
        texts.append(_ended(lines[number - 1]))
        origin.append((script.path, number))
    elsewhere = frozenset(name for piece in pieces for name in piece.definitions)
    return _Joined("".join(texts), origin, pieces, elsewhere)


def _refuse_clashes(
    ours: Mapping[str, tuple[str, str] | None], module: Source, imported: set[str]
) -> None:
    """One text has one set of globals: a name both files bind (other than the same import),
    or one the module reads without defining and the script defines, would be one object
    there and two (or none) when the files run. ``ours``: the script's bindings."""
    theirs = _bindings(module)
    for name in sorted((ours.keys() - imported) & theirs.keys()):
        if ours[name] is None or ours[name] != theirs[name]:
            raise _NotJoined(f"{name} is a different global in each file")
    for name in sorted(_unbound(module.text, module.path) & ours.keys()):
        raise _NotJoined(f"{Path(module.path).name} reads {name} without defining it")


def _bindings(source: Source) -> dict[str, tuple[str, str] | None]:
    """Each name bound at the top of ``source``: the import it is, or None for anything else
    (an assignment, a definition, or two different imports)."""
    table = symtable.symtable(source.text, source.path, "exec")
    imports: dict[str, tuple[str, str] | None] = {}
    for node in python_ast(source.text, source.path).body:
        for found in ast.walk(node) if not isinstance(node, _DEFINITIONS) else ():
            for alias in found.names if isinstance(found, ast.Import | ast.ImportFrom) else ():
                module = found.module or "" if isinstance(found, ast.ImportFrom) else ""
                target = (f"{'.' * getattr(found, 'level', 0)}{module}", alias.name)
                name = alias.asname or alias.name.partition(".")[0]
                imports[name] = target if imports.get(name, target) == target else None
    return {
        symbol.get_name(): None
        if symbol.is_assigned() or symbol.is_namespace()
        else imports.get(symbol.get_name())
        for symbol in table.get_symbols()
        if symbol.is_assigned() or symbol.is_imported() or symbol.is_namespace()
    }


def _ended(line: str) -> str:
    return line if line.endswith(("\n", "\r")) else line + "\n"


def _lines_of(statement: ast.stmt, tree: ast.Module) -> tuple[int, int]:
    """The first and last line of a top-level statement that has its lines to itself."""
    start, stop = _first_line(statement), statement.end_lineno or statement.lineno
    for other in tree.body:
        if other is not statement and _first_line(other) <= stop and other.end_lineno >= start:
            raise _NotJoined("the import shares its line with another statement")
    return start, stop


def _first_line(statement: ast.stmt) -> int:
    decorators = getattr(statement, "decorator_list", ())
    return min([statement.lineno, *(d.lineno for d in decorators)])


def _piece(module: Source, index: int, statement: str) -> tuple[_Piece, list[str], int]:
    """The module cut into head, code and ``__main__`` tail; the code's lines and first line."""
    tree = python_ast(module.text, module.path)
    lines = module.text.splitlines(keepends=True)
    body = [s for s in tree.body if not _is_head(s, tree)]
    guards = [s for s in body if _is_main_guard(s)]
    if len(guards) > 1 or (guards and guards[-1] is not body[-1]):
        raise _NotJoined(f"{Path(module.path).name} has code after its __main__ block")
    code_start = _first_line(body[0]) if body else len(lines) + 1
    code_stop = _first_line(guards[0]) - 1 if guards else len(lines)
    name = Path(module.path).name
    piece = _Piece(
        path=module.path,
        statement=statement,
        head="".join(lines[: code_start - 1]),
        tail="".join(lines[code_stop:]),
        begin=f"_joined_file_{index}_begins = {name!r}\n",
        end=f"_joined_file_{index}_ends = {name!r}\n",
        definitions=frozenset(s.name for s in tree.body if isinstance(s, _DEFINITIONS)),
    )
    return piece, lines[code_start - 1 : code_stop], code_start


def _is_head(statement: ast.stmt, tree: ast.Module) -> bool:
    """The docstring and ``from __future__`` imports, which must stay first in their file."""
    leading = statement is tree.body[0] and isinstance(statement, ast.Expr)
    docstring = leading and isinstance(statement.value, ast.Constant)  # type: ignore[attr-defined]
    future = isinstance(statement, ast.ImportFrom) and statement.module == "__future__"
    return docstring or future


def _is_main_guard(statement: ast.stmt) -> bool:
    test = statement.test if isinstance(statement, ast.If) else None
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
    )


def _split(code: str, joined: _Joined, sources: Mapping[str, Source]) -> dict[str, str]:
    """Each file's converted text, cut from the converted program at the markers."""
    lines = code.splitlines(keepends=True)
    codes: dict[str, str] = {}
    script: list[str] = []
    done = 0
    for piece in joined.pieces:
        begin, end = _marker(lines, piece.begin), _marker(lines, piece.end)
        if not done <= begin < end:
            raise _NotJoined("the conversion moved code across the files' boundary")
        script.extend(lines[done:begin])
        script.append(piece.statement)
        codes[piece.path] = piece.head + "".join(lines[begin + 1 : end]) + piece.tail
        done = end + 1
    script.extend(lines[done:])
    codes[next(iter(sources))] = "".join(script)
    for path, text in codes.items():  # give back a missing last newline, as the file had it
        if not sources[path].text.endswith(("\n", "\r")) and text.endswith("\n"):
            codes[path] = text[:-1]
    return codes


def _marker(lines: Sequence[str], marker: str) -> int:
    found = [i for i, line in enumerate(lines) if line.rstrip("\r\n") == marker.rstrip("\n")]
    if len(found) != 1:
        raise _NotJoined("the conversion moved code across the files' boundary")
    return found[0]


def _check_names(codes: dict[str, str], sources: Mapping[str, Source]) -> None:
    """No file may read a name it does not define: a module reading the script's global
    ``accelerator`` would stop with a NameError at its first step. A runtime import the script
    gained is copied to a module that now names it."""
    script = next(iter(sources))
    gained = _new_imports(codes[script], sources[script].text)
    for path, source in sources.items():
        try:
            missing = _unbound(codes[path], path) - _unbound(source.text, path)
        except SyntaxError:  # newer syntax than this Python's symtable reads
            raise _NotJoined(f"{Path(path).name}'s names cannot be checked") from None
        if path != script and (copied := {n: gained[n] for n in missing if n in gained}):
            codes[path] = _with_imports(codes[path], path, copied)
            missing -= copied.keys()
        if missing:
            names = ", ".join(sorted(missing))
            raise _NotJoined(f"{Path(path).name} would read {names}, which it does not define")


def _check_tails(joined: _Joined, codes: Mapping[str, str], sources: Mapping[str, Source]) -> None:
    """A module's ``__main__`` block is not converted: it may not call what the conversion
    changed (a function that now takes the accelerator)."""
    for piece in joined.pieces:
        if not piece.tail:
            continue
        before, after = (_definitions(t) for t in (sources[piece.path].text, codes[piece.path]))
        changed = {name for name, text in before.items() if after.get(name) != text}
        called = {n.id for n in ast.walk(python_ast(piece.tail)) if isinstance(n, ast.Name)}
        if changed & called:
            names = ", ".join(sorted(changed & called))
            name = Path(piece.path).name
            raise _NotJoined(f"{name}'s __main__ block calls {names}, which the conversion changes")


def _definitions(code: str) -> dict[str, str | None]:
    """Each top-level function and class of ``code``, with its source."""
    return {
        node.name: ast.get_source_segment(code, node)
        for node in python_ast(code).body
        if isinstance(node, _DEFINITIONS)
    }


def _new_imports(code: str, original: str) -> dict[str, str]:
    """The names the conversion imported at the top of ``code``, with the module of each."""

    def imported(text: str) -> dict[str, str]:
        tree = python_ast(text)
        return {
            alias.asname or alias.name: statement.module or ""
            for statement in tree.body
            if isinstance(statement, ast.ImportFrom)
            for alias in statement.names
        }

    before = imported(original)
    return {name: module for name, module in imported(code).items() if name not in before}


def _with_imports(code: str, path: str, names: Mapping[str, str]) -> str:
    """``code`` with ``from <module> import <names>`` after its leading imports."""
    tree = python_ast(code, path)
    after = 0
    for statement in tree.body:
        if isinstance(statement, ast.Import | ast.ImportFrom):
            after = statement.end_lineno or statement.lineno
        elif after or not _is_head(statement, tree):
            break
    by_module: dict[str, list[str]] = {}
    for name, module in sorted(names.items()):
        by_module.setdefault(module, []).append(name)
    lines = code.splitlines(keepends=True)
    added = [f"from {module} import {', '.join(n)}\n" for module, n in by_module.items()]
    return "".join([*lines[:after], *added, *lines[after:]])


def _unbound(code: str, path: str) -> set[str]:
    """The global names ``code`` reads that nothing in it binds and Python does not provide."""
    table = symtable.symtable(code, path, "exec")
    bound = {
        s.get_name()
        for s in table.get_symbols()
        if s.is_assigned() or s.is_imported() or s.is_namespace()
    }
    read: set[str] = set()
    pending = [table]
    while pending:
        scope = pending.pop()
        pending.extend(scope.get_children())
        for symbol in scope.get_symbols():
            name = symbol.get_name()
            if symbol.is_declared_global() and symbol.is_assigned():
                bound.add(name)
            if symbol.is_referenced() and (scope is table or symbol.is_global()):
                read.add(name)
    return read - bound - _BUILTINS


def _notes_by_file(notes: Iterable[Note], joined: _Joined) -> dict[str, list[Note]]:
    by_file: dict[str, list[Note]] = {}
    for note in notes:
        path, line = joined.origin[max(min(note.line, len(joined.origin)), 1) - 1]
        by_file.setdefault(path, []).append(replace(note, line=line, node=None))
    return by_file


def _unchanged(
    sources: Mapping[str, Source], notes: Mapping[str, list[Note]]
) -> dict[str, Result | SourceError]:
    return {
        path: Result(s.text, tuple(sorted(set(notes.get(path, ())))), s.text)
        for path, s in sources.items()
    }


def _all_unchanged(
    sources: Mapping[str, Source], program: Program, reason: str, error: SourceError | None = None
) -> dict[str, Result | SourceError]:
    """Every file as it was, each saying why (at the script's import of the modules); a file
    that could not be read gives its error instead."""
    with_files = ", ".join(Path(p).name for p in (program.script, *program.modules))
    message = f"left unchanged with {with_files}: {reason}; convert the files by hand"
    notes = {
        path: [Note(program.line if path == program.script else 1, message, manual=True,
                    refusal=PROGRAM_SPLIT.code)]
        for path in (program.script, *program.modules)
    }  # fmt: skip
    out = _unchanged(sources, notes)
    if error is not None:
        out[error.path] = error
    return out
