"""accel-lint as users run it: exit codes, selection, config, suppression, fixes, bad input."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from accelify.transform.console import package_version

from .conftest import FIXTURES

BUGGY = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "accelerator = Accelerator()\n"
    "model, opt = accelerator.prepare(model, opt)\n"
    "loss.backward()\n"
    "out = model.generate(x)\n"
)


@pytest.fixture
def buggy(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(BUGGY)
    return path


def codes(out: str) -> list[str]:
    return [line.split(": ", 1)[1].split()[0] for line in out.splitlines() if ": ACL" in line]


def test_exit_codes_and_plain_lines_in_a_pipe(lint_cli, buggy: Path) -> None:
    result = lint_cli(str(buggy))
    assert result.code == 1
    assert f"{buggy}:5:1: ACL201 [*] " in result.out
    assert codes(result.out) == ["ACL201", "ACL005"]
    assert lint_cli(str(buggy), "--exit-zero").code == 0
    assert lint_cli(str(FIXTURES / "clean_train.py")).code == 0


def test_select_and_ignore_by_code_prefix_and_name(lint_cli, buggy: Path) -> None:
    assert codes(lint_cli(str(buggy), "--select", "ACL0").out) == ["ACL005"]
    assert codes(lint_cli(str(buggy), "--ignore", "backward-bypass").out) == ["ACL005"]
    bad = lint_cli(str(buggy), "--select", "ACL9")
    assert bad.code == 2 and bad.err == "accel-lint: error: unknown rule selector 'ACL9'\n"


def test_off_by_default_rules_need_selecting(lint_cli, tmp_path: Path) -> None:
    path = tmp_path / "p.py"
    path.write_text("from accelerate import Accelerator\naccelerator = Accelerator()\nprint(1)\n")
    assert lint_cli(str(path)).code == 0
    assert codes(lint_cli(str(path), "--select", "ACL301").out) == ["ACL301"]


def test_pyproject_config_is_found_by_walking_up(lint_cli, buggy: Path) -> None:
    (buggy.parent / "pyproject.toml").write_text(
        '[tool.accelify.lint]\nignore = ["ACL005"]\n'
        '[tool.accelify.lint.per-file-ignores]\n"sub/*.py" = ["ACL201"]\n'
    )
    sub = buggy.parent / "sub"
    sub.mkdir()
    (sub / "other.py").write_text(BUGGY)
    result = lint_cli(str(buggy.parent))
    assert codes(result.out) == ["ACL201"]
    assert f"{buggy}:5:1" in result.out


def test_explicit_config_file_and_its_errors(lint_cli, buggy: Path, tmp_path: Path) -> None:
    settings = tmp_path / "lint.toml"
    settings.write_text('select = ["ACL201"]\n')
    assert codes(lint_cli(str(buggy), "--config", str(settings)).out) == ["ACL201"]
    settings.write_text('# settings\nselct = ["ACL201"]\n')
    result = lint_cli(str(buggy), "--config", str(settings))
    assert result.code == 2
    assert result.err.strip() == (
        f"{settings}:2: unknown [tool.accelify.lint] key 'selct' (did you mean 'select'?)"
    )


def test_a_discovered_settings_mistake_is_one_line_at_its_key_or_code(
    lint_cli, tmp_path: Path
) -> None:
    """Ruff's way: the line of the key or code, the likely intent, once for the whole run."""
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(BUGGY)
    settings = tmp_path / "pyproject.toml"
    settings.write_text('[tool.accelify.lint]\nselect = ["ACL0"]\nignore = [\n  "ACL2O1",\n]\n')
    result = lint_cli(str(tmp_path))
    assert (result.code, result.err) == (
        2,
        f"{settings}:4: unknown rule selector 'ACL2O1' (did you mean 'ACL201'?)\n",
    )
    settings.write_text(
        '[tool.accelify.lint]\n[tool.accelify.lint.per-file-ignores]\n"a.py" = ["unwraped-save"]\n'
    )
    assert lint_cli(str(tmp_path)).err == (
        f"{settings}:3: unknown rule selector 'unwraped-save' (did you mean 'unwrapped-save'?)\n"
    )


def test_noqa_comments_and_file_level_opt_out(lint_cli, tmp_path: Path) -> None:
    path = tmp_path / "t.py"
    path.write_text(BUGGY.replace("loss.backward()", "loss.backward()  # noqa: ACL201"))
    assert codes(lint_cli(str(path)).out) == ["ACL005"]
    path.write_text(BUGGY.replace("model.generate(x)", "model.generate(x)  # noqa"))
    assert codes(lint_cli(str(path)).out) == ["ACL201"]
    path.write_text(BUGGY.replace("loss.backward()", "loss.backward()  # noqa: ACL005"))
    assert codes(lint_cli(str(path)).out) == ["ACL201", "ACL005"]  # other code: not silenced
    path.write_text("# accelify: noqa\n" + BUGGY)
    assert lint_cli(str(path)).code == 0


