"""accel-convert on Jupyter notebooks: the code cells converted as one script and split back,
everything else in the file kept, IPython lines untouched, errors named by cell."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from accelify.rules import notebook as lint_notebook
from accelify.transform import cli, ipynb
from accelify.transform import notebook as nb
from accelify.transform.convert import Options, Result, convert
from accelify.transform.notebook import convert_notebook

from ..oracle.notebook_cells import book, statement_cells
from .conftest import CASES_DIR, case_id, cases

GUIDE = CASES_DIR / "notebooks" / "guide.in.ipynb"


def _code_sources(text: str) -> list[str]:
    return [ipynb.source_of(c) for c in ipynb.code_cells(json.loads(text))]


def _without_sources(text: str) -> dict:
    book = json.loads(text)
    for cell in ipynb.code_cells(book):
        del cell["source"]
    return book


def _ipython_lines(text: str) -> list[str]:
    return [
        line
        for source in _code_sources(text)
        for line in (source.split("\n") if not ipynb.is_cell_magic(source) else [source])
        if ipynb.is_cell_magic(line) or ipynb.magic_indent(line) is not None
    ]


def _python_lines(text: str, *, blank: bool = True) -> list[str]:
    """The lines of ``text`` that are Python (not IPython), without blank ones unless ``blank``."""
    lines = text.split("\n")
    return [line for line in lines if ipynb.magic_indent(line) is None and (blank or line)]


def test_guide_notebook_matches_golden(file_regression) -> None:
    result = convert_notebook(GUIDE.read_text(), Options(), str(GUIDE))
    file_regression.check(result.code, fullpath=GUIDE.with_name("guide.out.ipynb"))
    report = "".join(
        "cell {}:{}: {}\n".format(*result.place(n.line), n.message) for n in result.notes
    )
    file_regression.check(report, fullpath=GUIDE.with_name("guide.notes.txt"))


def test_only_code_sources_change_and_keep_their_form() -> None:
    text = GUIDE.read_text()
    out = convert_notebook(text, Options(), str(GUIDE)).code
    assert out != text
    assert _without_sources(out) == _without_sources(text)  # outputs, counts, metadata, markdown
    before = [type(c["source"]) for c in json.loads(text)["cells"]]
    assert [type(c["source"]) for c in json.loads(out)["cells"]] == before
    assert str in before and list in before


def test_ipython_lines_come_back_byte_for_byte() -> None:
    text = GUIDE.read_text()
    magics = _ipython_lines(text)
    assert len(magics) == 4  # %pip, !nvidia-smi, %%bash cell, the indented %time
    assert _ipython_lines(convert_notebook(text, Options(), str(GUIDE)).code) == magics


def test_notebook_conversion_is_the_script_conversion_split() -> None:
    """The correctness argument: converting the cells joined as a .py file gives the same code
    as the notebook's conversion (cell ends may differ by blank lines)."""
    python = [s for s in _code_sources(GUIDE.read_text()) if not ipynb.is_cell_magic(s)]
    sources = ["\n".join(_python_lines(source)) for source in python]
    script = convert("".join(f"{s}\n" for s in sources), Options()).code
    cells = _code_sources(convert_notebook(book(*sources), Options(), "nb.ipynb").code)
    assert script != "".join(f"{s}\n" for s in sources)
    assert _python_lines("\n".join(cells), blank=False) == _python_lines(script, blank=False)


def _code_lines(text: str) -> list[str]:
    """The lines that hold code: cell ends may differ by blank lines, and a comment above a
    statement that gets code inserted before it ends the previous cell here."""
    return [line for line in text.split("\n") if line.strip() and not line.lstrip().startswith("#")]


# Scripts whose conversion moves two top-level statements into one block: cut into a cell each,
# they cannot be (a block cannot span cells), and the notebook reports the place instead.
_ONE_BLOCK = {"report/download_behind_a_name": "the test of the disk that decides it is made apart"}


@pytest.mark.parametrize("case", cases(), ids=case_id)
def test_every_golden_script_converts_the_same_cut_into_cells(case: Path) -> None:
    script = case.read_text()
    if script.startswith("# accel-convert:") or not ast.parse(script).body:
        pytest.skip("converted with options, or empty")
    cells = statement_cells(script)
    result = convert_notebook(book(*cells), Options(), "nb.ipynb")
    assert not [n for n in result.notes if "notebook left unchanged" in n.message]
    if (reported := _ONE_BLOCK.get(case_id(case))) is not None:
        assert any(n.manual and reported in n.message for n in result.notes)
        return
    converted = "\n".join(_code_sources(result.code))
    assert _code_lines(converted) == _code_lines(convert(script, Options()).code)


