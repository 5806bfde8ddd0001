"""accelify's benchmarks: converter, linter and runtime against their anchors, in one run.

    python benchmarks/run.py [--quick] [--only SECTION,...] [--out FOLDER]

Writes ``latest.json`` and ``latest.md`` (default folder: benchmarks/results/) and prints the
table. Numbers are claimed only as ratios against anchors measured in the same run on the same
machine. Installs nothing: an anchor that is not installed is reported as such (the ``bench`` extra
installs them all). Exit status 0, or 1 when a section could not run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import exits
import memory
import runtime_bench
import scaling
import static
from report import Section, machine, write
from timing import CommandFailed


@dataclass(frozen=True)
class Profile:
    files: int  # corpus size
    repeats: int  # throughput runs over the corpus
    startup_repeats: int
    import_repeats: int  # each a fresh interpreter importing torch first
    loop_repeats: int  # fresh processes per loop, on 1 and on 2 processes
    steps: int  # timed steps per loop process
    sizes: tuple[int, int] = (2500, 10000)  # module-level assignments, small and 4x larger
    exit_runs: int = 20  # runs of the clean-exit job per runtime and launcher
    big_file: int = 200_000  # lines of the file whose peak memory is measured
    copies: tuple[int, int] = (50, 1000)  # files converted in one process, few and many
    anchors: bool = True  # also run the other frameworks the runtime is compared with
    gpu_repeats: int = 3  # fresh processes per loop on the GPU
    gpt2_steps: tuple[int, int] = (50, 300)  # GPT-2 small on the GPU: warm-up, then timed steps


PROFILES = {
    "full": Profile(
        files=200, repeats=3, startup_repeats=10, import_repeats=7, loop_repeats=3, steps=2000
    ),
    "quick": Profile(
        files=12,
        repeats=3,
        startup_repeats=5,
        import_repeats=3,
        loop_repeats=1,
        steps=500,
        sizes=(1000, 4000),
        exit_runs=5,
        big_file=20_000,
        copies=(20, 200),
        # Sized for ~4 min of GPU section on an H100 (benchmarks/gpu_check.sh allows 5).
        gpu_repeats=2,
        gpt2_steps=(30, 100),
    ),
    # Only proves that every section runs; the numbers mean nothing (tests/test_benchmarks.py).
    "smoke": Profile(
        files=4,
        repeats=1,
        startup_repeats=1,
        import_repeats=1,
        loop_repeats=1,
        steps=20,
        sizes=(50, 200),
        exit_runs=1,
        big_file=500,
        copies=(2, 6),
        anchors=False,
        gpu_repeats=1,
        gpt2_steps=(1, 5),
    ),
}

SECTIONS: dict[str, Callable[[Profile, Path], Section]] = {
    "throughput": lambda p, work: static.throughput(work, p.files, p.repeats),
    "startup": lambda p, work: static.startup(work, p.startup_repeats),
    "scaling": lambda p, _: scaling.scaling(p.sizes, p.repeats),
    "imports": lambda p, _: runtime_bench.imports(p.import_repeats),
    "per_step": lambda p, _: runtime_bench.per_step(p.loop_repeats, p.steps, p.anchors),
    "distributed": lambda p, _: runtime_bench.distributed(p.loop_repeats, p.steps, p.anchors),
    "sync_check": lambda p, _: runtime_bench.sync_check(p.loop_repeats, p.steps),
    "gpu": lambda p, _: runtime_bench.gpu(p.gpu_repeats, p.steps, p.gpt2_steps, p.anchors),
    "exits": lambda p, _: exits.exits(p.exit_runs),
    "memory": lambda p, work: memory.memory(work, p.big_file, p.copies),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="benchmarks/run.py",
        description=__doc__.split("\n\n")[0],
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="fewer files and repeats (~2 min)")
    mode.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--only", metavar="SECTIONS", help=f"comma-separated, from: {', '.join(SECTIONS)}"
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results", help="results folder"
    )
    return parser


def _cache_compiled_code(work: Path) -> None:
    """Let the timed processes keep what they compile, as installed tools do: bytecode (pip
    compiles it at install; under ``PYTHONDONTWRITEBYTECODE`` an editable checkout would recompile
    its own ~50 modules in every process, ~0.1 s of each start-up) and the CLIs' cache of dataclass
    methods (``accelify.transform.startup``). Both live in the run's folder, and each median leaves
    out the one run that fills them."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    os.environ["XDG_CACHE_HOME"] = str(work / "cache")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    chosen = args.only.split(",") if args.only else list(SECTIONS)
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section {', '.join(unknown)} (choose from {', '.join(SECTIONS)})")
    name = "smoke" if args.smoke else "quick" if args.quick else "full"
    profile = PROFILES[name]
    started = time.perf_counter()
    sections = []
    with tempfile.TemporaryDirectory(prefix="accelify-bench-") as tmp:
        _cache_compiled_code(Path(tmp))
        for key in chosen:
            print(f"running {key} ...", file=sys.stderr, flush=True)
            try:
                sections.append(SECTIONS[key](profile, Path(tmp)))
            except (CommandFailed, RuntimeError) as err:
                sections.append(Section(key, key, [], status=f"failed: {err}"))
    meta = {**machine(), "mode": name, "seconds": time.perf_counter() - started}
    print(write(args.out, sections, meta))
    return 1 if any(s.status.startswith("failed") for s in sections) else 0


if __name__ == "__main__":
    sys.exit(main())
