"""accel-convert: the command line around :func:`accelify.transform.convert.convert`.

It decides where each converted source goes (standard output, ``-o OUT``, the file itself, a diff
or nowhere for ``--check``), writes atomically in the file's own encoding, and reports per file on
standard error with the exit codes CI gates on (0 done, 1 changes found by --check/--diff, 2 error).
A bad file is reported in one ``path:line: message`` line and never stops the other files.

The report is quiet by default, as Ruff's is: a line per file, every place that needs a human (with
its code and the page that explains it) and the totals; ``-v`` lists every change, ``-q`` drops the
per-file lines.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path, PurePath
from typing import Annotated, Literal

import typer

from accelify.transform import codes
from accelify.transform import console as term
from accelify.transform.convert import Result, convert
from accelify.transform.lines import LineMap
from accelify.transform.notebook import NotebookResult, convert_notebook
from accelify.transform.plan import MixedPrecision, Note, Options, Target
from accelify.transform.progress import progress
from accelify.transform.project import Converted, convert_program, programs
from accelify.transform.sources import (
    STDIN,
    Skipped,
    Source,
    SourceError,
    iter_paths,
    read,
    write_atomic,
)

PROG = "accel-convert"
Mode = Literal["print", "output", "inplace", "diff", "check"]
OutputFormat = Literal["text", "github"]
Level = Literal["quiet", "default", "verbose"]

HELP = f"""Rewrite plain PyTorch training scripts for an Accelerator.

Drops .to(device)/.cuda() calls, wraps model, optimizers, loaders and schedulers in
accelerator.prepare(...), swaps loss.backward() for accelerator.backward(loss), and turns native
AMP and manual gradient accumulation into Accelerator options. Code it cannot convert safely is
left alone and reported as "needs a human" with its line.