def test_converting_twice_changes_nothing() -> None:
    once = convert_notebook(GUIDE.read_text(), Options(), "nb.ipynb")
    twice = convert_notebook(once.code, Options(), "nb.ipynb")
    assert twice.code == once.code
    assert not [n for n in twice.notes if not (n.manual or n.info)]


@pytest.mark.parametrize("indent", [None, 1, 2, "\t"])
def test_json_layout_is_kept(indent: int | str | None) -> None:
    book = json.loads(GUIDE.read_text())
    book["metadata"]["title"] = "Entraînement"  # non-ASCII kept as it was written
    for ensure_ascii in (True, False):
        text = json.dumps(book, indent=indent, ensure_ascii=ensure_ascii) + "\n"
        out = convert_notebook(text, Options(), "nb.ipynb").code
        assert out != text
        assert out == json.dumps(json.loads(out), indent=indent, ensure_ascii=ensure_ascii) + "\n"


def test_a_notebook_with_nothing_to_convert_is_returned_as_it_came() -> None:
    text = book("print('hello')", "x = 1\n")
    text = text.replace(", ", ",  ")  # a layout json.dumps would not write
    result = convert_notebook(text, Options(), "nb.ipynb")
    assert result.code == text and not result.changed


def test_code_added_before_a_cells_first_statement_goes_into_that_cell() -> None:
    text = book(
        "import torch",
        "%%time\nprint('timing')",
        "model = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)",
        "for x, y in loader:\n    loss = model(x).sum()\n    loss.backward()\n    optimizer.step()",
    )
    cells = _code_sources(convert_notebook(text, Options(), "nb.ipynb").code)
    assert cells[0] == "import torch\nfrom accelify.runtime import Accelerator"
    assert cells[1] == "%%time\nprint('timing')"
    assert cells[2].startswith("accelerator = Accelerator(")


def test_an_ipython_line_keeps_the_indentation_of_the_block_it_ends_up_in() -> None:
    loop = "for x, y in loader:\n    loss = model(x).sum()\n    loss.backward()\n"
    loop += "    %time optimizer.step()"
    text = book("model = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)", loop)
    options = Options(gradient_accumulation_steps=2)
    cells = _code_sources(convert_notebook(text, options, "nb.ipynb").code)
    assert "    with accelerator.accumulate(model):\n" in cells[1]
    assert cells[1].endswith("\n        %time optimizer.step()")


