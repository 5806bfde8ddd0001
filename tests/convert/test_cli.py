"""accel-convert's command line: modes, exit codes, the report, and byte-faithful writes.

Most tests run the CLI in-process against a stand-in engine that makes one known edit (swap
``loss.backward()``) and one needs-a-human note, so what is checked is the CLI's own contract —
where output goes, what is written, how it is encoded — independent of the converter's steps.
Parse errors still come from the real engine. A few tests run the real engine end to end, one of
them through the installed ``accel-convert`` script.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from accelify.transform import cli
from accelify.transform.console import package_version
from accelify.transform.convert import Note, Options, Result, convert

from .conftest import CASES_DIR

SCRIPT = """\
import torch

model = Net().to(device)
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""
UNCHANGED = "x = 1\n"
BEFORE, AFTER = "loss.backward()", "accelerator.backward(loss)"
MANUAL = "# hand-rolled all_reduce"
ERROR_LINE = re.compile(r"^\S+:\d+: \S.*$")
SEE = " (see https://accelify.github.io/accelify/reference/rules/ACL205/)"


def fake_convert(source: str, options: Options | None = None, path: str = "<string>") -> Result:
    """The real engine's parsing and errors, then one known edit and notes by line."""
    convert(source, options, path)
    notes = [
        Note(number, f"swapped {BEFORE}", step="ACC108")
        if BEFORE in line
        else Note(number, "all_reduce", True, code="ACL205")
        for number, line in enumerate(source.splitlines(), 1)
        if BEFORE in line or MANUAL in line
    ]
    return Result(code=source.replace(BEFORE, AFTER), notes=tuple(notes), original=source)


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> list[Options]:
    """Install the stand-in engine; the list collects the options each call got."""
    seen: list[Options] = []

    def recording(source: str, options: Options | None = None, path: str = "<string>") -> Result:
        seen.append(options or Options())
        return fake_convert(source, options, path)

    monkeypatch.setattr(cli, "convert", recording)
    return seen


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


@dataclass(frozen=True)
class Ran:
    exit_code: int
    stdout: str
    stderr: str


class _Terminal(io.TextIOWrapper):
    def isatty(self) -> bool:
        return True


def run(
    *args: str,
    stdin: bytes | None = None,
    env: dict[str, str | None] | None = None,
    tty: bool = False,
) -> Ran:
    """The CLI in this process, with byte-level standard streams (a bug's traceback propagates);
    ``tty``: standard output says it is a terminal."""
    out, err = io.BytesIO(), io.BytesIO()
    stdout = (_Terminal if tty else io.TextIOWrapper)(out, encoding="utf-8", write_through=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin or b""), encoding="utf-8"))
        patch.setattr(sys, "stdout", stdout)
        patch.setattr(sys, "stderr", io.TextIOWrapper(err, encoding="utf-8", write_through=True))
        for key, value in (env or {}).items():
            patch.setenv(key, value) if value is not None else patch.delenv(key, raising=False)
        try:
            code = cli.run(list(args))
        except SystemExit as exit:  # shell completion answers and exits
            code = exit.code if isinstance(exit.code, int) else 1
        sys.stdout.flush()
        sys.stderr.flush()
        result = Ran(
            code, out.getvalue().decode(), err.getvalue().decode()
        )  # before wrappers close
    assert "Traceback" not in result.stdout + result.stderr
    return result


def write(name: str, text: str | bytes) -> Path:
    path = Path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


# --- default mode, stdin, -o -----------------------------------------------------------------


def test_one_file_prints_converted_source_and_reports_on_stderr(engine: list[Options]) -> None:
    write("train.py", SCRIPT + MANUAL + "\n")
    result = run("train.py")
    assert result.exit_code == 0
    assert result.stdout == (SCRIPT + MANUAL + "\n").replace(BEFORE, AFTER)
    assert result.stderr.splitlines() == [
        "train.py: converted, 1 change, 1 place to finish by hand",
        f"train.py:8: ACL205 needs a human: all_reduce{SEE}",
        "1 file converted, 0 unchanged, 1 place to finish by hand",
    ]
    assert Path("train.py").read_text() == SCRIPT + MANUAL + "\n"  # printing writes nothing


