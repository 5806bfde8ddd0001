"""accel-lint: find distributed-training bugs in Accelerate-style scripts before they burn GPUs.

Exit codes: 0 nothing found, 1 findings (or, with --diff, fixes to show), 2 bad input or usage.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Sequence
from functools import partial

from rich.console import Console

from accelify.rules import config
from accelify.rules.checks import all_rules
from accelify.rules.formats import FORMATS, MACHINE, render_statistics, render_text
from accelify.rules.rule import Rule
from accelify.rules.runner import Options, check_file
from accelify.transform.console import (
    EXIT_ERROR,
    EXIT_FOUND,
    EXIT_OK,
    VersionAction,
    console,
    exit_on_signals,
    parallel_map,
)
from accelify.transform.sources import SourceError, iter_paths, write_atomic

EXAMPLES = """\
examples:
  accel-lint train.py notebooks/          lint files and folders (.py and .ipynb)
  accel-lint --fix .                      apply safe fixes in place, report the rest
  accel-lint --diff --unsafe-fixes x.py   show every fix as a diff, write nothing
  accel-lint --select ACL1,ACL301 .       only checkpoint rules, plus print-on-every-process
  accel-lint --output-format sarif . > lint.sarif
  accel-lint rule ACL101                  what a rule finds, why, and what to write instead
  accel-lint rule --all                   every rule's documentation

rule codes:
  ACL0xx  hangs and crashes on many processes   ACL1xx  checkpoints and files
  ACL2xx  training-loop correctness             ACL3xx  noise (off by default)

configuration (pyproject.toml, found by walking up from each file, or --config FILE):
  [tool.accelify.lint]
  select = ["ACL"]            # default: every rule not off by default
  extend-select = ["ACL301"]
  ignore = ["ACL103"]
  per-file-ignores = { "tests/*" = ["ACL102"] }

suppress one line with `# noqa: ACL101` (or a bare `# noqa`), a whole file with a
`# accelify: noqa` comment line.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accel-lint",
        description=(
            "Find distributed-training bugs in Accelerate-style scripts statically, before\n"
            "they cost GPU hours: CUDA touched before a fork, wrapped models saved, collectives\n"
            "on one process, metrics computed on one shard, schedules sized wrong. Never imports\n"
            "torch. Exit status: 0 clean, 1 findings (with --diff: fixes to show), 2 error."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="*", default=["."], help="files or folders (default: .)")
    parser.add_argument(
        "--select", metavar="CODES", help="comma-separated codes, prefixes or names"
    )
    parser.add_argument("--ignore", metavar="CODES", help="rules to turn off, as for --select")
    parser.add_argument("--fix", action="store_true", help="apply safe fixes in place")
    parser.add_argument(
        "--unsafe-fixes", action="store_true", help="with --fix/--diff, apply unsafe fixes too"
    )
    parser.add_argument("--diff", action="store_true", help="print fixes as a diff, write nothing")
    parser.add_argument(
        "--output-format", choices=FORMATS, default="text", help="default: text (for people)"
    )
    parser.add_argument("--exit-zero", action="store_true", help="exit 0 even with findings")
    parser.add_argument(
        "--statistics", action="store_true", help="count findings per rule instead of listing them"
    )
    parser.add_argument(
        "--output-file", metavar="FILE", help="write the report to FILE (atomically), not stdout"
    )
    parser.add_argument(
        "--config", metavar="FILE", help="settings file; skips the pyproject search"
    )
    parser.add_argument(
        "--jobs", "-j", type=int, default=1, metavar="N", help="files in parallel (0: one per CPU)"
    )
    parser.add_argument("--version", action=VersionAction)
    return parser


def _rule_command(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="accel-lint rule", description="Print a rule's docs; without a code, list the rules."
    )
    parser.add_argument("code", nargs="?", help="a code (ACL101) or name (unwrapped-save)")
    parser.add_argument("--all", action="store_true", help="every rule")
    args = parser.parse_args(argv)
    rules = all_rules()
    if args.all:
        chosen = rules
    elif args.code is None:  # the index: one line a rule, then `accel-lint rule CODE` for docs
        out = console()
        for rule in rules:
            default = "" if rule.enabled_by_default else "  (off by default)"
            out.print(f"{rule.code}  {rule.name}{default}", markup=False)
        return EXIT_OK
    else:
        chosen = [r for r in rules if args.code in (r.code, r.name)]
        if not chosen:
            console(stderr=True).print(
                f"accel-lint: unknown rule {args.code!r} (see `accel-lint rule --all`)",
                markup=False,
            )
            return EXIT_ERROR
    out = console()
    for rule in chosen:
        default = "" if rule.enabled_by_default else ", off by default"
        out.print(f"# {rule.code} {rule.name} ({rule.severity.value}{default})\n", markup=False)
        out.print(rule.docs() + "\n", markup=False)
    return EXIT_OK


def _options(args: argparse.Namespace, rules: list[type[Rule]]) -> Options:
    select = config.parse_selectors(args.select)
    ignore = config.parse_selectors(args.ignore) or ()
    config.check_selectors(rules, [*(select or ()), *ignore], "accel-lint")
    settings = config.load(args.config) if args.config else None
    if settings is not None:
        selectors = [*(settings.select or ()), *settings.extend_select, *settings.ignore]
        selectors += [c for _, codes in settings.per_file_ignores for c in codes]
        config.check_selectors(rules, selectors, args.config)
    return Options(select, ignore, args.fix, args.unsafe_fixes, args.diff, settings)


def run(argv: Sequence[str]) -> int:
    if argv and argv[0] == "rule":
        return _rule_command(argv[1:])
    if argv and argv[0] == "check":  # `ruff check ...` habits
        argv = argv[1:]
    args = _parser().parse_args(argv)
    errors = console(stderr=True)
    rules = all_rules()
    try:
        options = _options(args, rules)
        paths = list(iter_paths(args.paths, suffixes=(".py", ".ipynb")))
    except SourceError as err:
        errors.print(str(err), markup=False)
        return EXIT_ERROR
    results = list(parallel_map(partial(check_file, options=options), paths, args.jobs))
    for result in results:
        for line in [*result.notes, *([result.error] if result.error else [])]:
            errors.print(line, markup=False)
    failed = any(r.error for r in results)
    if args.diff:
        sys.stdout.write("".join(r.diff for r in results))
        found = any(r.diff for r in results)
    else:
        report = io.StringIO() if args.output_file else None
        out = Console(file=report, color_system=None) if report else console()
        if args.statistics:
            render_statistics(results, out)
        elif args.output_format == "text":
            render_text(results, out)
        else:
            out.file.write(MACHINE[args.output_format](results, rules) + "\n")
        if report is not None:
            try:
                write_atomic(args.output_file, report.getvalue().encode())
            except SourceError as err:
                errors.print(str(err), markup=False)
                return EXIT_ERROR
        found = any(r.findings for r in results)
    if failed:
        return EXIT_ERROR
    return EXIT_FOUND if found and not args.exit_zero else EXIT_OK


def main() -> None:
    exit_on_signals()
    sys.exit(run(sys.argv[1:]))
