"""Plant multi-process bugs into real Accelerate scripts and measure how many accel-lint finds.

    python tests/realcode/plant_check.py ROOT [--plants tests/realcode/lint_plants.csv]

ROOT holds the checkouts, one folder per repository named ``owner+name``. Each row of the plants
file is one planted bug, kept as data (no third-party code is stored here): the file under ROOT,
the line after which it goes (its exact text, stripped; the first such line), the lines planted
(indented as that line, ``\\n`` between them), the rule that must flag one of them, and the shape
(function, class, module, guard). A planted file must still parse. The command prints recall per
rule and per shape, lists each miss, and exits 1 when any plant is missed or cannot be placed.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from accelify.rules.checks import all_rules
from accelify.rules.engine import lint

HERE = Path(__file__).parent
PLANTS = HERE / "lint_plants.csv"


@dataclass(frozen=True)
class Plant:
    path: str
    after: str
    lines: str
    code: str
    shape: str


def load(path: Path) -> list[Plant]:
    with path.open(newline="") as handle:
        return [
            Plant(r["path"], r["after"], r["lines"].replace("\\n", "\n"), r["code"], r["shape"])
            for r in csv.DictReader(handle)
        ]


def planted(text: str, plant: Plant) -> tuple[str, range] | None:
    """``text`` with ``plant`` in it, and the line numbers (1-based) it takes; None when its
    anchor line is not there."""
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if line.strip() == plant.after:
            indent = line[: len(line) - len(line.lstrip())]
            if line.rstrip().endswith(":"):
                indent += "    "
            new = [indent + row + "\n" for row in plant.lines.split("\n")]
            return "".join(lines[: index + 1] + new + lines[index + 1 :]), range(
                index + 2, index + 2 + len(new)
            )
    return None


def run(root: Path, plants: list[Plant]) -> tuple[Counter, Counter, list[str]]:
    """Found and planted counts per (rule, shape), and one message per miss."""
    rules = [rule for rule in all_rules() if rule.enabled_by_default]
    found: Counter[tuple[str, str]] = Counter()
    total: Counter[tuple[str, str]] = Counter()
    misses = []
    for plant in plants:
        total[plant.code, plant.shape] += 1
        where = f"{plant.path} after {plant.after!r}"
        file = root / plant.path
        placed = planted(file.read_text(), plant) if file.is_file() else None
        if placed is None:
            misses.append(f"{where}: cannot place it (file or line not found)")
            continue
        text, lines = placed
        try:
            codes = {(f.line, f.code) for f in lint(text, rules)}
        except SyntaxError as err:
            misses.append(f"{where}: the planted file does not parse: {err}")
            continue
        if any((line, plant.code) in codes for line in lines):
            found[plant.code, plant.shape] += 1
        else:
            misses.append(f"{where}: {plant.code} ({plant.shape}) not found")
    return found, total, misses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="folder holding the owner+name checkouts")
    parser.add_argument("--plants", type=Path, default=PLANTS)
    args = parser.parse_args(argv)
    found, total, misses = run(args.root, load(args.plants))
    for code in sorted({code for code, _ in total}):
        shapes = sorted(shape for c, shape in total if c == code)
        hit = sum(found[code, s] for s in shapes)
        planted_ = sum(total[code, s] for s in shapes)
        print(f"{code}  {hit}/{planted_}  shapes: {', '.join(shapes)}")
    hit, planted_ = sum(found.values()), sum(total.values())
    print(f"recall {hit}/{planted_} = {hit / max(planted_, 1):.0%}")
    for miss in misses:
        print(miss, file=sys.stderr)
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
