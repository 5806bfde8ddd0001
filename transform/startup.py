"""The entry points of accel-convert and accel-lint, which start ~0.08 s sooner (of ~0.35 s) when
the methods that ``dataclasses`` generates are compiled once per machine, not on every run.

Importing libcst builds ~200 frozen dataclasses, and ``dataclasses`` compiles ~1000 generated
methods from source text each time: ~0.13 s of the tools' ~0.4 s start-up. A code object depends
only on its source text and the interpreter, so the compiled objects are kept in the user's cache
folder (one file per interpreter version, like ``__pycache__``) and executed from there; the
classes built are the same. Only the CLIs do this, single-threaded, before anything else runs: the
library (``import accelify.transform``) leaves ``dataclasses`` alone. Any trouble with the cache
(unreadable, corrupt, unwritable) falls back to compiling, as without it.
"""

from __future__ import annotations

import builtins
import dataclasses
import importlib.util
import marshal
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import CodeType

from accelify.transform.sources import SourceError, write_atomic


def cache_file() -> Path:
    """Where this interpreter's compiled dataclass methods are kept."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    tag = f"{sys.implementation.cache_tag}-{importlib.util.MAGIC_NUMBER.hex()}"
    return Path(root) / "accelify" / f"dataclass-methods-{tag}.marshal"


def _load(path: Path) -> dict[str, CodeType]:
    try:
        with path.open("rb") as stream:
            loaded = marshal.load(stream)
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _store(path: Path, codes: dict[str, CodeType]) -> None:
    """Written whole or not at all: another tool starting at the same time reads either file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(str(path), marshal.dumps(codes))
    except (OSError, SourceError):
        return


@contextmanager
def compiled_once(path: Path | None = None) -> Iterator[dict[str, int]]:
    """While open, ``dataclasses`` runs its generated methods from the cache at ``path``; yields
    counts (``reused``, ``compiled``) for tests and benchmarks."""
    path = path or cache_file()
    known = _load(path)
    used: dict[str, CodeType] = {}
    counts = {"reused": 0, "compiled": 0}

    def run(source: object, globals_: dict | None = None, locals_: dict | None = None) -> None:
        if isinstance(source, str):
            code = known.get(source)
            counts["reused" if code is not None else "compiled"] += 1
            if code is None:  # as exec(source) in dataclasses compiles it: no inherited futures
                code = compile(source, "<string>", "exec", dont_inherit=True)
            used[source] = code
            source = code
        builtins.exec(source, globals_, locals_)

    dataclasses.exec = run  # shadows the builtin for dataclasses' own ``exec(txt, ...)`` calls
    try:
        yield counts
    finally:
        del dataclasses.exec
    if counts["compiled"]:  # kept: what this run used, so methods of old versions drop out
        _store(path, used)


def convert() -> None:
    """``accel-convert``."""
    with compiled_once():
        from accelify.transform.cli import main
    main()


def lint() -> None:
    """``accel-lint``."""
    with compiled_once():
        from accelify.rules.cli import main
    main()
