"""accel-lint: find distributed-training bugs in Accelerate-style scripts before they burn GPUs.

Exit codes: 0 nothing found, 1 findings (or, with --diff, fixes to show), 2 bad input or usage.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Annotated

import typer

from accelify.rules import config
from accelify.rules.checks import all_rules
from accelify.rules.formats import MACHINE, OutputFormat, render_statistics, render_text
from accelify.rules.rule import Rule
from accelify.rules.runner import FileResult, Options, check_file
from accelify.transform import console as term
from accelify.transform.progress import progress
from accelify.transform.sources import SourceError, iter_paths, write_atomic

if TYPE_CHECKING:
    from rich.console import Console

PROG = "accel-lint"

HELP = """Find distributed-training bugs in Accelerate-style scripts statically, before they cost
GPU hours: CUDA touched before a fork, wrapped models saved, collectives on one process, metrics
computed on one shard, schedules sized wrong. Never imports torch.

Each PATH is a file or a folder (.py and .ipynb files; default: .); - reads standard input.
A notebook in another language (an R or Julia kernel) is skipped with a note.

Exit status: 0 clean, 1 findings (with --diff: fixes to show), 2 error.
"""
EXAMPLES = """\
\b
examples:
  accel-lint train.py notebooks/          lint files and folders (.py and .ipynb)
  accel-lint --fix .                      apply safe fixes in place, report the rest
  accel-lint --diff --unsafe-fixes x.py   show every fix as a diff, write nothing
  accel-lint --select ACL1,ACL301 .       only checkpoint rules, plus print-on-every-process
  accel-lint --output-format sarif . > lint.sarif
  accel-lint rule ACL101                  what a rule finds, why, and what to write instead
  accel-lint rule --all                   every rule's documentation

\b
rule codes:
  ACL0xx  hangs and crashes on many processes   ACL1xx  checkpoints and files
  ACL2xx  training-loop correctness             ACL3xx  noise (off by default)

\b
configuration (pyproject.toml, found by walking up from each file, or --config FILE):
  [tool.accelify.lint]
  select = ["ACL"]            # default: every rule not off by default
  extend-select = ["ACL301"]
  ignore = ["ACL103"]
  per-file-ignores = { "tests/*" = ["ACL102"] }

suppress one line with `# noqa: ACL101` (or a bare `# noqa`), a whole file with a
`# accelify: noqa` comment line.
"""


def _check(  # typer passes every parameter by name
    *,
    # The argument's help goes in HELP: click 8.5 drops typer's help for arguments.
    paths: Annotated[
        list[str] | None, typer.Argument(metavar="[PATH]...", show_default=False)
    ] = None,
    select: Annotated[
        str | None, typer.Option(metavar="CODES", help="Comma-separated codes, prefixes or names.")
    ] = None,
    ignore: Annotated[
        str | None, typer.Option(metavar="CODES", help="Rules to turn off, as for --select.")
    ] = None,
    fix: Annotated[bool, typer.Option("--fix", help="Apply safe fixes in place.")] = False,
    unsafe_fixes: Annotated[
        bool, typer.Option("--unsafe-fixes", help="With --fix/--diff, apply unsafe fixes too.")
    ] = False,
    show_fixes: Annotated[
        bool,
        typer.Option("--show-fixes", help="With --fix, list the fixes applied per file and rule."),
    ] = False,
    diff: Annotated[
        bool, typer.Option("--diff", help="Print fixes as a diff, write nothing.")
    ] = False,
    output_format: Annotated[
        OutputFormat, typer.Option(help="text is for people; the others for CI and review tools.")
    ] = "text",
    exit_zero: Annotated[
        bool, typer.Option("--exit-zero", help="Exit 0 even with findings.")
    ] = False,
    statistics: Annotated[
        bool, typer.Option("--statistics", help="Count findings per rule instead of listing them.")
    ] = False,
    output_file: Annotated[
        str | None,
        typer.Option(metavar="FILE", help="Write the report to FILE (atomically), not stdout."),
    ] = None,
    config_file: Annotated[
        str | None,
        typer.Option("--config", metavar="FILE", help="Settings file; skips the pyproject search."),
    ] = None,
    stdin_filename: Annotated[
        str | None,
        typer.Option(
            metavar="PATH",
            help="The name standard input is linted as (for reports, config and per-file-ignores).",
        ),
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print findings, nothing else (no summary).")
    ] = False,
    show_files: Annotated[
        bool, typer.Option("--show-files", help="List the files that would be linted, then exit.")
    ] = False,
    show_settings: Annotated[
        bool,
        typer.Option(
            "--show-settings", help="Show the settings and rules of the first file, then exit."
        ),
    ] = False,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs", "-j", min=0, metavar="N", help="Files in parallel (0: one per CPU)."
        ),
    ] = 1,
    color: term.ColorOption = "auto",
    version: term.VersionFlag = False,
) -> int:
    term.use_color(color)
    rules = all_rules()
    select_codes = config.parse_selectors(select)
    ignore_codes = config.parse_selectors(ignore) or ()
    unknown = config.unknown_selectors(rules, [*(select_codes or ()), *ignore_codes])
    if unknown:
        return term.usage_error(PROG, f"unknown rule selector {unknown[0]!r}")
    errors = term.console(stderr=True)
    try:
        settings = config.load(config_file) if config_file is not None else None
        files = _linted(paths or ["."], settings)
    except SourceError as err:
        errors.print(str(err), markup=False)
        return term.EXIT_ERROR
    if show_files or show_settings:
        named = [f for f in files if isinstance(f, str)]
        if not named:
            errors.print("no Python files found", markup=False)
            return term.EXIT_ERROR
        if show_files:
            sys.stdout.writelines(f"{name}\n" for name in named)
            return term.EXIT_OK
        try:
            sys.stdout.write(_settings_of(named[0], settings, select_codes, ignore_codes, rules))
        except (OSError, RuntimeError) as err:  # a symbolic link loop
            errors.print(f"{named[0]}:0: {err}", markup=False)
            return term.EXIT_ERROR
        return term.EXIT_OK
    options = Options(select_codes, ignore_codes, fix, unsafe_fixes, diff, settings, stdin_filename)
    # A progress line is for people: not under -q, never in a report a program reads.
    results = _results(files, options, jobs, errors, show=not quiet and output_format == "text")
    said: set[str] = set()  # a settings file's mistake is met by every file it applies to
    for result in results:
        for line in [*result.notes, *([result.error] if result.error else [])]:
            if line not in said:
                said.add(line)
                errors.print(line, markup=False)
    failed = any(r.error for r in results)
    if diff:
        sys.stdout.write("".join(r.diff for r in results))
        found = any(r.diff for r in results)
    else:
        report = io.StringIO() if output_file else None
        out = term.PlainConsole(report) if report else term.console()
        if statistics:
            render_statistics(results, out)
        elif output_format == "text":
            render_text(results, out, show_fixes, quiet)
        else:
            out.file.write(MACHINE[output_format](results, rules) + "\n")
        if output_file is not None and report is not None:
            try:
                write_atomic(output_file, report.getvalue().encode())
            except SourceError as err:
                errors.print(str(err), markup=False)
                return term.EXIT_ERROR
        found = any(r.findings for r in results)
    if failed:
        return term.EXIT_ERROR
    return term.EXIT_FOUND if found and not exit_zero else term.EXIT_OK


def _results(
    files: list[str | SourceError],
    options: Options,
    jobs: int,
    out: Console | term.PlainConsole,
    show: bool,
) -> list[FileResult]:
    """Every file's result, in order; a long run on a terminal counts them on a passing line."""
    checked = term.parallel_map(partial(check_file, options=options), files, jobs)
    with progress(checked, len(files), out, show=show, doing="Linting") as each:
        return list(each)


