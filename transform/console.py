"""Terminal conventions shared by accel-convert and accel-lint.

Rich styling on a terminal, plain text in a pipe (without loading rich), never wrapped lines, one
place that knows the exit codes CI gates on, how a usage mistake is reported (one line, exit 2,
as Ruff does), the options both commands share, GitHub's annotation syntax, and how ``--jobs``
spreads files over processes.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Annotated, Literal, TextIO, TypeVar

import click
import typer

if TYPE_CHECKING:
    from rich.console import Console

_In = TypeVar("_In")
_Out = TypeVar("_Out")

EXIT_OK = 0
EXIT_FOUND = 1  # --check/--diff found changes; the linter found problems
EXIT_ERROR = 2  # bad input or usage

Color = Literal["auto", "always", "never"]
_color: Color = "auto"


def use_color(when: Color) -> None:
    """``--color``: what :func:`console` does for the rest of this run."""
    global _color  # noqa: PLW0603 - one run, one setting; every console of the run reads it
    _color = when


class PlainConsole:
    """What rich's console writes where it sees no terminal (a pipe, a file, a CI log): each
    printed line as is, flushed. Start-up pays for rich (~45 ms) only when it styles something."""

    is_terminal = False

    def __init__(self, file: TextIO | None = None, *, stderr: bool = False) -> None:
        self._file, self._stderr = file, stderr

    @property
    def file(self) -> TextIO:
        """The stream when written to, as rich's: pytest and redirections swap ``sys.stdout``."""
        if self._file is not None:
            return self._file
        return sys.stderr if self._stderr else sys.stdout

    def print(self, *objects: object, markup: bool | None = None, style: str | None = None) -> None:
        """rich's ``print`` for plain text: ``markup`` and ``style`` only matter on a terminal,
        so callers pass rich ``Text`` or ``markup=False``, never markup they rely on."""
        self.file.write(" ".join(map(str, objects)) + "\n")
        self.file.flush()


def console(stderr: bool = False) -> Console | PlainConsole:
    """A console that styles only on a terminal and never wraps (paths must stay greppable).

    ``--color never`` or ``NO_COLOR`` (any value, no-color.org) turns every escape off, bold and
    dim included; ``--color always`` or ``FORCE_COLOR`` styles a pipe too. The option wins over
    the variables, as in Ruff."""
    if not _is_terminal(stderr):
        return PlainConsole(stderr=stderr)
    from rich.console import Console

    if _color == "never" or (_color == "auto" and os.environ.get("NO_COLOR")):
        style: dict[str, object] = {"color_system": None}
    else:
        style = {"force_terminal": True} if _color == "always" else {}
    return Console(stderr=stderr, soft_wrap=True, highlight=False, **style)  # type: ignore[arg-type]


def _is_terminal(stderr: bool) -> bool:
    """Whether rich would treat the stream as a terminal (``Console.is_terminal``): forced by
    ``--color always``, ``TTY_COMPATIBLE=0/1`` or a non-empty ``FORCE_COLOR``, else ``isatty``."""
    if _color == "always":
        return True
    compatible = os.environ.get("TTY_COMPATIBLE", "")
    if compatible in ("0", "1"):
        return compatible == "1"
    force = os.environ.get("FORCE_COLOR")
    if force is not None:
        return force != ""
    try:
        return (sys.stderr if stderr else sys.stdout).isatty()
    except ValueError:  # a closed stream
        return False


def styled(out: Console | PlainConsole, *parts: str | tuple[str, str]) -> object:
    """``parts`` (text, or text and a rich style) as one printable for ``out``: plain text, or
    a rich ``Text`` on a terminal."""
    if not out.is_terminal:
        return "".join(part if isinstance(part, str) else part[0] for part in parts)
    from rich.text import Text

    return Text.assemble(*parts)


def _print_version(ctx: typer.Context, value: bool) -> None:
    if value:
        print(f"{ctx.find_root().info_name} {package_version()}")
        raise typer.Exit(EXIT_OK)


VersionFlag = Annotated[
    bool,
    typer.Option(
        "--version", help="Print the version and exit.", callback=_print_version, is_eager=True
    ),
]
ColorOption = Annotated[
    Color,
    typer.Option(
        "--color",
        metavar="WHEN",
        help="auto (style a terminal only; NO_COLOR and FORCE_COLOR are obeyed), always, never.",
    ),
]


