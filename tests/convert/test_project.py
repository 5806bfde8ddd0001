"""Project mode: a script and the modules it imports its training from, converted together.

Each folder of fixtures/project holds ``in/`` (the program as written), ``out/`` (its reviewed
conversion) and ``notes.txt`` (the report); tests/oracle/test_project_oracle.py runs them."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from accelify.transform import cli
from accelify.transform.plan import Options
from accelify.transform.project import Program, convert_program, programs

ROOT = Path(__file__).resolve().parents[2]
PROJECTS = sorted((ROOT / "fixtures" / "project").iterdir())


def _files(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.glob("*.py"))


def _converted(folder: Path) -> dict[str, tuple[str, list[str]]]:
    """File name -> (converted code, report lines) for every file of ``folder``."""
    out = {}
    for program in programs(_files(folder)):
        for path, (_source, result) in convert_program(program, Options()).items():
            lines = [
                f"{Path(path).name}:{n.line}: {'needs a human: ' if n.manual else ''}{n.message}"
                for n in result.notes
            ]
            out.setdefault(Path(path).name, (result.code, lines))
    return out


@pytest.mark.parametrize("case", PROJECTS, ids=lambda p: p.name)
def test_program_conversion_matches_golden(case: Path, file_regression) -> None:
    converted = _converted(case / "in")
    assert sorted(converted) == sorted(p.name for p in (case / "in").glob("*.py"))
    for name, (code, _lines) in converted.items():
        file_regression.check(code, fullpath=case / "out" / name)
    report = [line for name in sorted(converted) for line in converted[name][1]]
    file_regression.check("\n".join(report) + "\n", fullpath=case / "notes.txt")


@pytest.mark.parametrize("case", PROJECTS, ids=lambda p: p.name)
def test_converting_a_converted_program_again_changes_nothing(case: Path, tmp_path: Path) -> None:
    shutil.copytree(case / "in", tmp_path, dirs_exist_ok=True)  # with the folders beside it
    shutil.copytree(case / "out", tmp_path, dirs_exist_ok=True)
    for name, (code, _lines) in _converted(tmp_path).items():
        assert code == (case / "out" / name).read_text(), name


def test_the_modules_of_a_program_are_found_beside_the_script(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    _write(tmp_path / "pkg" / "steps.py", "def step(loss):\n    loss.backward()\n")
    _write(tmp_path / "helpers.py", "def build():\n    return 1\n")  # trains nothing
    _write(
        tmp_path / "main.py", "import os\nfrom helpers import build\nfrom pkg.steps import step\n"
    )
    found = programs([*_files(tmp_path), str(tmp_path / "pkg" / "steps.py")])
    assert found == [
        Program(str(tmp_path / "main.py"), (str(tmp_path / "pkg" / "steps.py"),), line=3)
    ]


def test_one_file_given_is_converted_alone(tmp_path: Path, capsys) -> None:
    shutil.copytree(PROJECTS[0] / "in", tmp_path, dirs_exist_ok=True)
    assert cli.run(["--check", "-v", str(tmp_path / "main.py")]) == 0
    assert "ACR106" in capsys.readouterr().err


def test_inplace_writes_every_file_of_the_program(tmp_path: Path, capsys) -> None:
    case = next(p for p in PROJECTS if p.name == "engine_main")
    shutil.copytree(case / "in", tmp_path, dirs_exist_ok=True)
    assert cli.run(["--inplace", str(tmp_path)]) == 0
    for name in ("main.py", "engine.py"):
        assert (tmp_path / name).read_text() == (case / "out" / name).read_text()
    assert "2 files converted" in capsys.readouterr().err
    assert cli.run(["--check", str(tmp_path)]) == 0


@pytest.mark.parametrize(
    ("module", "script", "reason"),
    [
        (
            "model = None\n\ndef step(loss):\n    loss.backward()\n",
            "from engine import step\nmodel = 1\n",
            "model is a different global in each file",
        ),
        (
            "def step(loss):\n    print(model)\n    loss.backward()\n",
            "from engine import step\nmodel = 1\n",
            "engine.py reads model without defining it",
        ),
        (
            "def step(loss):\n    loss.backward()\n",
            "from engine import step as train_step\n",
            "engine.py's names are imported under other names",
        ),
        (
            "def step(loss):\n    loss.backward()\n\nif __name__ == '__main__':\n    pass\nX = 1\n",
            "from engine import step\n",
            "engine.py has code after its __main__ block",
        ),
    ],
)
def test_files_that_cannot_share_one_text_stay_unchanged(
    tmp_path: Path, module: str, script: str, reason: str
) -> None:
    _write(tmp_path / "engine.py", module)
    _write(tmp_path / "main.py", script)
    (program,) = programs(_files(tmp_path))
    results = convert_program(program, Options())
    for path, (source, result) in results.items():
        assert not result.changed, path
        (note,) = result.notes
        assert reason in note.message and note.refusal == "ACR108"
        assert note.line == 1
        assert source.text == Path(path).read_text()


def test_a_module_that_would_read_the_scripts_accelerator_is_refused(tmp_path: Path) -> None:
    """A function of the module nested in another cannot be handed the accelerator: one text
    would let it read the script's global, two files would not."""
    _write(
        tmp_path / "engine.py",
        """
        def make_step():
            def step(model, optimizer, loader):
                for x, y in loader:
                    optimizer.zero_grad()
                    model(x).sum().backward()
                    optimizer.step()
                    print(x)
            return step
        """,
    )
    _write(
        tmp_path / "main.py",
        """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        from engine import make_step

        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=2)
        make_step()(model, optimizer, loader)
        """,
    )
    (program,) = programs(_files(tmp_path))
    for _path, (_source, result) in convert_program(program, Options()).items():
        assert not result.changed


_SCRIPT = """
import torch
from torch.utils.data import DataLoader, TensorDataset
from engine import train

model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=2)
train(model, optimizer, loader)
"""
_ENGINE = """
def train(model, optimizer, loader):
    for x, y in loader:
        optimizer.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()
"""


def test_the_plain_pair_converts(tmp_path: Path) -> None:
    """The baseline of the two refusals below: the same files, nothing else, convert."""
    _write(tmp_path / "engine.py", _ENGINE)
    _write(tmp_path / "main.py", _SCRIPT)
    (program,) = programs(_files(tmp_path))
    assert all(r.changed for _s, r in convert_program(program, Options()).values())


def test_a_main_block_calling_a_changed_function_keeps_the_program_unchanged(
    tmp_path: Path,
) -> None:
    _write(tmp_path / "engine.py", _ENGINE + "\nif __name__ == '__main__':\n    train(*build())\n")
    _write(tmp_path / "main.py", _SCRIPT)
    (program,) = programs(_files(tmp_path))
    results = convert_program(program, Options())
    assert not any(r.changed for _s, r in results.values())
    message = results[str(tmp_path / "main.py")][1].notes[0].message
    assert "engine.py's __main__ block calls train, which the conversion changes" in message


@pytest.mark.parametrize("other", ["import engine\n", "def f():\n    from engine import train\n"])
def test_a_module_another_file_imports_keeps_the_program_unchanged(
    tmp_path: Path, other: str
) -> None:
    _write(tmp_path / "engine.py", _ENGINE)
    _write(tmp_path / "main.py", _SCRIPT)
    _write(tmp_path / "other.py", other)
    (program,) = programs(_files(tmp_path))
    assert program.conflict is not None and "main.py and other.py" in program.conflict
    assert not any(r.changed for _s, r in convert_program(program, Options()).values())


def _write(path: Path, text: str) -> None:
    path.write_text(textwrap.dedent(text).lstrip("\n"))
