"""The command-line conventions accel-convert, accel-lint and accel-run share with Ruff and
``accelerate launch``, checked on the installed console scripts as a user meets them: help that
teaches, ``--version``, a misspelt option answered in one line with the right one, exit codes CI
can gate on, colour only where it is wanted, config mistakes placed at their line, and a progress
line only for a person watching a long run. One list of cases per convention, one row per tool.
"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent  # the virtual environment's console scripts
# Styles and cursor moves (CSI), and links (OSC 8): what a terminal acts on and a log shows raw.
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)")
PROGRESS = re.compile(r"\d+/\d+ files")  # the count on the transient progress line
ERASE_LINE = "\x1b[2K"
# Variables that decide styling, cleared so each case sets only its own.
COLOR_VARIABLES = ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE")

CLEAN = "x = 1\n"
PLAIN = """\
import torch
model = torch.nn.Linear(2, 2).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in range(3):
    loss = model(x).sum()
    loss.backward()
    opt.step()
"""  # accel-convert changes it and leaves a place to finish by hand
BUGGY = """\
import torch
from accelerate import Accelerator
accelerator = Accelerator()
model, opt = accelerator.prepare(model, opt)
loss.backward()
out = model.generate(x)
"""  # accel-lint finds two problems in it
FILES = {"clean.py": CLEAN, "plain.py": PLAIN, "buggy.py": BUGGY, "ok.py": "print('ok')\n"}


@dataclass(frozen=True)
class Cli:
    name: str
    options: tuple[str, ...]  # what --help must list
    exit_codes: str  # the exit-status paragraph of --help, as a regex on its flattened text
    misspelt: str  # an option one letter off...
    meant: str  # ...and the option to offer
    styled: tuple[str, ...]  # a run whose report rich styles on a terminal...
    shows: str  # ...and a piece of that report
    color_option: bool  # --color WHEN


CONVERT = Cli(
    "accel-convert",
    ("--inplace", "--diff", "--check", "--quiet", "--color", "--version"),
    r"exit status: 0 [^.]*, 1 [^.]*, 2 ",
    "--inplcae",
    "--inplace",
    ("--check", "plain.py"),
    "needs a human",
    color_option=True,
)
LINT = Cli(
    "accel-lint",
    ("--select", "--fix", "--output-format", "--quiet", "--color", "--version"),
    r"exit status: 0 [^.]*, 1 [^.]*, 2 ",
    "--selct",
    "--select",
    ("buggy.py",),
    "ACL201",
    color_option=True,
)
RUN = Cli(
    "accel-run",
    ("--num-processes", "--config-file", "--mixed-precision", "--quiet", "--version"),
    r"exit codes: 0 [^.]*; 2 a usage or config error",
    "--num-proceses",
    "--num-processes",
    ("missing.py",),
    "missing.py:0: no such script",
    color_option=False,
)
CLIS = [pytest.param(cli, id=cli.name) for cli in (CONVERT, LINT, RUN)]


@dataclass
class Ran:
    code: int
    out: str
    err: str  # empty on a terminal, where both streams arrive together in ``out``


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A folder with a file for each kind of run, and an accelerate config home of its own."""
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def environment(work: Path, **variables: str) -> dict[str, str]:
    """This environment without colour settings, a terminal type rich styles, and ``variables``."""
    env = {k: v for k, v in os.environ.items() if k not in COLOR_VARIABLES}
    return env | {"TERM": "xterm-256color", "HF_HOME": str(work / "hf_home")} | variables