def test_verbose_lists_every_change_with_its_code(engine: list[Options]) -> None:
    write("train.py", SCRIPT + MANUAL + "\n")
    write("same.py", UNCHANGED)
    result = run("--check", "-v", "train.py", "same.py")
    assert result.stderr.splitlines() == [
        "train.py: would be converted, 1 change, 1 place to finish by hand",
        f"train.py:6: ACC108 swapped {BEFORE}",  # a change line stays short: no URL
        f"train.py:8: ACL205 needs a human: all_reduce{SEE}",
        "same.py: nothing to convert",
        "1 file would be converted, 1 unchanged, 1 place to finish by hand",
    ]
    both = run("--check", "-v", "-q", "train.py")
    assert (both.exit_code, both.stderr) == (2, "accel-convert: error: choose one of -q, -v\n")


def test_default_report_is_a_line_per_file_and_the_needs_a_human_lines() -> None:
    """The real engine: a converted file, one left unchanged and one with nothing to convert."""
    write("mnist.py", (CASES_DIR / "mnist.in.py").read_text())
    write("gan.py", (CASES_DIR / "refusals.in.py").read_text())
    write("hf.py", (CASES_DIR / "already" / "hf_script.in.py").read_text())
    write("left.py", (CASES_DIR / "sound" / "second_backward_same_forward.in.py").read_text())
    result = run("--check", "mnist.py", "gan.py", "hf.py", "left.py")
    lines = result.stderr.splitlines()
    assert lines[0] == "mnist.py: would be converted, 17 changes"
    assert lines[1] == "gan.py: would be converted, 8 changes, 2 places to finish by hand"
    refusals = "https://accelify.github.io/accelify/reference/refusals"
    assert lines[2] == (
        "gan.py:21: ACR203 needs a human: left unchanged: a second training setup in "
        f"train_gan(); convert it by hand (see {refusals}/ACR203/)"
    )
    assert lines[4] == "hf.py: nothing to convert"
    assert lines[5] == "left.py: left unchanged (needs a human)"
    assert re.fullmatch(
        rf"left\.py:\d+: ACR\d+ needs a human: .* \(see {refusals}/ACR\d+/\)", lines[6]
    )
    assert lines[-1] == "2 files would be converted, 2 unchanged, 3 places to finish by hand"
    assert len(lines) == 8


def test_stdin_is_converted_to_stdout_in_every_writing_mode(engine: list[Options]) -> None:
    for args in (["-"], ["--inplace", "-"]):
        result = run(*args, stdin=SCRIPT.encode())
        assert result.exit_code == 0
        assert result.stdout == SCRIPT.replace(BEFORE, AFTER)
        assert "<stdin>: converted, 1 change" in result.stderr


