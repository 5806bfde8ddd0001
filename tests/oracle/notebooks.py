"""The notebook form of the differential oracle: generated scripts cut into one cell per top-level
statement, converted as notebooks, and run.

- ``accel-convert nb.ipynb``: the converted code cells, joined, are judged by runner.judge as the
  script's conversion: bit-identical to the original on one process (both targets), equal ranks
  and disjoint shards on two (accel-run).
- ``--notebook-launcher 2``: the joined cells run as one plain process whose
  ``notebook_launcher`` forks two workers (probe.py records each). They must train exactly as
  accel-run trains the *script's* conversion on two processes (each rank's losses and final
  weights bit-identical), end with equal weights, and fetch disjoint shards that make up the
  original's training samples; ``--notebook-launcher 1`` (a plain call) must be bit-identical to
  the original on one process. A notebook whose training is not moved must say where, and be
  converted exactly as without the option.

    .venv/bin/python tests/oracle/notebooks.py INDEX [...] [--dump DIR]   # judge seed 0's scripts
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from generate import choose, generate
from notebook_cells import book, statement_cells
from runner import (
    CONVERTED,
    GENERATOR_BUG,
    REFUSED,
    WRONG,
    Runner,
    Verdict,
    compare,
    judge,
    two_rank_verdict,
)

from accelify.transform import ipynb
from accelify.transform.convert import Options, Result, convert
from accelify.transform.notebook import NotebookResult, convert_notebook

SEED = 0
# The sample: so many of the first scripts of the seed with these variants, matched in this order
# (the more specific first). Only a module-level training is moved into the launched function
# (the accelerator must be created at the top level), so module gets two; a module script whose
# device follows a --no-cuda flag keeps `torch.cuda.is_available()` outside, which the launcher
# refuses; the other layouts check the plain conversion and that the launcher says why not.
WANTED: tuple[tuple[dict[str, str], int], ...] = (
    ({"scope": "module", "device": "use_cuda_flag"}, 1),
    ({"scope": "module"}, 2),
    ({"scope": "main_func"}, 1),
    ({"scope": "trainer_class"}, 1),
    ({"scope": "trainer_factory"}, 1),
)
NOT_LAUNCHED = re.compile(r"training not launched: cell (?P<cell>\d+):(?P<line>\d+) \S")


def sample(seed: int = SEED) -> list[int]:
    """The first scripts of ``seed`` with each of ``WANTED``'s variants, as many as it asks."""
    left, picked, index = [count for _, count in WANTED], [], 0
    while any(left):
        choice = choose(seed, index)
        want = next((n for n, (v, _) in enumerate(WANTED) if v.items() <= choice.items()), None)
        if want is not None and left[want]:
            left[want] -= 1
            picked.append(index)
        index += 1
    return picked


def notebook(index: int, seed: int = SEED) -> str:
    """Script ``index`` of ``seed`` as a notebook of its top-level statements."""
    return book(*statement_cells(generate(seed, index)[1]))


def code_cells(text: str) -> list[str]:
    """The sources of a notebook's code cells."""
    return [ipynb.source_of(cell) for cell in ipynb.code_cells(ipynb.load("nb.ipynb", text))]


def joined(text: str) -> str:
    """A notebook's code cells as one script, run top to bottom as a kernel runs them."""
    return "".join(c if c.endswith("\n") or not c else c + "\n" for c in code_cells(text))


def converted(
    source: str, options: Options, path: str = "nb.py", launcher: int | None = None
) -> NotebookResult:
    """``source`` cut into statement cells and converted as a notebook (with ``launcher``, as
    ``--notebook-launcher launcher`` does)."""
    name = path.removesuffix(".py") + ".ipynb"
    return convert_notebook(book(*statement_cells(source)), options, name, launcher)


def as_notebook(source: str, options: Options, path: str) -> Result:
    """``convert`` for runner.judge: ``source`` converted as a notebook, the converted cells
    joined (the notes' lines are those of the notebook's joined program)."""
    result = converted(source, options, path)
    return Result(joined(result.code), result.notes, source)


judge_notebook = functools.partial(judge, converter=as_notebook)


