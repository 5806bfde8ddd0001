"""accel-convert: the command line around :func:`accelify.transform.convert.convert`.

It decides where each converted source goes (standard output, ``-o OUT``, the file itself, a diff
or nowhere for ``--check``), writes atomically in the file's own encoding, and reports per file on
standard error with the exit codes CI gates on (0 done, 1 changes found by --check/--diff, 2 error).
A bad file is reported in one ``path:line: message`` line and never stops the other files.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path, PurePath
from typing import Literal, get_args

from rich.text import Text

from accelify.transform import console as term
from accelify.transform.convert import Result, convert
from accelify.transform.plan import MixedPrecision, Options, Target
from accelify.transform.sources import (
    STDIN,
    STDIN_NAME,
    Source,
    SourceError,
    iter_paths,
    read,
    write_atomic,
)

Mode = Literal["print", "output", "inplace", "diff", "check"]

HELP = """Rewrite plain PyTorch training scripts for an Accelerator.

Drops .to(device)/.cuda() calls, wraps model, optimizers, loaders and schedulers in
accelerator.prepare(...), swaps loss.backward() for accelerator.backward(loss), and turns native
AMP and manual gradient accumulation into Accelerator options. Code it cannot convert safely is
left alone and reported as "needs a human" with its line.

With one file and no mode, the converted source is printed (in the file's own encoding);
several files need --inplace, --diff or --check. Folders are walked for *.py files, skipping
hidden folders and git-ignored files. Exit status: 0 done or nothing to change, 1 --check or
--diff found changes, 2 an error (errors win).
"""

EPILOG = """\
Examples:
  accel-convert train.py > train_accel.py    print the converted script
  accel-convert train.py -o train_accel.py   write it to a new file
  accel-convert --diff scripts/              review the changes as a unified diff
  accel-convert --check scripts/             CI: exit 1 if anything would change
  accel-convert --inplace -j 0 scripts/      rewrite in place on all cores
  accel-convert --target accelerate --mixed-precision bf16 - < train.py
"""

# Split after "\n" only: str.splitlines would also split at form feeds, which sources may hold.
_LINE = re.compile(r"[^\n]*\n|[^\n]+")
_DIFF_STYLES = (("+++", "bold"), ("---", "bold"), ("@@", "cyan"), ("+", "green"), ("-", "red"))


def _at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is not >= {low}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    """argparse, not typer: building typer's click command costs ~80 ms of every start-up."""
    parser = argparse.ArgumentParser(
        prog="accel-convert",
        description=HELP,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("paths", nargs="+", metavar="PATH", help="Files or folders; - reads standard input.")
    add("--inplace", "-i", action="store_true", help="Rewrite the files (atomically).")
    add("--diff", action="store_true", help="Print a unified diff; write nothing.")
    add("--check", action="store_true", help="Only report; exit 1 if a file would change.")
    add("--output", "-o", metavar="OUT", help="Write the one input's result to OUT.")
    add(
        "--target",
        choices=get_args(Target),
        default="accelify",
        help="accelify's Accelerator, or HF accelerate's (default: accelify).",
    )
    add(
        "--mixed-precision",
        choices=get_args(MixedPrecision),
        help="Pass this precision to the Accelerator.",
    )
    add(
        "--gradient-accumulation-steps",
        type=_at_least(1),
        metavar="N",
        help="Accumulate gradients over N steps.",
    )
    add(
        "--jobs",
        "-j",
        type=_at_least(0),
        default=1,
        metavar="N",
        help="Convert in N processes; 0 = all cores (default: 1).",
    )
    add(
        "--quiet",
        "-q",
        action="store_true",
        help="Hide change lines and the summary (errors and needs-a-human stay).",
    )
    add("--version", action=term.VersionAction, help="Print the version and exit.")
    return parser


def run(argv: Sequence[str]) -> int:
    """Convert what ``argv`` names; the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        mode = _mode(args)
    except ValueError as err:
        parser.error(str(err))
    options = Options(args.target, args.mixed_precision, args.gradient_accumulation_steps)
    report = _Report(quiet=args.quiet, dry=mode in ("diff", "check"))
    loaded = [_load(path) for path in iter_paths(args.paths)]
    sources = [item for item in loaded if isinstance(item, Source)]
    results = term.parallel_map(partial(_convert_one, options=options), sources, args.jobs)
    for item in loaded:
        outcome = item if isinstance(item, SourceError) else next(results)
        if isinstance(outcome, SourceError):
            report.error(outcome)
            continue
        try:
            _emit(mode, item, outcome, args.output)
        except SourceError as err:
            report.error(err)
            continue
        report.done(item.path, outcome)
    report.summary(total=len(loaded))
    return report.exit_code()


def _mode(args: argparse.Namespace) -> Mode:
    """The one output mode asked for; refuse to guess where many files would share stdout."""
    paths, output = args.paths, args.output
    flags = {"--inplace": args.inplace, "--diff": args.diff, "--check": args.check}
    flags["-o"] = output is not None
    chosen = [flag for flag, on in flags.items() if on]
    if len(chosen) > 1:
        raise ValueError(f"choose one of {', '.join(chosen)}")
    one_file = len(paths) == 1 and (paths[0] == STDIN or not Path(paths[0]).is_dir())
    if output is not None and not one_file:
        raise ValueError("-o takes exactly one input file")
    if not chosen and not one_file:
        raise ValueError(
            "several files and no mode: use --inplace, --diff or --check (or -o OUT for one file)"
        )
    modes: dict[str, Mode] = {"--inplace": "inplace", "--diff": "diff", "--check": "check"}
    return modes.get(chosen[0], "output") if chosen else "print"


def _load(path: str) -> Source | SourceError:
    try:
        return read(path)
    except SourceError as err:
        return err


def _convert_one(source: Source, options: Options) -> Result | SourceError:
    """Module-level so worker processes can run it; the error is returned so the others go on."""
    try:
        return convert(source.text, options, path=source.path)
    except SourceError as err:
        return err


def _emit(mode: Mode, source: Source, result: Result, output: str | None) -> None:
    """Send one converted source where ``mode`` says; standard input always answers on stdout."""
    if mode == "check":
        return
    if mode == "diff":
        _print_diff(source.text, result.code, source.path)
    elif mode == "output" and output is not None:
        write_atomic(output, source.encode(result.code))
    elif mode == "inplace" and source.path != STDIN_NAME:
        if result.changed:
            write_atomic(source.path, source.encode(result.code))
    else:
        sys.stdout.flush()
        sys.stdout.buffer.write(source.encode(result.code))
        sys.stdout.buffer.flush()


def unified_diff(before: str, after: str, path: str) -> Iterator[str]:
    """git-style ``a/``/``b/`` diff lines, each ending in a newline."""
    name = PurePath(path).as_posix().lstrip("/")
    lines = difflib.unified_diff(
        _LINE.findall(before), _LINE.findall(after), f"a/{name}", f"b/{name}"
    )
    for line in lines:
        yield line if line.endswith("\n") else f"{line}\n\\ No newline at end of file\n"


def _print_diff(before: str, after: str, path: str) -> None:
    """Coloured on a terminal; byte-faithful text in a pipe, so the diff applies with patch."""
    out = term.console()
    for line in unified_diff(before, after, path):
        if not out.is_terminal:
            sys.stdout.write(line)
            continue
        style = next((s for prefix, s in _DIFF_STYLES if line.startswith(prefix)), "")
        out.print(Text(line.rstrip("\r\n"), style=style))


class _Report:
    """The per-file lines and the summary on standard error, and the exit code they add up to."""

    def __init__(self, *, quiet: bool, dry: bool) -> None:
        self.quiet, self.dry = quiet, dry
        self.err = term.console(stderr=True)
        self.changed = self.manual = self.errors = 0

    def error(self, err: SourceError) -> None:
        self.errors += 1
        self.err.print(Text(str(err), style="red"))

    def done(self, path: str, result: Result) -> None:
        self.changed += result.changed
        for note in result.notes:
            self.manual += note.manual
            if note.manual or not self.quiet:
                tag = ("needs a human: ", "yellow") if note.manual else ""
                self.err.print(Text.assemble((f"{path}:{note.line}: ", "bold"), tag, note.message))

    def summary(self, total: int) -> None:
        if self.quiet:
            return
        verb = "would be converted" if self.dry else "converted"
        unchanged = total - self.changed - self.errors
        parts = [f"{_plural(self.changed, 'file')} {verb}", f"{unchanged} unchanged"]
        if self.manual:
            parts.append(f"{_plural(self.manual, 'place')} to finish by hand")
        if self.errors:
            parts.append(_plural(self.errors, "error"))
        self.err.print(", ".join(parts) if total else "no Python files found", style="dim")

    def exit_code(self) -> int:
        if self.errors:
            return term.EXIT_ERROR
        return term.EXIT_FOUND if self.dry and self.changed else term.EXIT_OK


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def main() -> None:
    """Console-script entry point."""
    term.exit_on_signals()
    sys.exit(run(sys.argv[1:]))