def _linted(paths: list[str], settings: config.Config | None) -> list[str | SourceError]:
    """The files a run lints: those named, and those the walk of the folders named finds that
    their settings' ``exclude``/``extend-exclude`` keeps (Ruff's way: a named file is linted)."""
    named = set(paths)
    return [
        found
        for found in iter_paths(paths, suffixes=(".py", ".ipynb"))
        if not isinstance(found, str) or found in named or not _excluded(found, settings)
    ]


def _excluded(path: str, settings: config.Config | None) -> bool:
    try:
        return config.for_file(path, settings).excludes(path)
    except (OSError, RuntimeError):  # a symbolic link loop: reading the file reports it
        return False


def _settings_of(
    path: str,
    settings: config.Config | None,
    select: tuple[str, ...] | None,
    ignore: tuple[str, ...],
    rules: list[type[Rule]],
) -> str:
    """``--show-settings``: where the settings of ``path`` come from and what they turn on."""
    chosen = config.for_file(path, settings)
    running = config.select_rules(rules, chosen, path, select, ignore)
    lines = [
        f"file: {path}",
        f"settings: {chosen.source or 'defaults (no [tool.accelify.lint] found)'}",
        f"exclude: {', '.join(chosen.exclude) or '-'}",
        f"rules ({len(running)} of {len(rules)}):",
        *(f"  {rule.code} {rule.name}" for rule in running),
    ]
    return "\n".join(lines) + "\n"


def _rule(
    code: Annotated[str | None, typer.Argument(metavar="[CODE]", show_default=False)] = None,
    every: Annotated[bool, typer.Option("--all", help="Every rule's documentation.")] = False,
) -> int:
    rules = all_rules()
    if every:
        chosen = rules
    elif code is None:  # the index: one line a rule, then `accel-lint rule CODE` for docs
        out = term.console()
        for rule in rules:
            default = "" if rule.enabled_by_default else "  (off by default)"
            out.print(f"{rule.code}  {rule.name}{default}", markup=False)
        return term.EXIT_OK
    else:
        chosen = [r for r in rules if code in (r.code, r.name)]
        if not chosen:
            return term.usage_error(
                f"{PROG} rule", f"unknown rule {code!r} (see `accel-lint rule`)"
            )
    out = term.console()
    for rule in chosen:
        default = "" if rule.enabled_by_default else ", off by default"
        out.print(f"# {rule.code} {rule.name} ({rule.severity.value}{default})\n", markup=False)
        out.print(rule.docs() + "\n", markup=False)
    return term.EXIT_OK


RULE_HELP = """Print a rule's documentation (CODE is a code like ACL101 or a name like
unwrapped-save); without one, list the rules."""


def run(argv: Sequence[str]) -> int:
    """Lint what ``argv`` names (``accel-lint rule ...``: the rules' docs); the exit status."""
    if argv and argv[0] == "rule":
        return term.run_command(_rule, argv[1:], f"{PROG} rule", help=RULE_HELP, completion=False)
    if argv and argv[0] == "check":  # `ruff check ...` habits
        argv = argv[1:]
    return term.run_command(_check, argv, PROG, help=HELP, epilog=EXAMPLES)


def main() -> None:
    """Console-script entry point."""
    term.exit_on_signals()
    sys.exit(run(sys.argv[1:]))