def launch_verdict(source: str, name: str, runner: Runner) -> Verdict:
    """The verdict on ``--notebook-launcher`` for one script (see the module docstring)."""
    two = converted(source, Options(), launcher=2)
    notes = tuple(n.message for n in two.notes)
    refusal = next((n for n in notes if n.startswith("training not launched")), "")
    if refusal:
        return _not_launched(refusal, two, converted(source, Options()), notes)
    if not two.changed:
        return Verdict(REFUSED, "", "; ".join(n.message for n in two.reasons), notes=notes)
    original = runner.one(source, f"{name}_original")
    if original.code != 0 or not original.records:
        return Verdict(GENERATOR_BUG, "original-exit", original.tail(), original.error())
    workers = runner.one(joined(two.code), f"{name}_launched")
    decided = two_rank_verdict(original, workers, notes, "launcher")
    if decided and decided[0] == WRONG:
        return Verdict(*decided, notes=notes)
    script = runner.two(convert(source, Options()).code, f"{name}_script")
    if script.code != 0 or len(script.records) != 2:
        return Verdict(WRONG, "script-2p-exit", script.tail(), script.error(), notes)
    for rank, (by_run, by_launcher) in enumerate(zip(script.records, workers.records, strict=True)):
        kind, detail = compare(by_run, by_launcher)
        if kind:
            detail = f"rank {rank}, accel-run on the script (original) against {detail}"
            return Verdict(WRONG, "launcher-like-accel-run", detail, kind, notes)
    one = runner.one(joined(converted(source, Options(), launcher=1).code), f"{name}_launched1")
    if one.code != 0 or len(one.records) != 1:
        return Verdict(WRONG, "launcher1-exit", one.tail(), one.error(), notes)
    kind, detail = compare(original.records[0], one.records[0])
    if kind:
        return Verdict(WRONG, "launcher1-match", detail, kind, notes)
    return Verdict(*decided, notes=notes) if decided else Verdict(CONVERTED, notes=notes)


def _not_launched(
    refusal: str, two: NotebookResult, plain: NotebookResult, notes: tuple[str, ...]
) -> Verdict:
    """A training left where it was must be said at the line of the notebook that keeps it there
    (the line exists, and it or the rest of its cell shows the CUDA touch or the names read), and
    the notebook must then be converted exactly as without the launcher."""
    place = NOT_LAUNCHED.match(refusal)
    cell, line = (int(place["cell"]), int(place["line"])) if place else (0, 0)
    cells = code_cells(two.code)
    if not (1 <= cell <= len(cells) and 1 <= line <= len(cells[cell - 1].splitlines())):
        return Verdict(WRONG, "launcher-refusal-place", refusal, notes=notes)
    there = "\n".join(cells[cell - 1].splitlines()[line - 1 :])
    if not all(word in there for word in _culprits(refusal)):
        why = f"{refusal}\nbut cell {cell} from line {line} reads:\n{there}"
        return Verdict(WRONG, "launcher-refusal-place", why, notes=notes)
    if two.code != plain.code:
        why = "the notebook not launched differs from its plain conversion"
        return Verdict(WRONG, "launcher-refusal-changed", why, notes=notes)
    return Verdict(REFUSED, "", refusal, notes=notes)


def _culprits(refusal: str) -> list[str]:
    """What the code at a refusal's place must show: ``cuda``, or the names it says are read."""
    if "initialises CUDA" in refusal:
        return ["cuda"]
    read = re.search(r" reads (.+), which only", refusal)
    return read[1].split(", ") if read else []


def _dump(directory: Path, index: int, source: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{index:04d}.ipynb").write_text(notebook(index))
    for suffix, launcher in ((".out", None), (".launched", 2)):
        text = converted(source, Options(), launcher=launcher).code
        (directory / f"{index:04d}{suffix}.ipynb").write_text(text)


def main(argv: list[str] | None = None) -> int:
    """Judge scripts of seed 0 as notebooks; with ``--dump``, write each notebook and its two
    conversions for reading. Exit 1 when any verdict fails."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("indices", type=int, nargs="+", metavar="INDEX")
    p.add_argument("--dump", type=Path, metavar="DIR")
    args = p.parse_args(argv)
    runner, failed = Runner(), False
    try:
        for index in args.indices:
            source = generate(SEED, index)[1]
            if args.dump:
                _dump(args.dump, index, source)
            for what, verdict_of in (("plain", judge_notebook), ("launcher", launch_verdict)):
                verdict = verdict_of(source, f"nb_{index}", runner)
                failed |= verdict.failed
                print(f"[{index}] {what}: {verdict.category} {verdict.check}\n{verdict.detail}")
    finally:
        runner.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
