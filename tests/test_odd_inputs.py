"""Inputs that are valid, or merely odd, never crash either tool: each gets one
``path[:line]: message`` line and exit 2, and the other files of the run still go through.

Both CLIs run in this process (``run(argv)``), so a crash of libcst's native parser would take
the test session down with it: the nesting tests fail loudly without their fix.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from accelify.rules import cli as lint_cli
from accelify.transform import cli as convert_cli
from accelify.transform import console, sources
from accelify.transform.sources import SourceError

TRAINING = """\
import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in torch.randn(8, 4).split(2):
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
"""
# One safe accel-lint fix (ACL202: clip through the accelerator).
FIXABLE = """\
import torch
from accelerate import Accelerator

accelerator = Accelerator()
model = accelerator.prepare(torch.nn.Linear(2, 2))
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
"""
# CPython compiles ~2990 terms (3x its recursion limit); not 3500.
LONG = "import torch\nx = " + " + ".join(["1"] * 3500) + "\n"
# CPython keeps an and/or chain flat and compiles any length; libcst nests it and crashes.
BOOLS = "import torch\nx = " + " or ".join(["a"] * 40000) + "\n"
# CPython refuses more than 200 nested brackets; libcst's parser dies past a few thousand.
NESTED = "import torch\nx = " + "(" * 2500 + "1" + ")" * 2500 + "\n"
# CPython's parser runs out of stack (MemoryError) on ~6000 unary operators; libcst's crashes.
UNARY = "import torch\nx = " + "-" * 20000 + "1\n"


def _files(tmp_path: Path, **texts: str) -> dict[str, Path]:
    paths = {}
    for name, text in texts.items():
        paths[name] = tmp_path / f"{name}.py"
        paths[name].write_text(text)
    return paths


def _lines(captured: str) -> list[str]:
    return [line for line in captured.splitlines() if line.strip()]


DEEP = {
    "long-expression": (LONG, "nested too deeply to parse"),
    "deep-brackets": (NESTED, "too many nested parentheses"),
    "unary-chain": (UNARY, "too complex for Python's parser"),
    "bool-chain": (BOOLS, "an and/or chain of 40,000 terms"),
}


@pytest.mark.parametrize("text, message", DEEP.values(), ids=DEEP)
def test_deep_code_is_one_line_and_the_inplace_run_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    files = _files(tmp_path, deep=text, train=TRAINING)
    assert convert_cli.run(["--inplace", str(tmp_path)]) == 2
    errors = [line for line in _lines(capsys.readouterr().err) if "deep.py" in line]
    assert len(errors) == 1 and "deep.py:2: " in errors[0] and message in errors[0], errors
    assert "accelerator.backward(loss)" in files["train"].read_text()
    assert files["deep"].read_text() == text


@pytest.mark.parametrize("text", [text for text, _ in DEEP.values()], ids=DEEP)
def test_the_linter_reports_deep_code_on_one_line_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    _files(tmp_path, deep=text)
    assert lint_cli.run([str(tmp_path)]) == 2
    out = capsys.readouterr()
    lines = [line for line in _lines(out.out + out.err) if "deep.py" in line]
    assert len(lines) == 1 and "deep.py:2: " in lines[0] and "internal error" not in lines[0]


def test_code_nested_almost_as_deep_as_python_compiles_is_converted_and_linted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tools recurse a few frames per level: Python's default limit stopped them at 490
    terms of one chain. Work that runs out of frames runs again on a deeper stack."""
    chain = " + ".join(["x"] * 2500)
    text = TRAINING.replace("model(x).sum()", f"model({chain}).sum()")
    files = _files(tmp_path, train=text)
    assert convert_cli.run(["--inplace", str(tmp_path)]) == 0, capsys.readouterr().err
    converted = files["train"].read_text()
    assert "accelerator.backward(loss)" in converted and chain in converted
    capsys.readouterr()
    assert lint_cli.run([str(files["train"])]) == 1  # a finding: the rules ran through it
    assert "ACL211 no DataLoader feeds this training step" in capsys.readouterr().out
    assert sys.getrecursionlimit() == 1000  # given back


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_named_pipe_or_a_device_is_one_line_never_opened(tmp_path: Path) -> None:
    """Opening a FIFO waits for a writer (the run hung); a device such as /dev/zero never ends."""
    files = _files(tmp_path, train=TRAINING)
    os.mkfifo(tmp_path / "pipe.py")
    for tool, args in (("accel-convert", ["--inplace"]), ("accel-lint", [])):
        done = subprocess.run(
            [str(Path(sys.executable).with_name(tool)), *args, str(tmp_path), "/dev/zero"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        errors = [line for line in _lines(done.stderr + done.stdout) if "not opened" in line]
        assert done.returncode == 2, done.stderr
        assert len(errors) == 2 and "pipe.py:0: is a named pipe (FIFO)" in errors[0], errors
        assert "/dev/zero:0: is a character device" in errors[1]
    assert "accelerator.backward(loss)" in files["train"].read_text()


def test_a_symlink_loop_is_one_file_error_not_the_end_of_the_walk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.py").symlink_to(tmp_path / "b.py")
    (tmp_path / "b.py").symlink_to(tmp_path / "a.py")
    files = _files(tmp_path, train=TRAINING)
    assert convert_cli.run(["--inplace", str(tmp_path)]) == 2
    errors = _lines(capsys.readouterr().err)
    assert sum("symbolic links" in line for line in errors) == 2, errors
    assert "accelerator.backward(loss)" in files["train"].read_text()
    assert lint_cli.run([str(tmp_path)]) == 2


def test_a_read_only_file_is_not_rewritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _files(tmp_path, train=TRAINING)["train"]
    path.chmod(0o444)
    assert convert_cli.run(["--inplace", str(path)]) == 2
    assert "train.py:0: read-only file, not rewritten" in capsys.readouterr().err
    assert path.read_text() == TRAINING
    assert stat.S_IMODE(path.stat().st_mode) == 0o444


def test_a_file_named_like_a_temporary_file_is_the_users_and_stays(tmp_path: Path) -> None:
    """Only the temporary file a write made is ever removed: one a killed run left looks the
    same as a user's own ``.train.py.my notes.tmp``."""
    path = _files(tmp_path, train=TRAINING)["train"]
    mine = tmp_path / ".train.py.my notes.tmp"
    mine.write_text("notes")
    assert convert_cli.run(["--inplace", str(path)]) == 0
    assert mine.read_text() == "notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == [mine.name, "train.py"]


def test_inplace_on_a_symlink_rewrites_its_target_and_keeps_the_link(tmp_path: Path) -> None:
    real = _files(tmp_path, train=TRAINING)["train"]
    (tmp_path / "links").mkdir()
    link = tmp_path / "links" / "train.py"
    link.symlink_to(real)
    assert convert_cli.run(["--inplace", str(link)]) == 0
    assert link.is_symlink() and link.resolve() == real
    assert "accelerator.backward(loss)" in real.read_text()
    assert [p.name for p in (tmp_path / "links").iterdir()] == ["train.py"]  # no temp left here


def test_lint_fix_on_a_symlink_rewrites_its_target_and_keeps_the_link(tmp_path: Path) -> None:
    real = tmp_path / "train.py"
    real.write_text(FIXABLE)
    link = tmp_path / "link.py"
    link.symlink_to(real)
    lint_cli.run(["--fix", str(link)])
    assert link.is_symlink() and real.read_text() != FIXABLE


def test_a_file_with_hard_links_is_not_rewritten_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _files(tmp_path, train=TRAINING)["train"]
    other = tmp_path / "same.py"
    os.link(path, other)
    assert convert_cli.run(["--inplace", str(path)]) == 2
    [error] = [line for line in _lines(capsys.readouterr().err) if "train.py" in line]
    assert "train.py:0: has 2 hard links, not rewritten" in error
    assert path.read_text() == other.read_text() == TRAINING
    assert os.path.samefile(path, other)


def test_sigterm_while_writing_leaves_the_file_whole_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _files(tmp_path, train=TRAINING)["train"]
    previous = signal.getsignal(signal.SIGTERM)
    console.exit_on_signals()
    try:
        monkeypatch.setattr(os, "fsync", lambda _fd: os.kill(os.getpid(), signal.SIGTERM))
        with pytest.raises(SystemExit) as stopped:
            sources.write_atomic(str(path), b"x = 1\n")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert path.read_text() == TRAINING
    assert [p.name for p in tmp_path.iterdir()] == ["train.py"]


def test_an_unwritable_folder_is_a_one_line_error_for_lint_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "train.py"
    path.write_text(
        "import torch\nfrom accelerate import Accelerator\n\naccelerator = Accelerator()\n"
        "model = accelerator.prepare(torch.nn.Linear(2, 2))\n"
        "torch.save(model.state_dict(), 'm.pt')\n"
    )

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(sources.tempfile, "mkstemp", refuse)
    assert lint_cli.run(["--fix", "--unsafe-fixes", str(path)]) == 2
    out = capsys.readouterr()
    assert "train.py:0: cannot write: Permission denied" in out.out + out.err
    assert "internal error" not in out.out + out.err


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"cells": "nope"}', 'no "cells" list'),
        ('{"cells": [{"cell_type": "code", "source": 3}]}', "cell 1 of 1 needs a cell_type"),
        ('{"cells": [', "not a Jupyter notebook: Expecting value"),
    ],
    ids=["cells-not-a-list", "source-not-text", "not-json"],
)
def test_a_malformed_notebook_is_refused_with_what_is_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    (tmp_path / "nb.ipynb").write_text(text)
    assert lint_cli.run([str(tmp_path / "nb.ipynb")]) == 2
    out = capsys.readouterr()
    assert message in out.out + out.err


