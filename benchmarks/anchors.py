"""The anchors of the throughput table, run the way their users run them, over one folder.

``python benchmarks/anchors.py TOOL FOLDER --jobs N`` where TOOL is ``ast`` (``ast.parse``, the
physical floor in Python), ``libcst`` (``libcst.parse_module``, the floor for any libcst tool),
``fixit`` (Fixit 2 with its built-in rules, through its own API and process pool) or ``torchfix``
(TorchFix's flake8 checker, its own "torch" prefilter included). The benchmark times the whole
process, exactly as it times ``accel-lint`` and ``accel-convert``.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def _ast(path: Path) -> None:
    ast.parse(path.read_bytes(), str(path))


def _libcst(path: Path) -> None:
    import libcst

    libcst.parse_module(path.read_bytes())


def _torchfix(path: Path) -> None:
    from torchfix.torchfix import TorchChecker

    lines = path.read_text().splitlines(keepends=True)
    list(TorchChecker(None, lines).run())


def _fixit(folder: Path, jobs: int) -> None:
    from fixit.api import fixit_paths

    for _ in fixit_paths([folder], parallel=jobs > 1):
        pass


PER_FILE: dict[str, Callable[[Path], None]] = {
    "ast": _ast,
    "libcst": _libcst,
    "torchfix": _torchfix,
}
TOOLS = (*PER_FILE, "fixit")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tool", choices=TOOLS)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    if args.tool == "fixit":
        _fixit(args.folder, args.jobs)
        return
    paths = sorted(args.folder.rglob("*.py"))
    work = PER_FILE[args.tool]
    if args.jobs <= 1:
        for path in paths:
            work(path)
        return
    with ProcessPoolExecutor(args.jobs) as pool:
        list(pool.map(work, paths, chunksize=4))


if __name__ == "__main__":
    main()
