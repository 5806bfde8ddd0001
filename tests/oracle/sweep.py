"""The full differential sweep: generate, convert, run, compare, shrink; print the table.

    .venv/bin/python tests/oracle/sweep.py [--count 300] [--seed 0] [--jobs 2] [--only INDEX ...]
                                           [--dump DIR] [--no-run] [--shrink-budget N] [--cuda]

Exit 1 when any script is WRONG, UNCHANGED-WITHOUT-REASON or a GENERATOR-BUG. Each kind of
failure (the failing check and its exception or mismatch) is shrunk once, on its first script,
to the fewest non-simplest variants that still fail the same way; the others of that kind point
to it. ``--dump DIR`` writes every script with its two conversions and its report (and the
shrunk scripts under DIR/shrunk) for reading.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from generate import AXES, Choice, generate, render, shrink, simplest
from runner import (
    CATEGORIES,
    Runner,
    Verdict,
    convert_both,
    dump,
    judge,
    still_fails_like,
)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=300, help="scripts to generate (default 300)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2, help="scripts judged at once (default 2)")
    p.add_argument("--only", type=int, nargs="+", metavar="INDEX", help="judge only these")
    p.add_argument("--dump", type=Path, metavar="DIR", help="write scripts, conversions, reports")
    p.add_argument("--no-run", action="store_true", help="with --dump: convert only, run nothing")
    p.add_argument(
        "--shrink-budget", type=int, default=30, help="candidates per failure kind (0: none)"
    )
    p.add_argument(
        "--subprocess", action="store_true", help="1-process runs in fresh interpreters, no zygote"
    )
    p.add_argument(
        "--fork-two",
        action="store_true",
        help="two-process runs forked by the zygote instead of launched by accel-run (about 20x "
        "faster; the same runtime and environment, without the launcher)",
    )
    p.add_argument(
        "--cuda",
        action="store_true",
        help="let the scripts see the GPU, and run the one-process checks only (two NCCL ranks "
        "cannot share one GPU)",
    )
    return p.parse_args(argv)


def short(choice: Choice) -> str:
    """The variants that are not their axis's simplest (what a shrunk failure is made of)."""
    words = [f"{a}={v}" for a, v in choice.items() if v != simplest(a)]
    return " ".join(words) or "(all simplest)"


def parallel(jobs: int, fn: Callable, items: list) -> dict:
    """``{item: fn(item)}``, computed ``jobs`` at a time, in the order of ``items``."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return dict(zip(items, pool.map(fn, items), strict=True))


def judge_selected(
    items: list,
    test: str,
    param: str,
    source: Callable[[object], str],
    verdict: Callable[[str, str, Runner], object] = judge,
) -> dict:
    """The verdict of every script that the session's selected ``test`` items name by ``param``,
    judged once (by ``verdict``, runner.judge unless a module has its own), two at a time: what
    each slow oracle test module's fixture hands its tests."""
    selected = [
        item.callspec.params[param] for item in items if getattr(item, "originalname", "") == test
    ]
    runner = Runner()
    try:
        return parallel(2, lambda key: verdict(source(key), f"sample_{key}", runner), selected)
    finally:
        runner.close()