def test_a_split_that_is_not_exact_leaves_the_notebook_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def drop_last_marker(source: str, options: Options, path: str) -> Result:
        code = re.sub(r'^"accelify-\w+ end of cell 2"\n', "", source, flags=re.MULTILINE)
        return Result(code.replace("x = 1", "x = 2"), original=source)

    monkeypatch.setattr(nb, "convert", drop_last_marker)
    text = book("x = 1", "y = 2")
    result = convert_notebook(text, Options(), "nb.ipynb")
    assert result.code == text
    [note] = result.notes
    assert note.manual and "notebook left unchanged: a cell boundary moved" in note.message


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "nb.ipynb:1: not a Jupyter notebook: Expecting property name"),
        ('{"cells": {}}', 'nb.ipynb:1: not a Jupyter notebook: no "cells" list'),
        (book("import torch", "%load_ext foo\nx = (1,\n"), "nb.ipynb:cell 2:2: syntax error:"),
        (book("!ls", "if x:\n    %time y\n  z = 1"), "nb.ipynb:cell 2:3: syntax error:"),
    ],
    ids=["not-json", "no-cells", "unclosed-bracket", "bad-indent"],
)
def test_errors_are_one_line_with_the_cell_and_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    text: str,
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("nb.ipynb").write_text(text)
    assert cli.run(["nb.ipynb"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 2  # the error, then the summary


def test_cli_writes_reports_by_cell_and_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "nb.ipynb"
    path.write_text(GUIDE.read_text())
    out = tmp_path / "out.ipynb"
    assert cli.run(["-v", str(path), "-o", str(out)]) == 0
    assert path.read_text() == GUIDE.read_text()
    assert out.read_text() == GUIDE.with_name("guide.out.ipynb").read_text()
    err = capsys.readouterr().err
    assert (
        f"{out}:cell 6:6: ACC108 loss.backward() -> accelerator.backward(loss) (was cell 6:8)"
        in err
    )

    assert cli.run(["--check", "-v", str(path)]) == 1
    assert f"{path}:cell 6:8: ACC108 loss.backward()" in capsys.readouterr().err
    assert cli.run(["--check", str(out)]) == 0
    assert cli.run(["--diff", str(path)]) == 1
    assert '+    "        accelerator.backward(loss)\\n",' in capsys.readouterr().out
    assert path.read_text() == GUIDE.read_text()

    assert cli.run(["--inplace", str(path)]) == 0
    assert path.read_text() == out.read_text()


def test_folders_give_notebooks_to_check_and_diff_but_not_to_inplace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "nb.ipynb").write_text(GUIDE.read_text())
    assert cli.run(["--check", str(tmp_path)]) == 1
    assert "1 file would be converted" in capsys.readouterr().err
    assert cli.run(["--inplace", str(tmp_path)]) == 0
    assert (tmp_path / "nb.ipynb").read_text() == GUIDE.read_text()
    assert "no Python files found" in capsys.readouterr().err


def _top_level(cell: str) -> list[ast.stmt]:
    lines = cell.split("\n")
    masked = "\n".join(
        line if (indent := ipynb.magic_indent(line)) is None else f"{indent}pass" for line in lines
    )
    return ast.parse(masked).body


def test_launcher_moves_the_training_and_every_cuda_touch_into_one_function() -> None:
    text = GUIDE.read_text()
    result = convert_notebook(text, Options(), "nb.ipynb", launcher=2)
    assert _without_sources(result.code) == _without_sources(text)
    cells = [c for c in _code_sources(result.code) if not ipynb.is_cell_magic(c)]
    training = cells[-2]  # the last code cell is empty in the guide
    function, call = _top_level(training)
    assert isinstance(function, ast.FunctionDef) and function.name == "training_function"
    assert ast.unparse(call) == "notebook_launcher(training_function, (), num_processes=2)"
    outside = [s for c in cells for s in _top_level(c) if ast.dump(s) != ast.dump(function)]
    names = {n.id for s in outside for n in ast.walk(s) if isinstance(n, ast.Name)}
    assert "accelerator" not in names and "cuda" not in "".join(map(ast.unparse, outside))
    assert "from accelify.runtime import notebook_launcher" in cells[1]
    assert "        %time print(" in training  # the IPython line moved with its loop
    assert any("run by notebook_launcher" in n.message for n in result.notes)
    again = convert_notebook(result.code, Options(), "nb.ipynb", launcher=2)
    assert again.code == result.code


@pytest.mark.parametrize(
    "first, last, why",
    [
        ("warm = torch.ones(1).cuda()", "", "cell 1:3 initialises CUDA outside"),
        ("", "model.eval()", "cell 4:1 reads model, which only"),
    ],
    ids=["cuda-before-the-fork", "a-later-cell-reads-the-model"],
)
def test_launcher_refuses_what_the_fork_would_break(first: str, last: str, why: str) -> None:
    setup = "model = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)"
    loop = "for x in loader:\n    loss = model(x).sum()\n    loss.backward()\n    optimizer.step()"
    text = book(f"import torch\n{first}".strip(), setup, loop, last)
    result = convert_notebook(text, Options(), "nb.ipynb", launcher=2)
    plain = convert_notebook(text, Options(), "nb.ipynb")
    assert result.code == plain.code  # converted cell by cell, not launched
    [note] = [n for n in result.notes if n.manual]
    assert note.message.startswith(f"training not launched: {why}")


@pytest.mark.parametrize(
    "header", ["", "# a notebook\n# about training\n"], ids=["bare", "comments"]
)
def test_launcher_refusal_names_the_line_of_the_code(header: str) -> None:
    """Comments above a statement (the file's first ones included) do not move the line."""
    cells = [
        f"{header}import torch",
        "loader = [torch.ones(2)]",
        "# warm the device up\nwarm = torch.ones(1).cuda()",
        "model = torch.nn.Linear(2, 1)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)",
        "for x in loader:\n    loss = model(x).sum()\n    loss.backward()\n    optimizer.step()",
    ]
    result = convert_notebook(book(*cells), Options(), "nb.ipynb", launcher=2)
    [note] = [n.message for n in result.notes if n.message.startswith("training not launched")]
    assert note.startswith("training not launched: cell 3:2 initialises CUDA")


def test_launcher_is_for_notebooks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "train.py").write_text("x = 1\n")
    assert cli.run(["--notebook-launcher", "2", str(tmp_path / "train.py")]) == 2
    assert "train.py:0: --notebook-launcher is for notebooks (.ipynb)" in capsys.readouterr().err


def test_a_shell_command_continued_with_backslashes_is_one_ipython_command() -> None:
    """``!pip install -q \\`` goes on over the next lines, indented or not: they are the
    command's, not Python (both tools read them alike)."""
    install = "!pip install -q \\\n    torch \\\n    accelerate\nimport torch"
    training = "model = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    training += "for x, y in loader:\n    loss = model(x).sum()\n    loss.backward()\n"
    training += "    optimizer.step()"
    text = book(install, training)
    cells = _code_sources(convert_notebook(text, Options(), "nb.ipynb").code)
    assert cells[0].startswith("!pip install -q \\\n    torch \\\n    accelerate\nimport torch\n")
    lint_text = lint_notebook.parse("nb.ipynb", text).text
    assert lint_text.startswith("pass\npass\npass\nimport torch\n")