def test_output_writes_one_input_to_a_new_file_with_ordinary_mode(engine: list[Options]) -> None:
    write("train.py", SCRIPT)
    old_umask = os.umask(0o022)
    try:
        result = run("train.py", "-o", "out.py")
    finally:
        os.umask(old_umask)
    assert result.exit_code == 0
    assert result.stdout == ""
    assert Path("out.py").read_text() == SCRIPT.replace(BEFORE, AFTER)
    assert stat.S_IMODE(Path("out.py").stat().st_mode) == 0o644  # not mkstemp's 0600
    assert Path("train.py").read_text() == SCRIPT


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["a.py", "b.py"], "use --inplace, --diff or --check"),
        (["pkg"], "use --inplace, --diff or --check"),
        (["a.py", "b.py", "-o", "out.py"], "takes exactly one input file"),
        (["pkg", "-o", "out.py"], "takes exactly one input file"),
        (["a.py", "--inplace", "--check"], "choose one of --inplace, --check"),
        (["a.py", "--diff", "-o", "out.py"], "choose one of --diff, -o"),
        (["a.py", "--target", "tensorflow"], "--target"),
        (["a.py", "--gradient-accumulation-steps", "0"], "--gradient-accumulation-steps"),
        (["a.py", "--jobs", "-1"], "--jobs"),
        (["a.py", "--bogus"], "--bogus"),
        ([], "PATH"),
        (["a.py", "--output-format", "github"], "--output-format github goes with --check"),
    ],
)
def test_usage_mistakes_exit_2_and_touch_nothing(
    engine: list[Options], args: list[str], message: str
) -> None:
    write("a.py", SCRIPT)
    write("b.py", SCRIPT)
    write("pkg/c.py", SCRIPT)
    result = run(*args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stderr.startswith("accel-convert: error: ")
    assert result.stderr.count("\n") == 1  # one line, no usage text
    assert result.stdout == ""
    assert not engine  # refused before converting anything
    assert not Path("out.py").exists()
    assert Path("a.py").read_text() == SCRIPT


def test_options_reach_the_engine(engine: list[Options]) -> None:
    write("a.py", SCRIPT)
    args = ["--target", "accelerate", "--mixed-precision", "bf16"]
    assert run("a.py", *args, "--gradient-accumulation-steps", "4").exit_code == 0
    assert run("a.py").exit_code == 0
    assert engine == [Options("accelerate", "bf16", 4), Options()]


# --- what the report says: on a terminal, after writing, for GitHub -------------------------


def test_printing_to_a_terminal_says_nothing_was_written(engine: list[Options]) -> None:
    write("train.py", SCRIPT)
    shown = run("train.py", tty=True)
    assert shown.stdout == SCRIPT.replace(BEFORE, AFTER)
    assert shown.stderr.splitlines()[-1].startswith("Nothing was written: ")
    assert "-o OUT or --inplace" in shown.stderr
    assert "Nothing was written" not in run("train.py").stderr  # a redirect is the writing


def test_summary_is_not_dim_and_the_places_to_finish_stand_out(engine: list[Options]) -> None:
    write("train.py", SCRIPT + MANUAL + "\n")
    styled = run("--check", "train.py", env={"FORCE_COLOR": "1", "NO_COLOR": None})
    summary = styled.stderr.splitlines()[-1]
    assert "1 place to finish by hand" in summary
    assert "\x1b[2m" not in styled.stderr  # dim
    assert "\x1b[33m" in summary  # yellow


def _shifting_engine(source: str, options: Options | None = None, path: str = "<string>") -> Result:
    """The stand-in engine plus two lines inserted at the top, so every later line moves."""
    result = fake_convert(source, options, path)
    return replace(result, code=f"import accelify\n# converted\n{result.code}")


@pytest.mark.parametrize(
    ("args", "written"),
    [(["--inplace", "train.py"], "train.py"), (["train.py", "-o", "out/train.py"], "out/train.py")],
)
def test_after_writing_report_lines_point_into_the_written_file(
    monkeypatch: pytest.MonkeyPatch, args: list[str], written: str
) -> None:
    monkeypatch.setattr(cli, "convert", _shifting_engine)
    write("out/.keep", "")
    write("train.py", SCRIPT + MANUAL + "\n")
    result = run("-v", *args)
    lines = Path(written).read_text().splitlines()
    reported = [
        re.fullmatch(rf"{re.escape(written)}:(\d+): \S+ (.*) \(was line (\d+)\).*", line)
        for line in result.stderr.splitlines()[1:-1]
    ]
    assert all(reported), result.stderr
    where = {match[2]: (int(match[1]), int(match[3])) for match in reported if match}
    assert where == {f"swapped {BEFORE}": (8, 6), "needs a human: all_reduce": (10, 8)}
    assert lines[8 - 1] == f"    {AFTER}"  # the printed line holds the code the note is about
    assert lines[10 - 1] == MANUAL


def test_real_conversion_reports_the_written_lines_of_its_rewrites() -> None:
    """Notes of the form ``old -> new`` name the code the written line must hold."""
    write("mnist.py", (CASES_DIR / "mnist.in.py").read_text())
    result = run("-v", "--inplace", "mnist.py")
    lines = Path("mnist.py").read_text().splitlines()
    rewrites = [
        re.fullmatch(r"mnist\.py:(\d+): ACC\d+ \S+ -> (\S+?)(?: \(.*)?", line)
        for line in result.stderr.splitlines()
    ]
    found = [(int(m[1]), m[2]) for m in rewrites if m]
    assert len(found) >= 3
    for number, code in found:
        assert code in lines[number - 1], (number, code)
    assert "(was line " in result.stderr  # the file grew: some notes moved


def test_notes_of_inserted_lines_name_those_lines_after_writing() -> None:
    """The import, the accelerator and the prepare() call are new lines: their notes name where
    they were written, not the input line they went next to, and were nowhere before."""
    write("mnist.py", (CASES_DIR / "mnist.in.py").read_text())
    result = run("-v", "mnist.py", "-o", "out.py")
    assert result.stderr.splitlines()[0] == "mnist.py: converted, 17 changes (written to out.py)"
    lines = Path("out.py").read_text().splitlines()
    inserted = {
        "imported Accelerator from the runtime": "from accelify.runtime import Accelerator",
        "created accelerator": "accelerator = Accelerator(",
        "prepared model, optimizer, train_loader, scheduler with accelerator.prepare()": (
            "model, optimizer, train_loader, scheduler = accelerator.prepare("
        ),
    }
    notes = {
        message.split(" ", 1)[1]: where
        for where, message in (line.split(": ", 1) for line in result.stderr.splitlines()[1:-1])
    }
    for message, code in inserted.items():
        where = notes[message]
        assert where.startswith("out.py:"), where  # and no "(was line N)" after the message
        assert lines[int(where.split(":")[1]) - 1].strip().startswith(code), (message, where)


def test_check_with_github_output_annotates_changes_and_needs_a_human(
    engine: list[Options],
) -> None:
    write("a.py", SCRIPT + MANUAL + "\n")
    write("b.py", UNCHANGED)
    result = run("--check", "--output-format", "github", "a.py", "b.py")
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        "::warning file=a.py,line=6,endLine=6,title=accel-convert would change this::"
        f"ACC108 swapped {BEFORE}%0A-    {BEFORE}%0A+    {AFTER}",
        f"::warning file=a.py,line=8,title=accel-convert needs a human::ACL205 all_reduce{SEE}",
    ]
    assert "1 file would be converted" in result.stderr