def source_state(folder: str) -> str:
    """A digest of the sources under ``folder`` (transform or runtime) of the repository."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for path in sorted(root.glob(f"{folder}/**/*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Sweep:
    """One sweep's scripts and what the oracle made of them."""

    args: argparse.Namespace
    runner: Runner
    scripts: dict[int, tuple[Choice, str]]
    verdicts: dict[int, Verdict] = field(default_factory=dict)
    kinds: dict[str, list[int]] = field(default_factory=dict)  # signature -> script indices
    shrunk: dict[str, tuple[Choice, Verdict]] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)
    # Digests of transform/ and runtime/ when the sweep started, and whether the runtime's changed
    # before it ended. The converter is imported once by this process, so a sweep is about one
    # converter; the runtime is imported anew by every zygote and accel-run, so it must not move.
    state: dict[str, str] = field(default_factory=dict)
    changed: bool = False

    def judge_one(self, i: int) -> Verdict:
        t0 = time.monotonic()
        name = f"s{self.args.seed}_{i:04d}"
        stop = "1p" if self.args.cuda else ""
        verdict = judge(
            self.scripts[i][1], name, self.runner, stop_after=stop, fork_two=self.args.fork_two
        )
        check = f" {verdict.check}" if verdict.check else ""
        log(f"[{i:4d}] {verdict.category}{check} ({time.monotonic() - t0:.1f} s)")
        if self.args.dump:
            dump(self.args.dump, f"{i:04d}", self.scripts[i][1], verdict)
        return verdict

    def run(self) -> None:
        self.state = {folder: source_state(folder) for folder in ("transform", "runtime")}
        t0 = time.monotonic()
        self.verdicts = parallel(self.args.jobs, self.judge_one, list(self.scripts))
        self.times["sweep"] = time.monotonic() - t0
        for i, verdict in self.verdicts.items():
            if verdict.failed:
                self.kinds.setdefault(verdict.signature(), []).append(i)
        if self.args.shrink_budget:
            self.shrunk = parallel(self.args.jobs, self.shrink_kind, list(self.kinds))
        self.times["total"] = time.monotonic() - t0
        self.changed = source_state("runtime") != self.state["runtime"]

    def shrink_kind(self, kind: str) -> tuple[Choice, Verdict]:
        """Shrink the first script of a failure kind to the simplest one failing the same way."""
        first = self.kinds[kind][0]
        choice, verdict = self.scripts[first][0], self.verdicts[first]
        name = f"shrink_{first}"
        t0 = time.monotonic()
        result = shrink(
            choice,
            lambda c: still_fails_like(verdict, render(c), self.runner, name),
            budget=self.args.shrink_budget,
        )
        final = judge(render(result), name, self.runner)
        log(f"shrunk [{first}] in {time.monotonic() - t0:.0f} s: {short(result)}")
        if self.args.dump:
            dump(self.args.dump / "shrunk", f"{first:04d}", render(result), final)
        return result, final

    def report(self) -> None:
        counts = Counter(v.category for v in self.verdicts.values())
        distinct = len({tuple(c.values()) for c, _ in self.scripts.values()})
        variants = sum(len(v) for v in AXES.values())
        print(f"\naccelify converter oracle: seed {self.args.seed}, {len(self.verdicts)} scripts "
              f"({distinct} distinct), {variants} variants on {len(AXES)} axes")  # fmt: skip
        print(f"sweep {self.times['sweep']:.0f} s, with shrinking {self.times['total']:.0f} s, "
              f"{self.args.jobs} jobs; sources: transform {self.state['transform']}, "
              f"runtime {self.state['runtime']}")  # fmt: skip
        if self.changed:
            print("WARNING: runtime/ changed during the sweep: the verdicts mix two runtimes")
        print()
        print(f"{'generated':<26}{len(self.verdicts):>5}")
        for category in CATEGORIES:
            print(f"{category:<26}{counts.get(category, 0):>5}")
        refusals = Counter(
            v.detail for v in self.verdicts.values() if v.category == "refused-with-reason"
        )
        if refusals:
            print("\nrefusal reasons:")
            for reason, n in refusals.most_common():
                print(f"  {n:4d}  {reason[:150]}")
        for n, (kind, members) in enumerate(self.kinds.items(), 1):
            self._report_kind(n, kind, members)
        if self.kinds:
            print(
                "\nevery failing script (index: check, kind, variants that are not the simplest):"
            )
        for i, verdict in self.verdicts.items():
            if verdict.failed:
                n = list(self.kinds).index(verdict.signature()) + 1
                print(f"  #{i}: {verdict.check} (kind {n}) {short(self.scripts[i][0])}")
                if verdict.signature() in self.shrunk:
                    print(f"        shrunk: {short(self.shrunk[verdict.signature()][0])}")

    def _report_kind(self, n: int, kind: str, members: list[int]) -> None:
        first = self.verdicts[members[0]]
        listed = ", ".join(map(str, members[:20])) + (" ..." if len(members) > 20 else "")
        print(f"\n[{n}] {first.category}: {kind}\n    {len(members)} scripts: {listed}")
        if first.check.endswith(
            ("-match", "-sharding", "-unsharded", "-ranks-differ", "-disagree")
        ):
            print(f"    #{members[0]}: {first.detail.strip().splitlines()[0][:200]}")
        if kind in self.shrunk:
            choice, final = self.shrunk[kind]
            print(f"    shrunk to ({final.category} {final.check}): {short(choice)}")


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.cuda:
        os.environ["ORACLE_CUDA"] = "1"  # runner.clean_env() then leaves the GPU visible
    indices = args.only or list(range(args.count))
    scripts = {i: generate(args.seed, i) for i in indices}
    if args.no_run:
        directory = args.dump or Path("oracle-dump")
        for i, (_, source) in scripts.items():
            dump(directory, f"{i:04d}", source, None, convert_both(source, f"{i:04d}"))
        print(f"wrote {len(scripts)} scripts and their conversions to {directory}")
        return 0
    runner = Runner(fork=not args.subprocess)
    sweep = Sweep(args, runner, scripts)
    try:
        sweep.run()
    finally:
        runner.close()
    sweep.report()
    return 1 if any(v.failed for v in sweep.verdicts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