def run_command(
    command: Callable[..., int],
    argv: Sequence[str],
    prog: str,
    *,
    help: str,
    epilog: str | None = None,
    completion: bool = True,
) -> int:
    """Parse ``argv`` for ``command`` with typer and run it; the exit status.

    typer brings ``--install-completion``/``--show-completion`` and the help. A usage mistake is
    one ``prog: error: ...`` line and exit 2 (typer's own report is the usage text, a blank line
    and the error); Ctrl-C exits 130 once the run has unwound (files being written left whole).
    """
    app = typer.Typer(
        add_completion=completion,
        rich_markup_mode=None,  # plain help: rich's panels re-flow the examples
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.command(help=help, epilog=epilog)(command)
    try:
        code = typer.main.get_command(app).main(list(argv), prog_name=prog, standalone_mode=False)
    except click.ClickException as err:
        return usage_error(prog, err.format_message())
    except SystemExit as exit:  # typer's completion options and SIGTERM end by sys.exit
        return EXIT_OK if exit.code is None else exit.code if isinstance(exit.code, int) else 1
    return code if isinstance(code, int) else EXIT_OK


def usage_error(prog: str, message: str) -> int:
    """Report a mistake in the command line itself (no file to name), Ruff-style; exit 2."""
    console(stderr=True).print(f"{prog}: error: {' '.join(message.split())}", markup=False)
    return EXIT_ERROR


def github_annotation(level: str, message: str, **where: object) -> str:
    """One GitHub Actions workflow command, ``::warning file=..,line=..::message``: the runner
    turns it into an annotation on that line of the pull request's diff."""
    props = ",".join(f"{key}={_escape(str(value), prop=True)}" for key, value in where.items())
    return f"::{level} {props}::{_escape(message)}"


def _escape(value: str, prop: bool = False) -> str:
    """Workflow-command escaping (properties also escape ``:`` and ``,``)."""
    value = value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return value.replace(":", "%3A").replace(",", "%2C") if prop else value


def package_version() -> str:
    """Only ``--version`` and SARIF ask, so the metadata machinery (~25 ms) is not loaded at
    start-up."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("accelify")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


def exit_on_signals() -> None:
    """SIGTERM (a CI cancel, ``timeout``) ends a run the way Ctrl-C does, by unwinding: a file
    being rewritten is left whole and its temporary file goes (forked workers inherit this)."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def parallel_map(work: Callable[[_In], _Out], items: Sequence[_In], jobs: int) -> Iterator[_Out]:
    """``map(work, items)`` in input order, over up to ``jobs`` processes (0: one per CPU).

    ``work`` must be picklable (a module-level function or a ``partial`` of one).
    """
    jobs = jobs or os.cpu_count() or 1
    if jobs <= 1 or len(items) < 2:
        yield from map(work, items)
        return
    from concurrent.futures import ProcessPoolExecutor  # 15 ms of start-up most runs never use

    workers = min(jobs, len(items))
    with ProcessPoolExecutor(workers, initializer=_end_with, initargs=(os.getpid(),)) as pool:
        yield from pool.map(partial(_in_worker, work), items, chunksize=4)


def _end_with(run: int) -> None:
    """A worker ends with the run that started it, even one killed by SIGKILL (which never
    stops its pool): left alone it would wait forever for work, holding the caller's pipes.

    Linux's ``PR_SET_PDEATHSIG`` sends it SIGTERM, which unwinds the item under way like Ctrl-C
    (a file being rewritten stays whole and its temporary file goes), and then it leaves: the
    pool would catch the SystemExit as the item's result and wait for the next item on a queue
    the other workers keep open. A worker a fork server started (not the run) is left as it is;
    a run gone between the fork and the call is caught by the second parent check.
    """
    if not sys.platform.startswith("linux") or os.getppid() != run:
        return
    import ctypes

    signal.signal(signal.SIGTERM, _end_worker)
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != run:
        sys.exit(128 + signal.SIGTERM)


def _end_worker(signum: int, _frame: object) -> None:
    _ending.append(signum)
    sys.exit(128 + signum)


def _in_worker(work: Callable[[_In], _Out], item: _In) -> _Out:
    """``work(item)``; then, if the run ended meanwhile, leave (see :func:`_end_with`)."""
    try:
        return work(item)
    finally:
        if _ending:
            os._exit(128 + _ending[0])


_ending: list[int] = []  # the signal that ended the run, in a worker told of it
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