With one file and no mode, the converted source is printed (in the file's own encoding);
several files need --inplace, --diff or --check. Each PATH is a file or a folder (walked for
*.py files, skipping hidden folders and git-ignored files; --check and --diff also walk for
*.ipynb notebooks, which are rewritten only when named); - reads standard input. A notebook's code
cells are converted as one script and reported as path:cell N:line; one in another language (an
R or Julia kernel) is skipped with a note.

The report goes to standard error: a line per file (converted, left unchanged or nothing to
convert), every place that needs a human, and the totals. -v adds every change and every note on
code left as it is; -q keeps only the needs-a-human lines, errors and the totals. Each line has a
code with a page at {codes.DOCS_URL}reference/ (linked on a terminal, its URL
printed after a needs-a-human line in a pipe): ACC1xx-3xx a conversion step, ACR1xx-3xx why a file
or setup is left unchanged, ACLxxx the accel-lint rule that flags what is left to do.

Exit status: 0 done or nothing to change, 1 --check or --diff found changes, 2 an error
(errors win).
"""

EPILOG = """\
\b
Examples:
  accel-convert train.py > train_accel.py    print the converted script
  accel-convert train.py -o train_accel.py   write it to a new file
  accel-convert --diff scripts/              review the changes as a unified diff
  accel-convert --check scripts/             CI: exit 1 if anything would change
  accel-convert --check --strict scripts/    ... or if anything needs a human
  accel-convert --inplace -j 0 scripts/      rewrite in place on all cores
  accel-convert --target accelerate --mixed-precision bf16 - < train.py
"""

# Split after "\n" only: str.splitlines would also split at form feeds, which sources may hold.
_LINE = re.compile(r"[^\n]*\n|[^\n]+")
_DIFF_STYLES = (("+++", "bold"), ("---", "bold"), ("@@", "cyan"), ("+", "green"), ("-", "red"))


def _command(  # typer passes every parameter by name
    *,
    # The argument's help goes in HELP: click 8.5 drops typer's help for arguments.
    paths: Annotated[list[str], typer.Argument(metavar="PATH...", show_default=False)],
    inplace: Annotated[
        bool, typer.Option("--inplace", "-i", help="Rewrite the files (atomically).")
    ] = False,
    diff: Annotated[
        bool, typer.Option("--diff", help="Print a unified diff; write nothing.")
    ] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Only report; exit 1 if a file would change.")
    ] = False,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="With --check/--diff: exit 1 also for places to finish by hand, which otherwise "
            "pass (a script accel-convert leaves alone is not a change).",
        ),
    ] = False,
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", metavar="OUT", help="Write the one input's result to OUT."),
    ] = None,
    output_format: Annotated[
        OutputFormat,
        typer.Option(
            metavar="FORMAT",
            help="With --check: text, or github (an annotation per change and per place to "
            "finish by hand, on the pull request's diff).",
        ),
    ] = "text",
    stdin_filename: Annotated[
        str | None,
        typer.Option(metavar="PATH", help="The name standard input is reported under."),
    ] = None,
    target: Annotated[
        Target, typer.Option(help="accelify's Accelerator, or HF accelerate's.")
    ] = "accelify",
    mixed_precision: Annotated[
        MixedPrecision | None,
        typer.Option(help="Pass this precision to the Accelerator."),
    ] = None,
    gradient_accumulation_steps: Annotated[
        int | None, typer.Option(min=1, metavar="N", help="Accumulate gradients over N steps.")
    ] = None,
    notebook_launcher: Annotated[
        int | None,
        typer.Option(
            min=1,
            metavar="N",
            help="Notebooks: move the training into a function run on N processes by "
            "notebook_launcher.",
        ),
    ] = None,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs",
            "-j",
            min=0,
            metavar="N",
            show_default=False,
            help="Convert in N processes; 0 = all cores (default: 1).",
        ),
    ] = 1,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", "-v", help="Also list every change and every note, with its code."
        ),
    ] = False,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet",
            "-q",
            help="Only errors, needs-a-human lines and the totals (no line per file).",
        ),
    ] = False,
    color: term.ColorOption = "auto",
    version: term.VersionFlag = False,
) -> int:
    term.use_color(color)
    flags = {"--inplace": inplace, "--diff": diff, "--check": check, "-o": output is not None}
    try:
        mode = _mode(paths, [flag for flag, on in flags.items() if on], output)
    except ValueError as err:
        return term.usage_error(PROG, str(err))
    if output_format == "github" and mode != "check":
        return term.usage_error(PROG, "--output-format github goes with --check")
    options = Options(target, mixed_precision, gradient_accumulation_steps)
    if strict and mode not in ("check", "diff"):
        return term.usage_error(PROG, "--strict goes with --check or --diff")
    if quiet and verbose:
        return term.usage_error(PROG, "choose one of -q, -v")
    level: Level = "quiet" if quiet else "verbose" if verbose else "default"
    report = _Report(level=level, mode=mode, github=output_format == "github", strict=strict)
    names = list(iter_paths(paths, _walked_suffixes(mode)))
    # Each file is read where it is converted, so a run holds one file's text at a time, not
    # every file's (1,000 files: 28 MB more). Only a worker process cannot read standard input.
    items = [_load(path, stdin_filename) if path == STDIN else path for path in names]
    together = _together(names, options)
    convert_one = partial(_read_and_convert, options=options, launcher=notebook_launcher)
    alone = term.parallel_map(
        convert_one, [i for n, i in zip(names, items, strict=True) if n not in together], jobs
    )
    converted = (together[n] if n in together else next(alone) for n in names)
    # A progress line is for people, and not over a diff that another console writes to stdout.
    shown = not quiet and mode in ("check", "inplace") and output_format == "text"
    with progress(converted, len(names), report.err, show=shown, doing="Converting") as each:
        for path, (item, converted_or_error) in zip(names, each, strict=True):
            outcome = converted_or_error
            if isinstance(outcome, Skipped) and isinstance(item, Source):
                report.skipped(outcome)
                outcome = Result(item.text, original=item.text)  # goes through as it came
            elif isinstance(outcome, SourceError):
                report.error(outcome)
                continue
            try:
                written = _emit(mode, item, outcome, output, from_stdin=path == STDIN)
            except SourceError as err:
                report.error(err)
                continue
            skipped = isinstance(converted_or_error, Skipped)
            report.done(item.path, outcome, written, skipped=skipped)
    report.summary(total=len(names))
    return report.exit_code()


def _together(names: Sequence[str | SourceError], options: Options) -> dict[str, Converted]:
    """The files of programs split over several files, converted together (see project.py)."""
    files = [n for n in names if isinstance(n, str) and n != STDIN and n.endswith(".py")]
    together: dict[str, Converted] = {}
    for program in programs(files) if len(files) > 1 else ():
        for path, converted in convert_program(program, options).items():
            together.setdefault(path, converted)  # a file of two programs: both leave it
    return together


def run(argv: Sequence[str]) -> int:
    """Convert what ``argv`` names; the exit status."""
    return term.run_command(_command, argv, PROG, help=HELP, epilog=EPILOG)


def _mode(paths: list[str], chosen: list[str], output: str | None) -> Mode:
    """The one output mode asked for; refuse to guess where many files would share stdout."""
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


def _walked_suffixes(mode: Mode) -> tuple[str, ...]:
    """Folders give up their notebooks only to read-only modes: rewriting one leaves its outputs
    stale, which its author should choose by naming it."""
    return (".py", ".ipynb") if mode in ("check", "diff") else (".py",)


def _load(path: str | SourceError, stdin_filename: str | None) -> Source | SourceError:
    """The source, or its one-line error; standard input under ``--stdin-filename`` if given."""
    if isinstance(path, SourceError):  # a folder the walk could not list
        return path
    try:
        source = read(path)
    except SourceError as err:
        if path == STDIN and stdin_filename:
            return SourceError(stdin_filename, err.line, err.message)
        return err
    return replace(source, path=stdin_filename) if path == STDIN and stdin_filename else source


def _read_and_convert(
    item: str | Source | SourceError, options: Options, launcher: int | None
) -> tuple[Source | SourceError, Result | SourceError]:
    """The source (read here from a path) and its conversion, or their one-line error, returned
    so the other files go on. Module-level so worker processes can run it."""
    source = _load(item, None) if isinstance(item, str) else item
    if isinstance(source, SourceError):
        return source, source
    return source, _convert_one(source, options, launcher)


def _convert_one(source: Source, options: Options, launcher: int | None) -> Result | SourceError:
    try:
        if source.path.endswith(".ipynb"):
            return convert_notebook(source.text, options, source.path, launcher)
        if launcher is not None:
            return SourceError(source.path, 0, "--notebook-launcher is for notebooks (.ipynb)")
        return convert(source.text, options, path=source.path)
    except SourceError as err:
        return err


def _emit(
    mode: Mode, source: Source, result: Result, output: str | None, *, from_stdin: bool
) -> str | None:
    """Send one converted source where ``mode`` says (standard input always answers on stdout);
    the path written, if any."""
    if mode == "check":
        return None
    if mode == "diff":
        _print_diff(source.text, result.code, source.path)
    elif mode == "output" and output is not None:
        write_atomic(output, source.encode(result.code))
        return output
    elif mode == "inplace" and not from_stdin:
        if result.changed:
            write_atomic(source.path, source.encode(result.code))
            return source.path
    else:
        sys.stdout.flush()
        sys.stdout.buffer.write(source.encode(result.code))
        sys.stdout.buffer.flush()
    return None


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
        out.print(term.styled(out, (line.rstrip("\r\n"), style)))


def github_annotations(path: str, result: Result) -> Iterator[str]:
    """``--check --output-format github``: one warning per block of lines that would change (the
    change as -/+ lines, with the notes about it) and one per place that needs a human, each note
    with its code (and a needs-a-human one with its page).

    A notebook's changes are annotated on its JSON lines; its notes, whose lines are its cells',
    name the cell and sit on the file's first line."""
    notebook = isinstance(result, NotebookResult)
    for first, last, removed, added in LineMap(result.original, result.code).hunks():
        about = [
            _coded(n)
            for n in result.notes
            if not n.manual and first <= n.line <= last and not notebook
        ]
        change = [f"-{line}" for line in removed] + [f"+{line}" for line in added]
        yield term.github_annotation(
            "warning",
            "\n".join([*about, *change]),
            file=path,
            line=max(min(first, last), 1),
            endLine=max(last, first, 1),
            title="accel-convert would change this",
        )
    for note in result.notes:
        if note.manual:
            where = f"{_where(result, note.line, None)[0]}: " if notebook else ""
            yield term.github_annotation(
                "warning",
                where + _coded(note) + _see(note),
                file=path,
                line=1 if notebook else max(note.line, 1),
                title="accel-convert needs a human",
            )


def _coded(note: Note) -> str:
    """A note's message after its code."""
    return f"{note.shown} {note.message}" if note.shown else note.message


def _see(note: Note) -> str:
    """Where a needs-a-human note's page is, in plain text (a pipe, a CI log)."""
    return f" (see {codes.url(note.shown)})" if note.shown else ""


class _Report:
    """What goes to standard error, and the exit code it adds up to.

    By default a line per file, every needs-a-human line and the totals; ``verbose`` adds every
    change and info line, ``quiet`` drops the per-file lines. Line numbers are the input's, except
    after a write: then they are the written file's, so ``path:line`` opens the code the note is
    about (with the input's line where it moved).
    """

    def __init__(self, *, level: Level, mode: Mode, github: bool, strict: bool) -> None:
        self.level, self.mode, self.github, self.strict = level, mode, github, strict
        self.dry = mode in ("diff", "check")
        self.err = term.console(stderr=True)
        self.changed = self.manual = self.errors = self.skipped_files = 0

    def error(self, err: SourceError) -> None:
        self.errors += 1
        self.err.print(term.styled(self.err, (str(err), "red")))

    def skipped(self, note: Skipped) -> None:
        """A file left alone on purpose: a line (not under --quiet), no error."""
        self.skipped_files += 1
        if self.level != "quiet":
            self.err.print(term.styled(self.err, (str(note), "dim")))

    def done(self, path: str, result: Result, written: str | None, *, skipped: bool) -> None:
        """One file's lines; a skipped file already has its line."""
        self.changed += result.changed
        self.manual += len(result.manual)
        if self.github:
            sys.stdout.writelines(f"{line}\n" for line in github_annotations(path, result))
        if self.level != "quiet" and not skipped:
            self.err.print(term.styled(self.err, *self._file_line(path, result, written)))
        moved = LineMap(result.original, result.code) if written and result.notes else None
        for note in result.notes:
            if note.manual or self.level == "verbose":
                line, was = _where(result, note.line, moved, note.shows)
                where = (f"{written or path}:{line}: ", "bold")
                self.err.print(
                    term.styled(self.err, where, *self._note(note), was, *self._link(note))
                )

    def _file_line(
        self, path: str, result: Result, written: str | None
    ) -> list[str | tuple[str, str]]:
        """``path: converted, 18 changes``, ``left unchanged (needs a human)`` or ``nothing to
        convert``: what became of one file, in one line."""
        manual = len(result.manual)
        if result.changed:
            changes = sum(not (n.manual or n.info) for n in result.notes)
            what = [f"{'would be converted' if self.dry else 'converted'}, "]
            what.append(_plural(changes, "change"))
            parts: list[str | tuple[str, str]] = ["".join(what)]
            if manual:
                parts.append((f", {_plural(manual, 'place')} to finish by hand", "yellow"))
            if written and written != path:
                parts.append(f" (written to {written})")
        elif manual:
            parts = [("left unchanged (needs a human)", "yellow")]
        else:
            parts = ["nothing to convert"]
        return [(f"{path}: ", "bold"), *parts]

    def _note(self, note: Note) -> list[str | tuple[str, str]]:
        """The code (a link to its page on a terminal) and the message."""
        tag = ("needs a human: ", "yellow") if note.manual else ""
        if note.shown is None:
            return [tag, note.message]
        style = "yellow" if note.manual else "cyan"
        if self.err.is_terminal:
            style = f"{style} link {codes.url(note.shown)}"
        return [(note.shown, style), " ", tag, note.message]

    def _link(self, note: Note) -> list[str]:
        """A needs-a-human line's page, in plain text where no terminal shows links; change lines
        stay short."""
        return [_see(note)] if note.manual and not self.err.is_terminal else []

    def summary(self, total: int) -> None:
        counts = self._counts(total) if total else ["no Python files found"]
        self.err.print(term.styled(self.err, *counts))
        if self.mode == "print" and total and sys.stdout.isatty():
            self.err.print(
                "Nothing was written: redirect the output (> new.py), or write with -o OUT "
                "or --inplace.",
                style="bold",
            )

    def _counts(self, total: int) -> list[str | tuple[str, str]]:
        verb = "would be converted" if self.dry else "converted"
        unchanged = total - self.changed - self.errors - self.skipped_files
        parts: list[str | tuple[str, str]] = [
            f"{_plural(self.changed, 'file')} {verb}",
            f", {unchanged} unchanged",
        ]
        if self.skipped_files:
            parts.append(f", {self.skipped_files} skipped")
        if self.manual:
            parts.append((f", {_plural(self.manual, 'place')} to finish by hand", "yellow"))
        if self.errors:
            parts.append((f", {_plural(self.errors, 'error')}", "red"))
        return parts

    def exit_code(self) -> int:
        if self.errors:
            return term.EXIT_ERROR
        found = self.changed or (self.strict and self.manual)
        return term.EXIT_FOUND if self.dry and found else term.EXIT_OK


def _where(
    result: Result, line: int, moved: LineMap | None, shows: str | None = None
) -> tuple[str, str]:
    """A note's ``line`` (``cell N:line`` in a notebook), moved into the written file when
    ``moved`` is given, and where it was if it moved; a line the change wrote (``shows``) is
    where it is, and was nowhere."""
    if isinstance(result, NotebookResult):
        cell, at = result.place(line)
        new_cell, new_at = result.place(line, written=moved is not None)
        was = f" (was cell {cell}:{at})" if (new_cell, new_at) != (cell, at) else ""
        return f"cell {new_cell}:{new_at}", was
    if moved is None:
        return str(line), ""
    written = moved.written_line(line, shows) if shows else None
    if written is not None:
        return str(written), ""
    new = moved.new_line(line)
    return str(new), f" (was line {line})" if new != line else ""


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def main() -> None:
    """Console-script entry point."""
    term.exit_on_signals()
    sys.exit(run(sys.argv[1:]))
