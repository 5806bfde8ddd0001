"""Re-run accel-lint over checkouts of public repositories and compare with reviewed verdicts.

    python tests/realcode/lint_check.py ROOT [--verdicts tests/realcode/lint_verdicts.csv]
                                             [--folder huggingface+accelerate/examples ...]

ROOT holds the checkouts, one folder per repository named ``owner+name``. Every ``.py`` file under
each folder is linted with the default rules. Each row of the verdicts file is one finding a person
judged by reading the code: its path under ROOT, line, rule code, the verdict (``true-bug``: wrong
on some supported setup; ``cosmetic``: right but worth a change, or a suggestion) and a one-line
reason. A ``false`` finding is never accepted: it is fixed in the linter first. No third-party
code is kept here, only these judgements. The command prints the table and exits 1 when the
linter now finds something not reviewed, or no longer finds something that was (look at it
again), 0 otherwise.
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
from accelify.transform.sources import SourceError, read

HERE = Path(__file__).parent
VERDICTS = HERE / "lint_verdicts.csv"
FOLDERS = (
    "huggingface+accelerate/examples",
    "huggingface+diffusers/examples",
    "huggingface+peft/examples",
)
VERDICTS_ALLOWED = frozenset({"true-bug", "cosmetic"})

Key = tuple[str, int, str]  # path under ROOT, line, code


@dataclass(frozen=True)
class Row:
    path: str
    line: int
    code: str
    verdict: str
    reason: str

    @property
    def key(self) -> Key:
        return self.path, self.line, self.code


def load(path: Path) -> list[Row]:
    with path.open(newline="") as handle:
        return [
            Row(r["path"], int(r["line"]), r["code"], r["verdict"], r["reason"])
            for r in csv.DictReader(handle)
        ]


def findings(
    root: Path, folders: tuple[str, ...], judged: frozenset[str] = frozenset()
) -> tuple[Counter[Key], list[str]]:
    """Every finding under ``folders`` of the default rules and of the rules in ``judged`` (off
    by default, but with verdicts to keep), and one message per file that failed."""
    rules = [rule for rule in all_rules() if rule.enabled_by_default or rule.code in judged]
    found: Counter[Key] = Counter()
    errors = []
    for folder in folders:
        if not (root / folder).is_dir():
            errors.append(f"{folder}: not found under {root}")
            continue
        for file in sorted((root / folder).rglob("*.py")):
            relative = file.relative_to(root).as_posix()
            try:
                text = read(str(file)).text
                found.update((relative, f.line, f.code) for f in lint(text, rules, str(file)))
            except (SourceError, SyntaxError) as err:
                errors.append(f"{relative}: {err}")
    return found, errors


def check(root: Path, rows: list[Row], folders: tuple[str, ...] = FOLDERS) -> list[str]:
    """One message per finding that is new, or reviewed and gone, or file that failed."""
    found, problems = findings(root, folders, frozenset(row.code for row in rows))
    reviewed = Counter(row.key for row in rows if row.path.startswith(folders))
    for (path, line, code), count in sorted((found - reviewed).items()):
        problems.append(f"{path}:{line}: {code} not reviewed ({count}): judge it")
    for path, line, code in sorted(reviewed - found):
        problems.append(f"{path}:{line}: {code} reviewed but no longer found: review it again")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="folder holding the owner+name checkouts")
    parser.add_argument("--verdicts", type=Path, default=VERDICTS)
    parser.add_argument("--folder", action="append", help=f"under ROOT (default: {FOLDERS})")
    args = parser.parse_args(argv)
    rows = load(args.verdicts)
    table = Counter((r.path.split("/", 1)[0], r.code, r.verdict) for r in rows)
    for (repo, code, verdict), count in sorted(table.items()):
        print(f"{repo:28} {code:7} {verdict:9} {count}")
    problems = check(args.root, rows, tuple(args.folder or FOLDERS))
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
