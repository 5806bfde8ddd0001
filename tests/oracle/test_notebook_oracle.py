"""The differential oracle on notebooks (notebooks.py): generated scripts of several layouts cut
into cells, converted as notebooks, and run as converted (plain, and with ``--notebook-launcher``
forking two workers). Each script is its own test, failing with its verdict and the command
that reproduces it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from generate import choose, generate
from notebooks import (
    SEED,
    WANTED,
    code_cells,
    converted,
    joined,
    judge_notebook,
    launch_verdict,
    notebook,
    sample,
)
from runner import REFUSED, Verdict

from accelify.transform.convert import Options, convert
from accelify.transform.sources import python_ast

SAMPLE = sample()


def _script(index: int) -> str:
    return generate(SEED, index)[1]


def test_sample_covers_the_layouts_with_notebooks_of_their_statements() -> None:
    for variants, count in WANTED:
        assert sum(variants.items() <= choose(SEED, index).items() for index in SAMPLE) >= count
    assert len(SAMPLE) == sum(count for _, count in WANTED)
    for index in SAMPLE:
        text = notebook(index)
        book = json.loads(text)
        assert book["nbformat"] == 4
        assert {cell["cell_type"] for cell in book["cells"]} == {"code"}
        assert len(code_cells(text)) == len(python_ast(_script(index)).body)
        assert joined(text) == _script(index)


def test_the_launcher_moves_some_of_the_sample() -> None:
    """Else the launcher's oracle would only ever see refusals."""
    moved = [
        index
        for index in SAMPLE
        if "notebook_launcher(training_function"
        in converted(_script(index), Options(), launcher=2).code
    ]
    assert moved, "no notebook of the sample has its training launched"


def _fail(index: int, verdict: Verdict, what: str) -> None:
    from sweep import short

    pytest.fail(
        f"notebook of script {index} of seed {SEED}, {what}: {verdict.category} "
        f"({verdict.check})\nvariants: {short(choose(SEED, index))}\n"
        f"reproduce: .venv/bin/python tests/oracle/notebooks.py {index} --dump /tmp/nb-oracle"
        f"\n\n{verdict.detail}\n" + "\n".join(verdict.notes),
        pytrace=False,
    )


def _verdicts(request: pytest.FixtureRequest, test: str, verdict: object) -> dict:
    """The selected scripts of ``test``, judged once by ``verdict``, two at a time."""
    pytest.importorskip("accelerate")
    from sweep import judge_selected

    return judge_selected(request.session.items, test, "index", _script, verdict)


@pytest.fixture(scope="module")
def plain(request: pytest.FixtureRequest) -> dict:
    return _verdicts(request, "test_converted_notebook_trains_like_the_original", judge_notebook)


@pytest.fixture(scope="module")
def launched(request: pytest.FixtureRequest) -> dict:
    return _verdicts(request, "test_notebook_launcher_trains_like_accel_run", launch_verdict)


@pytest.mark.slow
@pytest.mark.parametrize("index", SAMPLE)
def test_converted_notebook_trains_like_the_original(index: int, plain: dict) -> None:
    verdict = plain[index]
    if verdict.failed:
        _fail(index, verdict, "converted")
    if verdict.category == REFUSED and convert(_script(index), Options()).changed:
        _fail(index, verdict, "left unchanged although its script converts")


@pytest.mark.slow
@pytest.mark.parametrize("index", SAMPLE)
def test_notebook_launcher_trains_like_accel_run(index: int, launched: dict) -> None:
    verdict = launched[index]
    if verdict.failed:
        _fail(index, verdict, "with --notebook-launcher 2")