@pytest.mark.parametrize("no_color", ["", "1"], ids=["styled", "NO_COLOR"])
def test_no_color_turns_every_escape_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    no_color: str,
) -> None:  # fmt: skip
    monkeypatch.setenv("FORCE_COLOR", "1")  # as on a terminal
    monkeypatch.setenv("NO_COLOR", no_color)
    _files(tmp_path, train=TRAINING)
    assert convert_cli.run(["--check", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert ("\x1b[" in out.out + out.err) is not bool(no_color)


def test_rule_without_a_code_lists_the_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert lint_cli.run(["rule"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ACL001  ") and len(lines) > 10


@pytest.mark.parametrize("other", ["python_ast", "ast.parse"])
def test_python_parses_from_two_threads_at_once(other: str) -> None:
    """Library users convert from threads; CPython 3.11's AST builder shares its recursion counter
    between threads, which fails the other thread's parse unless the calls are serialised, or, for
    a parse outside the lock (3.11's traceback formatting makes one), run again."""
    import ast
    import threading
    import time

    class SlowFinaliser:  # runs Python code (and switches threads) inside the AST builder's GC
        def __init__(self) -> None:
            self.cycle = self

        def __del__(self) -> None:
            time.sleep(0)

    text = (Path(__file__).parents[1] / "fixtures" / "convert" / "mnist.in.py").read_text() * 5
    errors: list[BaseException] = []

    def parse_at_depth(depth: int, parse: Callable[[str], object], mine: bool) -> None:
        if depth:
            return parse_at_depth(depth - 1, parse, mine)
        for _ in range(150):
            [SlowFinaliser() for _ in range(50)]
            try:
                parse(text)
            except SystemError as err:
                if mine:
                    errors.append(err)

    foreign = sources.python_ast if other == "python_ast" else ast.parse
    threads = [
        threading.Thread(target=parse_at_depth, args=(3, sources.python_ast, True)),
        threading.Thread(target=parse_at_depth, args=(40, foreign, other == "python_ast")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_every_python_parse_of_the_tools_and_the_oracle_goes_through_the_lock() -> None:
    """The lock above only helps if nothing parses beside it: the tools and the oracle (which
    judges from two threads) call ``sources.python_ast``, never ``ast.parse``."""
    root = Path(__file__).parents[1]
    folders = ("transform", "rules", "tests/oracle")
    direct = [
        f"{path.relative_to(root)}:{number}"
        for folder in folders
        for path in sorted((root / folder).rglob("*.py"))
        if path.name != "sources.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "ast.parse(" in line
    ]
    assert direct == []


# --- coding cookies ---------------------------------------------------------------------------

SHEBANG = b"#!/usr/bin/env python\n"


@pytest.mark.parametrize(
    "data, where, message",
    [
        (b"# -*- coding: rot13 -*-\nvzcbeg gbepu\n", 1, "rot13 is not a text encoding"),
        (b"# coding: hex\nx = 1\n", 1, "hex is not a text encoding"),
        (SHEBANG + b"# coding: nosuch\nx = 1\n", 2, "unknown encoding 'nosuch'"),
        (SHEBANG + b"# coding: utf-16\nx = 1\n", 2, "utf-16 cannot be a source encoding"),
    ],
    ids=["rot13", "hex", "unknown", "utf-16"],
)
def test_a_coding_cookie_python_refuses_is_one_line_at_the_cookie(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: bytes, where: int, message: str
) -> None:
    """Python refuses these files (``SyntaxError: encoding problem: rot13``); so do both tools,
    at the comment to fix, where ``bytes.decode`` raised LookupError (a traceback) before."""
    bad = tmp_path / "bad.py"
    bad.write_bytes(data)
    train = _files(tmp_path, train=TRAINING)["train"]
    python = subprocess.run(
        [sys.executable, str(bad)], capture_output=True, text=True, timeout=60, check=False
    )
    assert "SyntaxError: encoding problem" in python.stderr
    assert convert_cli.run(["--inplace", str(tmp_path)]) == 2
    assert lint_cli.run([str(tmp_path)]) == 2
    out = capsys.readouterr()
    lines = [line for line in _lines(out.out + out.err) if "bad.py" in line]
    expected = f"bad.py:{where}: encoding problem: {message}"
    assert len(lines) == 2 and all(expected in line for line in lines), lines
    assert "Traceback" not in out.err and "internal error" not in out.out + out.err
    assert bad.read_bytes() == data
    assert "accelerator.backward(loss)" in train.read_text()


def test_a_cookie_on_a_line_that_is_not_utf8_is_read_as_python_reads_it(tmp_path: Path) -> None:
    """``# coding: latin-1`` followed by an author's name in Latin-1: Python runs the file,
    ``tokenize.detect_encoding`` refuses it; the tools read it, and --inplace and --fix write
    back in Latin-1 exactly what they write for the decoded text: no other byte changes."""
    from accelify.transform.convert import convert

    head = "# -*- coding: latin-1 -*- (c) José\nname = 'café'\n"
    convert_me, fix_me = tmp_path / "convert_me.py", tmp_path / "fix_me.py"
    convert_me.write_bytes((head + TRAINING).encode("latin-1"))
    fix_me.write_bytes((head + FIXABLE).encode("latin-1"))
    assert convert_cli.run(["--inplace", str(convert_me)]) == 0
    assert convert_me.read_bytes() == convert(head + TRAINING).code.encode("latin-1")
    utf8 = tmp_path / "utf8.py"  # the same fix, in UTF-8, is the reference
    utf8.write_text(FIXABLE)
    lint_cli.run(["--fix", str(fix_me)])
    lint_cli.run(["--fix", str(utf8)])
    assert fix_me.read_bytes() == (head + utf8.read_text()).encode("latin-1")
    assert utf8.read_text() != FIXABLE


def test_a_codec_that_would_not_give_the_bytes_back_is_never_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Python runs a ``unicode_escape`` file, and the tools read it; but that codec's encoder
    writes each newline as ``\\n``: rewriting would turn the script into one line."""
    data = b"# coding: unicode_escape\n" + TRAINING.encode()
    path = tmp_path / "train.py"
    path.write_bytes(data)
    fixable = tmp_path / "fixable.py"
    fixable.write_bytes(b"# coding: unicode_escape\n" + FIXABLE.encode())
    assert convert_cli.run(["--inplace", str(path)]) == 2
    assert lint_cli.run(["--fix", str(fixable)]) == 2
    out = capsys.readouterr()
    message = ":0: not written: the unicode_escape codec would not give back the bytes it read"
    assert [line for line in _lines(out.out + out.err) if message in line] == [
        f"{path}{message} (save the file as UTF-8)",
        f"{fixable}{message} (save the file as UTF-8)",
    ]
    assert path.read_bytes() == data
    assert fixable.read_bytes() == b"# coding: unicode_escape\n" + FIXABLE.encode()


# --- notebooks Python's json module cannot hold, notebooks in other languages ----------------


def _notebook(metadata: dict[str, object], source: str = "x = 1\n") -> str:
    import json

    cell = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": []}
    book = {"cells": [{**cell, "source": source.splitlines(keepends=True)}], "metadata": metadata}
    return json.dumps({**book, "nbformat": 4, "nbformat_minor": 5}, indent=1) + "\n"


@pytest.mark.parametrize(
    "text, where, message",
    [
        (
            '{"cells": [],\n "metadata": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}",
            2,
            "not read: JSON nested 100002 deep, more than Python's json module reads",
        ),
        (
            '{"cells": [],\n "metadata": {"id": ' + "7" * 5000 + "}}",
            2,
            "not read: a number of 5000 digits, more than Python reads (4300;",
        ),
    ],
    ids=["nested-100000-deep", "5000-digit-integer"],
)
def test_notebook_json_that_python_cannot_hold_is_one_line_for_both_tools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, where: int, message: str
) -> None:
    """``json.loads`` raised RecursionError, or ValueError for Python 3.11's limit on the digits
    ``int()`` converts: each was a traceback (convert) or an "internal error" (lint)."""
    (tmp_path / "nb.ipynb").write_text(text)
    _files(tmp_path, train=TRAINING)
    assert convert_cli.run(["--check", str(tmp_path)]) == 2
    assert lint_cli.run([str(tmp_path)]) == 2
    out = capsys.readouterr()
    lines = [line for line in _lines(out.out + out.err) if "nb.ipynb" in line]
    expected = f"{tmp_path / 'nb.ipynb'}:{where}: {message}"
    assert len(lines) == 2 and all(line.startswith(expected) for line in lines), lines
    assert "Traceback" not in out.err and "internal error" not in out.out + out.err
    assert "1 file would be converted" in out.err  # train.py went on


def test_a_notebook_too_deep_to_write_back_is_one_line(tmp_path: Path) -> None:
    """JSON that ``json.loads`` just took can be too deep for ``json.dumps`` called from further
    down the stack, where a converted notebook is written."""
    from accelify.transform import ipynb

    def nested(depth: int) -> str:
        return '{"cells": [], "metadata": {"x": ' + "[" * depth + "0" + "]" * depth + "}}"

    depth = 1
    while depth < 100_000:  # the deepest this frame loads, found by loading
        try:
            ipynb.load("nb.ipynb", nested(depth + 1))
        except SourceError:
            break
        depth += 1
    text = nested(depth)
    book = ipynb.load("nb.ipynb", text)

    def dump_from(frames: int) -> str:
        return ipynb.dump(book, text, "nb.ipynb") if frames == 0 else dump_from(frames - 1)

    with pytest.raises(SourceError, match=r"^nb\.ipynb:1: not read: JSON nested \d+ deep"):
        dump_from(100)


@pytest.mark.parametrize(
    "metadata, language",
    [
        ({"kernelspec": {"language": "R", "name": "ir"}, "language_info": {"name": "R"}}, "R"),
        ({"kernelspec": {"language": "julia", "name": "julia-1.10"}}, "julia"),
        # language_info is what the running kernel said: it wins over the kernelspec
        ({"kernelspec": {"language": "python"}, "language_info": {"name": "scala"}}, "scala"),
    ],
    ids=["R", "julia-kernelspec-only", "language-info-wins"],
)
def test_a_notebook_in_another_language_is_skipped_with_one_line_not_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], metadata: dict[str, object],
    language: str,
) -> None:  # fmt: skip
    """Its cells are not Python: reading them as Python gave syntax errors (exit 2) on every
    run of a repository that also holds R notebooks. Skipped as Ruff skips one, but said, and
    the exit status is the other files' (here: nothing to change, nothing found)."""
    text = _notebook(metadata, "library(ggplot2)\nx <- c(1, 2)\n")
    path = tmp_path / "analysis.ipynb"
    path.write_text(text)
    assert convert_cli.run(["--check", str(tmp_path)]) == 0
    assert lint_cli.run([str(tmp_path)]) == 0
    out = capsys.readouterr()
    note = f"{path}:0: skipped: not a Python notebook (its language is {language!r})"
    assert [line for line in _lines(out.err) if "analysis.ipynb" in line] == [note, note]
    assert "0 files would be converted, 0 unchanged, 1 skipped" in out.err
    assert convert_cli.run(["--inplace", str(path)]) == 0
    assert convert_cli.run(["-o", str(tmp_path / "copy.ipynb"), str(path)]) == 0
    assert path.read_text() == (tmp_path / "copy.ipynb").read_text() == text  # passed through


@pytest.mark.parametrize(
    "metadata",
    [
        {"kernelspec": {"language": "python", "name": "python3"}},
        {"language_info": {"name": "Python"}},
        {},  # nothing said: Python, as Jupyter's default kernel is
    ],
    ids=["kernelspec-python", "language-info-python", "no-metadata"],
)
def test_a_python_notebook_is_still_read(tmp_path: Path, metadata: dict[str, object]) -> None:
    path = tmp_path / "train.ipynb"
    path.write_text(_notebook(metadata, TRAINING))
    assert convert_cli.run(["--check", str(path)]) == 1
    assert lint_cli.run([str(tmp_path / "train.ipynb")]) in (0, 1)


# --- folders the walk cannot list -------------------------------------------------------------


def _refusing(folder: Path) -> Callable[..., object]:
    """``os.scandir`` that refuses ``folder`` as a chmod 000 does for anyone but root."""
    scandir = os.scandir

    def refuse(path: object = ".") -> object:
        if os.path.realpath(os.fspath(path)) == os.path.realpath(folder):  # type: ignore[arg-type]
            raise PermissionError(13, "Permission denied", os.fspath(path))  # type: ignore[arg-type]
        return scandir(path)  # type: ignore[arg-type]

    return refuse


def test_an_unlistable_folder_is_one_line_and_walked_around(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``os.walk`` skips a folder it cannot list without a word, and its files with it. The
    refusal is made here, not with chmod: the tests run as root, whom chmod 000 does not stop
    (the next test does use chmod, without root's override)."""
    (tmp_path / "locked").mkdir()
    _files(tmp_path / "locked", hidden=TRAINING)
    train = _files(tmp_path, train=TRAINING)["train"]
    monkeypatch.setattr(os, "scandir", _refusing(tmp_path / "locked"))
    assert convert_cli.run(["--inplace", str(tmp_path)]) == 2
    assert lint_cli.run([str(tmp_path)]) == 2
    assert lint_cli.run(["-j", "2", str(tmp_path)]) == 2  # the error crosses to a worker and back
    out = capsys.readouterr()
    line = f"{tmp_path / 'locked'}:0: cannot list this folder (Permission denied): its files "
    line += "were skipped"
    assert [x for x in _lines(out.out + out.err) if "locked" in x] == [line] * 3
    assert "accelerator.backward(loss)" in train.read_text()
    assert (tmp_path / "locked" / "hidden.py").read_text() == TRAINING
    assert "1 file converted, 0 unchanged, 1 place to finish by hand, 1 error" in out.err


def test_an_unlistable_folder_git_ignores_is_not_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=60)
    (tmp_path / ".gitignore").write_text("secrets/\n")
    (tmp_path / "secrets").mkdir()
    _files(tmp_path, train=TRAINING)
    monkeypatch.setattr(os, "scandir", _refusing(tmp_path / "secrets"))
    assert convert_cli.run(["--check", str(tmp_path)]) == 1
    assert "secrets" not in capsys.readouterr().err


def _without_root_override() -> list[str] | None:
    """A command prefix under which chmod 000 stops this process's user, or None: nothing for
    another user, ``setpriv`` dropping root's capabilities to pass file permissions for root."""
    if os.geteuid() != 0:
        return []
    setpriv = "/usr/bin/setpriv"
    probe = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "true"]
    if Path(setpriv).exists() and subprocess.run(probe, check=False, timeout=60).returncode == 0:
        return probe[:-1]
    return None


def test_a_chmod_000_folder_is_one_line_for_both_tools(tmp_path: Path) -> None:
    prefix = _without_root_override()
    if prefix is None:
        pytest.skip("root, and no setpriv to drop root's permission override")
    locked = tmp_path / "locked"
    locked.mkdir()
    _files(locked, hidden=TRAINING)
    train = _files(tmp_path, train=TRAINING)["train"]
    locked.chmod(0)
    try:
        for tool, args in (("accel-convert", ["--inplace"]), ("accel-lint", [])):
            done = subprocess.run(
                [*prefix, str(Path(sys.executable).with_name(tool)), *args, str(tmp_path)],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            lines = [line for line in _lines(done.stderr) if "locked" in line]
            assert done.returncode == 2, done.stderr
            assert lines == [f"{locked}:0: cannot list this folder (Permission denied): its "
                             "files were skipped"], done.stderr  # fmt: skip
    finally:
        locked.chmod(0o755)
    assert "accelerator.backward(loss)" in train.read_text()
    assert (locked / "hidden.py").read_text() == TRAINING