def test_stdin_filename_names_standard_input_in_the_report(engine: list[Options]) -> None:
    result = run("-", "--stdin-filename", "train.py", stdin=SCRIPT.encode())
    assert result.stdout == SCRIPT.replace(BEFORE, AFTER)
    assert "train.py: converted, 1 change" in result.stderr
    broken = run("-", "--stdin-filename", "train.py", stdin=b"x = (\n")
    assert broken.exit_code == 2
    assert broken.stderr.startswith("train.py:1: syntax error")
    assert not Path("train.py").exists()  # a name for the report, not a file to write


def test_color_option_beats_the_environment(engine: list[Options]) -> None:
    write("a.py", SCRIPT)
    never = run("--diff", "--color", "never", "a.py", env={"FORCE_COLOR": "1", "NO_COLOR": None})
    assert "\x1b[" not in never.stdout + never.stderr
    always = run("--diff", "--color", "always", "a.py", env={"NO_COLOR": "1", "FORCE_COLOR": None})
    assert "\x1b[" in always.stdout


def test_shell_completion_is_offered_and_answers() -> None:
    # Typer guesses the shell from the parent processes unless told not to (then the option takes
    # the shell's name): without a terminal, as in CI, the guess finds none.
    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    command = [_script(), "--show-completion", "bash"]
    script = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    assert script.returncode == 0, script.stderr
    assert "_ACCEL_CONVERT_COMPLETE=complete_bash" in script.stdout
    env = {"_ACCEL_CONVERT_COMPLETE": "complete_bash", "COMP_WORDS": "accel-convert --ta"}
    answer = run(env={**env, "COMP_CWORD": "1"})
    assert answer.stdout.split() == ["--target"]


# --- --inplace, --check, --diff ----------------------------------------------------------------


def test_inplace_rewrites_changed_files_only(engine: list[Options]) -> None:
    changed, same = write("a.py", SCRIPT), write("b.py", UNCHANGED)
    inode = same.stat().st_ino
    result = run("--inplace", "a.py", "b.py")
    assert result.exit_code == 0
    assert result.stdout == ""
    assert changed.read_text() == SCRIPT.replace(BEFORE, AFTER)
    assert same.stat().st_ino == inode  # not even rewritten with the same bytes
    assert result.stderr.splitlines()[-1] == "1 file converted, 1 unchanged"


