"""Which functions the script imports from its own modules download something.

``from data import get_training_set`` in ``train.py``, with ``data.py`` beside it, may fetch a
dataset that every process would then download into the same folder at once. Only the file
beside the script is read (with :mod:`ast`, nothing is run): its top-level functions that call a
fetch (``urlopen``, ``urlretrieve``, ``extractall``, ``download=True``, ...) directly or through
another function of that file.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

from accelify.transform.sources import SourceError, python_ast, read

FETCHES = frozenset(
    {"urlretrieve", "urlopen", "download_url", "download_and_extract_archive", "extractall"}
)


def fetching_imports(path: str, imports: Mapping[str, str]) -> frozenset[str]:
    """The qualified names (``data.get_training_set``) among ``imports`` whose function, in a
    module next to ``path``, downloads or extracts files."""
    script = Path(path)
    if not script.is_file():
        return frozenset()
    by_module: dict[str, set[str]] = {}
    for qualified in imports.values():
        module, _, function = qualified.lstrip(".").rpartition(".")
        if module:
            by_module.setdefault(module, set()).add(function)
    found = set()
    for module, functions in by_module.items():
        tree = _parse(_module_file(script.parent, module))
        if tree is None:
            continue
        fetching = _fetching_functions(tree)
        found.update(f"{module}.{f}" for f in functions & fetching)
    return frozenset(q for q in imports.values() if q.lstrip(".") in found)


def _module_file(folder: Path, module: str) -> Path:
    base = folder.joinpath(*module.split("."))
    package = base / "__init__.py"
    return package if package.is_file() else base.with_suffix(".py")


def _parse(file: Path) -> ast.Module | None:
    if not file.is_file():
        return None
    try:
        return python_ast(read(str(file)).text, str(file))
    except (SourceError, SyntaxError, ValueError, OSError):
        return None  # a module we cannot read tells us nothing


def _fetching_functions(tree: ast.Module) -> set[str]:
    functions = {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    calls = {name: list(_calls(node)) for name, node in functions.items()}
    fetching = {name for name, found in calls.items() if any(_fetches(c) for c in found)}
    while True:  # a function calling one that fetches fetches too
        more = {
            name
            for name, found in calls.items()
            if name not in fetching and any(_callee(c) in fetching for c in found)
        }
        if not more:
            return fetching
        fetching |= more


def _calls(node: ast.AST) -> Iterable[ast.Call]:
    return (n for n in ast.walk(node) if isinstance(n, ast.Call))


def _callee(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def _fetches(call: ast.Call) -> bool:
    download = any(
        k.arg == "download" and isinstance(k.value, ast.Constant) and k.value.value is True
        for k in call.keywords
    )
    return download or _callee(call) in FETCHES