@pytest.mark.parametrize(
    "cell",
    [
        "print('epoch %d, loss %.3f'\n      % (epoch, loss))",  # d2l's print(... % (...))
        "text = '''\n%d done\n'''",
        "total = 7 \\\n% 2",
        "rows = [\n    '%s' % name\n    for name in names\n]",
        "changed = (loss\n           != best)",  # a '!' that starts a continued line: !=
    ],
)
def test_a_percent_that_continues_a_python_line_is_python(cell: str) -> None:
    """As in IPython, ``%`` starts a magic only at the start of a logical line: inside brackets,
    a triple-quoted string or after a backslash it is Python's operator (both tools read alike)."""
    lines = ipynb._LINE.findall(cell)
    assert list(ipynb.magic_indents(lines)) == [None] * len(lines)
    text = book(cell)
    assert convert_notebook(text, Options(), "nb.ipynb").code == text
    assert lint_notebook.parse("nb.ipynb", text).text.startswith(cell)


@pytest.mark.parametrize(
    "cell",
    ["%matplotlib inline", "x = (1 +\n     2)\n%time f(x)", "# a comment ending in \\\n!ls"],
)
def test_a_magic_after_a_closed_python_line_is_still_a_magic(cell: str) -> None:
    lines = ipynb._LINE.findall(cell)
    assert list(ipynb.magic_indents(lines))[-1] == ""


@pytest.mark.parametrize(
    "cell", ["pip install -r requirements.txt", "cd data", "conda install -y faiss-cpu"]
)
def test_a_magic_called_without_its_percent_is_a_magic(cell: str) -> None:
    """IPython's automagic runs ``pip install ...`` as ``%pip``: the converter keeps it as it
    keeps ``%pip``, instead of calling a notebook that runs a syntax error (TimesNet's tutorial).
    """
    training = "model = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    training += "for x, y in loader:\n    loss = model(x).sum()\n    loss.backward()\n"
    training += "    optimizer.step()"
    text = book(cell, "import torch", training)
    cells = _code_sources(convert_notebook(text, Options(), "nb.ipynb").code)
    assert cells[0] == cell and "accelerator.backward(loss)" in cells[2]


@pytest.mark.parametrize("line", ["ls -la", "time = 3", "cd", "pip(install)", "run = lambda: 1"])
def test_a_magic_name_in_a_line_of_python_is_python(line: str) -> None:
    assert ipynb.magic_indent(line) is None


def test_lines_cited_in_a_reason_are_named_by_cell() -> None:
    """A reason that cites another line (``after line N already uses ...``) names it as the reader
    finds it, by cell: the converter counts lines of the joined program."""
    setup = (
        "import torch\nloader = torch.utils.data.DataLoader(range(8))\nnet = torch.nn.Linear(1, 1)"
    )
    peek = "for x in loader:\n    net(x)"
    train = (
        "opt = torch.optim.SGD(net.parameters())\nfor x in loader:\n    net(x).sum().backward()\n"
    )
    train += "    opt.step()"
    result = convert_notebook(book(setup, peek, train), Options(), "nb.ipynb")
    (reason,) = [n.message for n in result.notes if n.manual]
    assert "after cell 2:line 1 already uses" in reason


def test_training_imported_from_a_script_is_not_advised_to_join(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A notebook whose training runs in a function of ``engine.py`` is never joined with it
    (project mode joins scripts), so its report must not tell the user to give both files."""
    setup = "import torch\nfrom engine import train\nnet = torch.nn.Linear(1, 1)"
    setup += "\nopt = torch.optim.SGD(net.parameters(), lr=0.1)"
    loader = "loader = torch.utils.data.DataLoader(torch.randn(8, 1))"
    (tmp_path / "nb.ipynb").write_text(book(setup, loader, "train(net, opt, loader)"))
    engine = "def train(net, opt, loader):\n    for x in loader:\n        opt.zero_grad()\n"
    engine += "        net(x).sum().backward()\n        opt.step()\n"
    (tmp_path / "engine.py").write_text(engine)
    assert cli.run(["--check", "-v", str(tmp_path / "nb.ipynb"), str(tmp_path / "engine.py")]) == 0
    err = capsys.readouterr().err
    assert "nb.ipynb: nothing to convert" in err
    assert "ACR106" in err and "project mode joins scripts, not notebooks" in err
    assert "give it this file with the one that trains" not in err