def test_check_reports_without_writing_and_exits_1_on_changes(engine: list[Options]) -> None:
    write("a.py", SCRIPT)
    write("b.py", UNCHANGED)
    result = run("--check", "a.py", "b.py")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "a.py: would be converted, 1 change",
        "b.py: nothing to convert",
        "1 file would be converted, 1 unchanged",
    ]
    assert Path("a.py").read_text() == SCRIPT
    assert run("--check", "b.py").exit_code == 0


def test_strict_check_fails_on_places_to_finish_by_hand() -> None:
    """A script left unchanged with a reason passes --check (nothing would change); CI that
    wants every script converted gates on --strict. The real converter decides here."""
    write(
        "flag.py",
        "import torch\n\nmodel = torch.nn.Linear(2, 1)\nif use_sgd:\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in torch.randn(8, 2).split(2):\n    model(x).sum().backward()\n"
        "    optimizer.step()\n",
    )
    write("done.py", "import torch\nfrom accelify.runtime import Accelerator\n")
    loose, strict = run("--check", "flag.py"), run("--check", "--strict", "flag.py")
    assert (loose.exit_code, strict.exit_code) == (0, 1)
    assert strict.stderr == loose.stderr
    assert (
        "flag.py:5: ACR205 needs a human: left unchanged: optimizer is not built" in strict.stderr
    )
    assert run("--check", "--strict", "done.py").exit_code == 0
    assert run("--diff", "--strict", "flag.py").exit_code == 1
    wrong = run("--strict", "flag.py")
    assert (wrong.exit_code, wrong.stderr) == (
        2,
        "accel-convert: error: --strict goes with --check or --diff\n",
    )


def test_diff_is_git_style_plain_in_a_pipe_and_coloured_on_a_terminal(
    engine: list[Options],
) -> None:
    write("pkg/a.py", SCRIPT)
    write("pkg/b.py", UNCHANGED)
    result = run("--diff", "pkg")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[:2] == ["--- a/pkg/a.py", "+++ b/pkg/a.py"]
    assert f"-    {BEFORE}" in lines
    assert f"+    {AFTER}" in lines
    assert "b.py" not in result.stdout  # nothing to show for an unchanged file
    assert "\x1b[" not in result.stdout
    assert Path("pkg/a.py").read_text() == SCRIPT
    coloured = run("--diff", "pkg", env={"FORCE_COLOR": "1", "NO_COLOR": None, "TERM": "xterm"})
    assert "\x1b[" in coloured.stdout
    assert run("--diff", "pkg/b.py").exit_code == 0


def test_diff_marks_a_missing_final_newline(engine: list[Options]) -> None:
    write("a.py", f"x = 1\n{BEFORE}")
    lines = run("--diff", "a.py").stdout.splitlines()
    assert lines[-4:] == [
        f"-{BEFORE}",
        "\\ No newline at end of file",
        f"+{AFTER}",
        "\\ No newline at end of file",
    ]


def test_quiet_keeps_only_errors_needs_a_human_and_the_totals(engine: list[Options]) -> None:
    write("a.py", SCRIPT + MANUAL + "\n")
    write("bad.py", "x = (\n")
    result = run("--check", "--quiet", "a.py", "bad.py")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"a.py:8: ACL205 needs a human: all_reduce{SEE}",
        "bad.py:1: syntax error: '(' was never closed",
        "1 file would be converted, 0 unchanged, 1 place to finish by hand, 1 error",
    ]


def test_codes_link_their_pages_on_a_terminal(engine: list[Options]) -> None:
    write("a.py", SCRIPT + MANUAL + "\n")
    shown = run("--check", "-v", "a.py", env={"FORCE_COLOR": "1", "NO_COLOR": None}).stderr
    pages = "https://accelify.github.io/accelify/reference"
    assert "\x1b]8;id=" in shown and f";{pages}/conversions/ACC108/\x1b\\" in shown
    assert f";{pages}/rules/ACL205/\x1b\\" in shown
    assert "(see " not in shown  # the link is the code itself


# --- bad input, failed writes --------------------------------------------------------------