def in_a_pipe(argv: list[str], work: Path, answers: str = "", **variables: str) -> Ran:
    """Standard input, output and error in pipes; ``answers`` are typed on standard input."""
    done = subprocess.run(
        argv,
        check=False,
        cwd=work,
        env=environment(work, **variables),
        input=answers,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return Ran(done.returncode, done.stdout, done.stderr)


def on_a_terminal(argv: list[str], work: Path, **variables: str) -> Ran:
    """Both streams on a pseudo-terminal, as at a person's shell; what the terminal received."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        argv,
        cwd=work,
        env=environment(work, **variables),
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    received = bytearray()
    deadline = time.monotonic() + 120
    try:
        while select.select([leader], [], [], max(0.0, deadline - time.monotonic()))[0]:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                break
            if not chunk:
                break
            received += chunk
        return Ran(process.wait(timeout=10), received.decode(errors="replace"), "")
    finally:
        process.kill()  # a run that hangs ends with its test (nothing to do once it exited)
        os.close(leader)


def tool(cli: Cli, *args: str) -> list[str]:
    return [str(BIN / cli.name), *args]


def no_traceback(ran: Ran) -> None:
    assert "Traceback" not in ran.out + ran.err


# --- help and version ----------------------------------------------------------------------------


@pytest.mark.parametrize("cli", CLIS)
def test_help_teaches(cli: Cli, work: Path) -> None:
    ran = in_a_pipe(tool(cli, "--help"), work)
    assert (ran.code, ran.err) == (0, "")
    assert re.match(rf"usage: {cli.name} ", ran.out, re.IGNORECASE)
    listed = set(re.findall(r"(?<![\w-])--?[a-z][\w-]*", ran.out))
    assert set(cli.options) <= listed
    flat = " ".join(ran.out.split()).lower()
    assert "examples:" in flat
    assert re.search(cli.exit_codes, flat), "no exit-status paragraph"


@pytest.mark.parametrize("cli", CLIS)
def test_short_help_is_help(cli: Cli, work: Path) -> None:
    assert in_a_pipe(tool(cli, "-h"), work) == in_a_pipe(tool(cli, "--help"), work)


@pytest.mark.parametrize(
    ("cli", "command", "option"),
    [
        pytest.param(RUN, "test", "--num-processes", id="accel-run test"),
        pytest.param(RUN, "config", "--default", id="accel-run config"),
        pytest.param(RUN, "env", "--config-file", id="accel-run env"),
        pytest.param(LINT, "rule", "--all", id="accel-lint rule"),
    ],
)
def test_each_subcommand_has_its_own_help(cli: Cli, command: str, option: str, work: Path) -> None:
    ran = in_a_pipe(tool(cli, command, "--help"), work)
    assert (ran.code, ran.err) == (0, "")
    assert re.match(rf"usage: {cli.name} {command}\b", ran.out, re.IGNORECASE)
    assert option in ran.out
    assert ran.out != in_a_pipe(tool(cli, "--help"), work).out


@pytest.mark.parametrize("cli", CLIS)
def test_version_is_the_package_metadata(cli: Cli, work: Path) -> None:
    ran = in_a_pipe(tool(cli, "--version"), work)
    assert (ran.code, ran.out, ran.err) == (0, f"{cli.name} {version('accelify')}\n", "")


# --- usage mistakes and exit codes ---------------------------------------------------------------


@pytest.mark.parametrize("cli", CLIS)
def test_a_misspelt_option_is_one_line_offering_the_right_one(cli: Cli, work: Path) -> None:
    ran = in_a_pipe(tool(cli, cli.misspelt, "clean.py"), work)
    assert ran.code == 2
    no_traceback(ran)
    [line] = ran.err.splitlines()
    assert line.startswith(f"{cli.name}: error: ")
    assert cli.misspelt in line
    assert re.search(rf"did you mean\b.*{cli.meant}\b", line, re.IGNORECASE)


@pytest.mark.parametrize(
    ("cli", "args", "code"),
    [
        pytest.param(CONVERT, ("--check", "clean.py"), 0, id="accel-convert clean"),
        pytest.param(CONVERT, ("--check", "plain.py"), 1, id="accel-convert changes"),
        pytest.param(CONVERT, ("--check", "missing.py"), 2, id="accel-convert missing"),
        pytest.param(CONVERT, ("--check", "plain.py", "missing.py"), 2, id="accel-convert both"),
        pytest.param(LINT, ("clean.py",), 0, id="accel-lint clean"),
        pytest.param(LINT, ("buggy.py",), 1, id="accel-lint findings"),
        pytest.param(LINT, ("missing.py",), 2, id="accel-lint missing"),
        pytest.param(LINT, ("buggy.py", "missing.py"), 2, id="accel-lint both"),
        # A launch has no findings of its own: it exits with its first failing worker's code.
        pytest.param(RUN, ("ok.py",), 0, id="accel-run clean"),
        pytest.param(RUN, ("missing.py",), 2, id="accel-run missing"),
    ],
)
def test_exit_codes_and_errors_win(cli: Cli, args: tuple[str, ...], code: int, work: Path) -> None:
    ran = in_a_pipe(tool(cli, *args), work)
    assert ran.code == code, ran.err
    no_traceback(ran)
    if "missing.py" in args:
        assert re.search(r"(^|\s)missing\.py:0: ", ran.err, re.MULTILINE), "names the file"


# --- colour --------------------------------------------------------------------------------------


@pytest.mark.parametrize("cli", CLIS)
def test_plain_in_a_pipe(cli: Cli, work: Path) -> None:
    ran = in_a_pipe(tool(cli, *cli.styled), work)
    assert cli.shows in ran.out + ran.err
    assert "\x1b" not in ran.out + ran.err


@pytest.mark.parametrize("cli", CLIS)
def test_force_color_styles_a_pipe(cli: Cli, work: Path) -> None:
    ran = in_a_pipe(tool(cli, *cli.styled), work, FORCE_COLOR="1")
    assert ANSI.search(ran.out + ran.err)


@pytest.mark.parametrize("cli", CLIS)
def test_no_color_wins_over_force_color(cli: Cli, work: Path) -> None:
    ran = in_a_pipe(tool(cli, *cli.styled), work, FORCE_COLOR="1", NO_COLOR="1")
    assert cli.shows in ran.out + ran.err
    assert "\x1b" not in ran.out + ran.err


@pytest.mark.parametrize("cli", CLIS)
def test_color_never_wins_over_force_color(cli: Cli, work: Path) -> None:
    if not cli.color_option:
        pytest.skip(f"{cli.name} has no --color, as accelerate launch has none: NO_COLOR rules")
    ran = in_a_pipe(tool(cli, "--color", "never", *cli.styled), work, FORCE_COLOR="1")
    assert cli.shows in ran.out + ran.err
    assert "\x1b" not in ran.out + ran.err


@pytest.mark.parametrize("cli", CLIS)
def test_no_color_on_a_terminal(cli: Cli, work: Path) -> None:
    assert ANSI.search(on_a_terminal(tool(cli, *cli.styled), work).out), "a terminal is styled"
    ran = on_a_terminal(tool(cli, *cli.styled), work, NO_COLOR="1")
    assert cli.shows in ran.out
    assert "\x1b" not in ran.out


def test_no_color_wins_in_accel_run_config_questions(work: Path) -> None:
    asked = tool(RUN, "config", "--config-file", "asked.yaml", "--force")
    styled = in_a_pipe(asked, work, answers="y\n1\nno\n", FORCE_COLOR="1")
    assert styled.code == 0 and ANSI.search(styled.out)
    plain = in_a_pipe(asked, work, answers="y\n1\nno\n", FORCE_COLOR="1", NO_COLOR="1")
    assert plain.code == 0 and "Mixed precision? [no/fp16/bf16] (no)" in plain.out
    assert "\x1b" not in plain.out + plain.err


# --- config files --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mistake:
    file: str  # a config file holding...
    text: str  # ...this
    args: tuple[str, ...]  # a run that reads it
    line: int  # the line of the mistake
    says: str  # what the report says about it


@pytest.mark.parametrize(
    ("cli", "mistake"),
    [
        pytest.param(
            LINT,
            Mistake(
                "pyproject.toml",
                '[tool.accelify.lint]\nselect = ["ACL"]\n\nextend-selet = ["ACL301"]\n',
                ("buggy.py",),
                4,
                "unknown [tool.accelify.lint] key 'extend-selet' (did you mean 'extend-select'?)",
            ),
            id="accel-lint misspelt key",
        ),
        pytest.param(
            LINT,
            Mistake(
                "pyproject.toml",
                '[project]\nname = "x"\n\n[tool.accel-lint]\nextend-select = ["ACL301"]\n',
                ("buggy.py",),
                4,
                "unknown table [tool.accel-lint] (did you mean [tool.accelify.lint]?)",
            ),
            id="accel-lint table named after the command",
        ),
        pytest.param(
            CONVERT,
            None,
            marks=pytest.mark.skip(reason="accel-convert reads no config file: all is flags"),
            id="accel-convert",
        ),
        pytest.param(
            RUN,
            Mistake(
                "run.yaml",
                "num_processes: 1\nnum_procesess: 2\n",
                ("--config-file", "run.yaml", "ok.py"),
                2,
                "num_procesess: unknown key (did you mean num_processes?)",
            ),
            id="accel-run misspelt key",
        ),
        pytest.param(
            RUN,
            Mistake(
                "run.yaml",
                "num_processes: 1\n  mixed_precision: [\n",
                ("--config-file", "run.yaml", "ok.py"),
                2,
                "not valid YAML",
            ),
            id="accel-run malformed YAML",
        ),
    ],
)
def test_a_config_mistake_is_one_line_at_its_line(cli: Cli, mistake: Mistake, work: Path) -> None:
    (work / mistake.file).write_text(mistake.text)
    ran = in_a_pipe(tool(cli, *mistake.args), work)
    assert (ran.code, ran.out) == (2, "")
    no_traceback(ran)
    [line] = ran.err.splitlines()
    where = rf"(^|\W){re.escape(mistake.file)}:{mistake.line}: "
    assert re.search(where, line), "names the file and the line"
    assert mistake.says in line


# --- progress ------------------------------------------------------------------------------------

# The console-script entry with the progress line drawn from the first file: the runs here are
# too quick to reach SHOW_AFTER_S, which keeps short runs from flashing a line.
AT_ONCE = (
    "import accelify.transform.progress as p; p.SHOW_AFTER_S = 0\n"
    "from accelify.transform.startup import {0}; {0}()"
)
ENTRIES = {CONVERT.name: "convert", LINT.name: "lint"}
# The arguments that check a folder, and a report's machine-read format.
CHECKS = {CONVERT.name: ("--check",), LINT.name: ()}
MACHINE = {CONVERT.name: ("--output-format", "github"), LINT.name: ("--output-format", "json")}
SUMMARY = {CONVERT.name: "would be converted", LINT.name: "Found 50 problems"}
PROGRESS_CLIS = [CONVERT, LINT]


def many(cli: Cli, work: Path, count: int, *args: str) -> list[str]:
    """The command line that checks ``count`` files, each with something to report."""
    folder = work / f"many{count}"
    folder.mkdir()
    for number in range(count):
        (folder / f"train{number}.py").write_text(PLAIN if cli is CONVERT else BUGGY)
    at_once = AT_ONCE.format(ENTRIES[cli.name])
    return [sys.executable, "-c", at_once, *CHECKS[cli.name], *args, folder.name]


@pytest.mark.parametrize("cli", PROGRESS_CLIS, ids=lambda cli: cli.name)
def test_a_long_run_on_a_terminal_shows_progress_and_erases_it(cli: Cli, work: Path) -> None:
    ran = on_a_terminal(many(cli, work, 25), work)
    assert ran.code == 1
    before, _, after = ran.out.rpartition(ERASE_LINE)
    assert "25/25 files" in ANSI.sub("", before)
    assert not PROGRESS.search(ANSI.sub("", after)), "the line is gone at the end"
    assert SUMMARY[cli.name] in after


@pytest.mark.parametrize(
    "case", ["20 files", "a pipe, even with FORCE_COLOR", "-q", "machine format"]
)
@pytest.mark.parametrize("cli", [CONVERT, LINT], ids=lambda cli: cli.name)
def test_no_progress(cli: Cli, case: str, work: Path) -> None:
    if case == "20 files":
        ran = on_a_terminal(many(cli, work, 20), work)
    elif case == "-q":
        ran = on_a_terminal(many(cli, work, 25, "-q"), work)
    elif case == "machine format":
        ran = on_a_terminal(many(cli, work, 25, *MACHINE[cli.name]), work)
    else:
        ran = in_a_pipe(many(cli, work, 25), work, FORCE_COLOR="1")
    assert ran.code == 1, ran.err
    assert "train0.py" in ran.out + ran.err
    assert not PROGRESS.search(ANSI.sub("", ran.out + ran.err))