def test_fix_writes_safe_fixes_and_reports_the_rest(lint_cli, buggy: Path) -> None:
    result = lint_cli(str(buggy), "--fix")
    assert result.code == 1
    assert "accelerator.backward(loss)" in buggy.read_text()
    assert codes(result.out) == ["ACL005"]
    assert "Fixed 1 problem." in result.out
    result = lint_cli(str(buggy), "--fix", "--unsafe-fixes")
    assert result.code == 0
    assert "accelerator.unwrap_model(model).generate(x)" in buggy.read_text()


def test_diff_shows_fixes_and_writes_nothing(lint_cli, buggy: Path) -> None:
    result = lint_cli(str(buggy), "--diff")
    assert result.code == 1
    assert "-loss.backward()\n+accelerator.backward(loss)\n" in result.out
    assert buggy.read_text() == BUGGY
    assert lint_cli(str(FIXTURES / "clean_train.py"), "--diff").code == 0


def test_bad_input_is_one_line_exit_2_and_other_files_still_linted(
    lint_cli, buggy: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nx = (\n")
    latin = tmp_path / "latin.py"
    latin.write_bytes(b"import torch\nname = '\xe9'\n")
    result = lint_cli(str(broken), str(latin), str(buggy), str(tmp_path / "missing.py"))
    assert result.code == 2
    assert codes(result.out) == ["ACL201", "ACL005"]
    assert result.err.splitlines() == [
        f"{broken}:2: syntax error: '(' was never closed",
        f"{latin}:2: not valid utf-8 (byte 0xe9)",
        f"{tmp_path / 'missing.py'}:0: no such file",
    ]
    assert "Traceback" not in result.err


def test_a_syntax_error_is_an_error_also_where_no_rule_reads(lint_cli, tmp_path: Path) -> None:
    """The torch prefilter skips files no rule can read, but not their syntax errors (Ruff
    reports them everywhere); syntax newer than this Python, which libcst reads, still passes."""
    plain = tmp_path / "plain.py"
    plain.write_text("def f(:\n    pass\n")
    newer = tmp_path / "newer.py"
    newer.write_text("type Pair = tuple[int, int]\n")
    result = lint_cli(str(plain), str(newer))
    assert (result.code, result.err) == (2, f"{plain}:1: syntax error: invalid syntax\n")


def test_a_plain_training_script_passes_with_a_note_that_nothing_multi_process_ran(
    lint_cli, buggy: Path, tmp_path: Path
) -> None:
    plain = tmp_path / "plain.py"
    plain.write_text("import torch\nloss = model(x).sum()\nloss.backward()\n")
    result = lint_cli(str(plain))
    assert result.code == 0
    assert result.out.splitlines() == [
        "All checks passed!",
        "Note: 1 file trains with no Accelerator in it, where the multi-process rules have "
        "nothing to read (accel-convert converts such scripts; --select ACL210 lists what it "
        "would leave alone).",
    ]
    (tmp_path / "other.py").write_text(plain.read_text())
    assert "Note: 2 files train with no Accelerator in them" in lint_cli(str(tmp_path)).out
    # Accelerate code, and a run that reads plain scripts with ACL210, get no note.
    assert "Note" not in lint_cli(str(buggy)).out
    assert lint_cli(str(plain), "--select", "ACL210").out == "All checks passed!\n"


def test_quiet_prints_findings_only(lint_cli, buggy: Path, tmp_path: Path) -> None:
    loud, quiet = lint_cli(str(buggy)), lint_cli(str(buggy), "-q")
    assert quiet.code == loud.code == 1
    assert quiet.out.splitlines() == loud.out.splitlines()[:-1]  # less "Found 2 problems ..."
    assert quiet.out.count(": ACL") == 2
    clean = tmp_path / "clean.py"
    clean.write_text("import torch\n")
    assert lint_cli(str(clean), "--quiet").out == ""


def test_exclude_show_files_and_show_settings(
    lint_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ruff's habits: excluded globs skip walked files (a named file is still linted), and the
    run can say which files and which settings it would use."""
    monkeypatch.chdir(tmp_path)
    for name in ("train.py", "legacy/old.py", "legacy/deep/older.py", "gen/made.py"):
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        Path(name).write_text(BUGGY)
    Path("pyproject.toml").write_text(
        '[tool.accelify.lint]\nextend-select = ["ACL301"]\nexclude = ["gen/*"]\n'
        'extend-exclude = ["legacy/"]\n'
    )
    shown = lint_cli("--show-files", ".")
    assert (shown.code, shown.out) == (0, "train.py\n")
    assert "legacy/old.py" not in lint_cli(".").out
    assert lint_cli("legacy/old.py").code == 1  # named: linted
    settings = lint_cli("--show-settings", "train.py", "--ignore", "ACL005")
    lines = settings.out.splitlines()
    assert lines[:3] == [
        "file: train.py",
        f"settings: {tmp_path / 'pyproject.toml'}",
        "exclude: gen/*, legacy/",
    ]
    assert any(line.startswith("  ACL301 ") for line in lines)  # extend-select, off by default
    assert not any(line.startswith("  ACL005 ") for line in lines)


def test_jobs_give_the_same_findings(lint_cli) -> None:
    paths = [str(FIXTURES / n) for n in ("planted.py", "clean_train.py", "notebook.ipynb")]
    one = lint_cli(*paths, "--output-format", "json")
    two = lint_cli(*paths, "--output-format", "json", "--jobs", "2")
    assert json.loads(one.out) == json.loads(two.out) and one.code == two.code == 1


def test_rule_docs_and_version(lint_cli) -> None:
    doc = lint_cli("rule", "unwrapped-save")
    assert doc.code == 0 and doc.out.startswith("# ACL101 unwrapped-save (error)")
    assert "## Use instead" in doc.out
    every = lint_cli("rule", "--all")
    assert every.out.count("\n# ACL") + every.out.startswith("# ACL") >= 15
    unknown = lint_cli("rule", "ACL999")
    assert unknown.code == 2 and unknown.err.count("\n") == 1
    assert lint_cli("--version").out == f"accel-lint {package_version()}\n"


def test_console_script_runs_without_importing_torch(buggy: Path) -> None:
    code = (
        "import sys; from accelify.rules.cli import run; rc = run(sys.argv[1:]);"
        "print('torch' in sys.modules, rc)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(buggy)], capture_output=True, text=True, check=False
    )
    assert result.stdout.strip().splitlines()[-1] == "False 1"


def test_ruff_habits_check_statistics_and_output_file(lint_cli, buggy: Path) -> None:
    assert codes(lint_cli("check", str(buggy)).out) == ["ACL201", "ACL005"]
    stats = lint_cli(str(buggy), "--statistics")
    assert stats.code == 1
    assert [line.split() for line in stats.out.splitlines()] == [
        ["1", "ACL005", "wrapped-model-attribute"],
        ["1", "ACL201", "[*]", "backward-bypass"],
    ]
    report = buggy.with_name("report.json")
    written = lint_cli(str(buggy), "--output-format", "json", "--output-file", str(report))
    assert written.code == 1 and written.out == ""
    assert [f["code"] for f in json.loads(report.read_text())] == ["ACL201", "ACL005"]


def test_show_fixes_lists_what_fix_applied(lint_cli, buggy: Path) -> None:
    result = lint_cli(str(buggy), "--fix", "--show-fixes")
    assert result.out.splitlines()[-4:-1] == [
        "Fixed 1 problem:",
        f"- {buggy}:",
        "    1 x ACL201 (backward-bypass)",
    ]


def test_stdin_filename_names_the_input_and_picks_its_settings(
    lint_cli, buggy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (buggy.parent / "pyproject.toml").write_text(
        '[tool.accelify.lint.per-file-ignores]\n"sub/*.py" = ["ACL005"]\n'
    )
    monkeypatch.chdir(buggy.parent)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(BUGGY.encode())))
    result = lint_cli("-", "--stdin-filename", f"{buggy.parent}/sub/train.py")
    assert codes(result.out) == ["ACL201"]  # ACL005 ignored for that name
    assert f"{buggy.parent}/sub/train.py:5:1: ACL201" in result.out
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"import torch\nx = (\n")))
    broken = lint_cli("-", "--stdin-filename", "t.py")
    assert (broken.code, broken.err) == (2, "t.py:2: syntax error: '(' was never closed\n")


def test_usage_mistakes_are_one_line_and_exit_2(lint_cli, buggy: Path) -> None:
    for argv in (["--bogus"], ["--output-format", "xml"], ["--jobs", "x"]):
        result = lint_cli(*argv, str(buggy))
        assert result.code == 2
        assert result.err.startswith("accel-lint: error: ") and result.err.count("\n") == 1
        assert result.out == ""


def test_color_option_and_shell_completion(lint_cli, buggy: Path, monkeypatch) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert "\x1b[" in lint_cli(str(buggy)).out
    assert "\x1b[" not in lint_cli(str(buggy), "--color", "never").out
    # Typer guesses the shell from the parent processes unless told not to (then the option
    # takes the shell's name): the guess depends on what started the test run.
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    script = lint_cli("--show-completion", "bash")
    assert "_ACCEL_LINT_COMPLETE=complete_bash" in script.out