def test_bad_inputs_are_one_line_errors_and_the_good_file_still_converts(
    engine: list[Options],
) -> None:
    bad = {
        "syntax.py": b"x = 1\nif x\n    pass\n",
        "latin.py": b"name = 'caf\xe9'\n",  # not UTF-8 and no coding cookie
        "blob.py": b"\x00\x01\x02binary",
    }
    for name, data in bad.items():
        write(name, data)
    write("good.py", SCRIPT)
    result = run("--inplace", "syntax.py", "latin.py", "good.py", "blob.py", "missing.py")
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if not line.startswith("good.py")][:4]
    assert [line.split(":")[:2] for line in errors] == [
        ["syntax.py", "2"],
        ["latin.py", "1"],
        ["blob.py", "1"],
        ["missing.py", "0"],
    ]
    assert all(ERROR_LINE.match(line) for line in errors)
    assert "no such file" in errors[3]
    assert Path("good.py").read_text() == SCRIPT.replace(BEFORE, AFTER)
    assert {name: Path(name).read_bytes() for name in bad} == bad
    assert sorted(os.listdir()) == ["blob.py", "good.py", "latin.py", "syntax.py"]


def test_errors_win_over_found_changes(engine: list[Options]) -> None:
    write("a.py", SCRIPT)
    assert run("--diff", "a.py", "missing.py").exit_code == 2


def test_failed_write_keeps_the_original_and_leaves_no_temp_file(
    engine: list[Options], monkeypatch: pytest.MonkeyPatch
) -> None:
    write("a.py", SCRIPT)
    write("b.py", SCRIPT)
    real_replace = os.replace

    def replace(src: str, dst: str | Path) -> None:
        if Path(dst).name == "a.py":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    result = run("--inplace", "a.py", "b.py")
    assert result.exit_code == 2
    assert "a.py:0: cannot write: No space left on device" in result.stderr.splitlines()
    assert Path("a.py").read_text() == SCRIPT
    assert Path("b.py").read_text() == SCRIPT.replace(BEFORE, AFTER)
    assert sorted(os.listdir()) == ["a.py", "b.py"]


# --- what --inplace keeps, byte for byte -----------------------------------------------------


@pytest.mark.parametrize(
    "original",
    [
        pytest.param(SCRIPT.replace("\n", "\r\n").encode(), id="crlf"),
        pytest.param(b"\xef\xbb\xbf" + SCRIPT.encode(), id="utf8-bom"),
        pytest.param(
            b"# -*- coding: latin-1 -*-\nname = 'caf\xe9'\n" + SCRIPT.encode(), id="latin-1"
        ),
    ],
)
def test_inplace_keeps_encoding_bom_and_line_endings(
    engine: list[Options], original: bytes
) -> None:
    path = write("a.py", original)
    assert run("--inplace", "a.py").exit_code == 0
    assert path.read_bytes() == original.replace(BEFORE.encode(), AFTER.encode())


def test_inplace_keeps_mode_bits(engine: list[Options]) -> None:
    path = write("a.py", SCRIPT)
    path.chmod(0o751)
    assert run("--inplace", "a.py").exit_code == 0
    assert path.read_text() == SCRIPT.replace(BEFORE, AFTER)
    assert stat.S_IMODE(path.stat().st_mode) == 0o751


# --- walking folders ---------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_folders_skip_hidden_dirs_and_git_ignored_files(engine: list[Options]) -> None:
    subprocess.run(["git", "init", "-q"], check=True)
    write(".gitignore", "generated.py\n")
    for name in ("src/a.py", "src/generated.py", ".hidden/b.py", "src/notes.txt"):
        write(name, SCRIPT)
    Path("empty").mkdir()
    result = run("--diff", ".")
    headers = [line for line in result.stdout.splitlines() if line.startswith("---")]
    assert headers == ["--- a/src/a.py"]
    assert len(engine) == 1
    nothing = run("--check", "empty")
    assert (nothing.exit_code, nothing.stderr) == (0, "no Python files found\n")


# --- --jobs, --version, --help -------------------------------------------------------------


def test_jobs_runs_a_process_pool_and_keeps_input_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real engine: worker processes must not depend on anything patched in this one."""
    import concurrent.futures

    pools: list[int] = []

    class Pool(concurrent.futures.ProcessPoolExecutor):
        def __init__(self, max_workers: int, **options: Any) -> None:
            pools.append(max_workers)
            super().__init__(max_workers, **options)  # the initializer ties workers to the run

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Pool)
    write("a.py", SCRIPT)
    write("b.py", "x = (\n")
    write("c.py", SCRIPT.replace("model", "net"))
    write("d.py", "def f(:\n")
    serial = run("--diff", "a.py", "b.py", "c.py", "d.py")
    parallel = run("--diff", "--jobs", "2", "a.py", "b.py", "c.py", "d.py")
    assert pools == [2]
    assert (parallel.exit_code, parallel.stdout, parallel.stderr) == (
        serial.exit_code,
        serial.stdout,
        serial.stderr,
    )
    errors = [line for line in parallel.stderr.splitlines() if "syntax error" in line]
    assert [line.split(":")[0] for line in errors] == ["b.py", "d.py"]
    assert parallel.stdout.index("a/a.py") < parallel.stdout.index("a/c.py")


def test_version() -> None:
    result = run("--version")
    assert (result.exit_code, result.stdout) == (0, f"accel-convert {package_version()}\n")


def test_help_teaches_modes_exit_codes_and_examples() -> None:
    result = run("--help")
    assert result.exit_code == 0
    for text in ("--inplace", "--diff", "--check", "--output", "--jobs", "--quiet", "Exit status"):
        assert text in result.stdout
    assert re.search(r"Examples:\n +accel-convert train.py > train_accel.py", result.stdout)


# --- the real engine, end to end ---------------------------------------------------------------


def _script() -> str:
    found = shutil.which("accel-convert", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("accel-convert is not installed next to this Python")
    return found


def test_installed_script_converts_stdin_and_reports_bad_files_in_one_line() -> None:
    write("bad.py", "def f(:\n")
    write("good.py", SCRIPT)
    piped = subprocess.run(
        [_script(), "-"], input=SCRIPT.encode(), capture_output=True, check=False
    )
    assert piped.returncode == 0
    assert piped.stdout == convert(SCRIPT).code.encode()
    checked = subprocess.run(
        [_script(), "--check", "bad.py", "good.py"], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 2
    assert checked.stderr.splitlines()[0] == "bad.py:1: syntax error: invalid syntax"
    assert "Traceback" not in checked.stderr


def test_real_conversion_keeps_crlf_line_endings() -> None:
    path = write("a.py", SCRIPT.replace("\n", "\r\n"))
    assert run("--inplace", "a.py").exit_code == 0
    data = path.read_bytes()
    assert data.count(b"\n") == data.count(b"\r\n")  # no bare LF, also in inserted lines


def test_real_check_finds_the_script_needs_converting() -> None:
    write("a.py", SCRIPT)
    result = run("--check", "a.py")
    assert result.exit_code == 1
    assert "1 file would be converted" in result.stderr


def test_check_passes_on_every_converted_golden_output() -> None:
    """A converted script needs nothing more: the pre-commit hook passes on its own output
    (with the options its case was converted with, which a refusal may depend on)."""
    by_options: dict[str, list[str]] = {}
    for path in sorted(CASES_DIR.rglob("*.out.py")):
        first = path.read_text().split("\n", 1)[0]
        options = first.removeprefix("# accel-convert:") if first.startswith("# accel-") else ""
        by_options.setdefault(options, []).append(str(path))
    for options, outputs in by_options.items():
        result = run(*options.split(), "--check", *outputs)
        assert result.exit_code == 0, result.stderr
        assert f"0 files would be converted, {len(outputs)} unchanged" in result.stderr


def test_check_passes_on_accelerate_scripts_and_says_why() -> None:
    write("hf.py", (CASES_DIR / "already" / "hf_script.in.py").read_text())
    result = run("--check", "-v", "hf.py")
    assert result.exit_code == 0
    assert (
        "hf.py:4: ACR101 already an Accelerate script (imports accelerate.Accelerator)"
        in result.stderr
    )


def test_the_cli_never_imports_torch() -> None:
    code = "import sys, accelify.transform.cli; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
