"""The oracle's mutation mode in the default suite.

Fast tests check the mutators: each finds its anchor in some seed, every mutant is valid Python
that differs from its seed, and the anchors are found by syntax. The slow test judges one mutant
per mutator (the first seed it applies to); ``mutate.py`` judges all of them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import libcst as cst
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mutate import MUTATORS, SEEDS, anchors, mutants
from runner import UNEXPLAINED, WRONG

MUTANTS = mutants()


def test_every_mutator_applies_to_some_seed() -> None:
    applied = {name.split(".", 1)[1] for name in MUTANTS}
    assert applied == set(MUTATORS)


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_a_mutant_is_python_and_differs_from_its_seed(name: str) -> None:
    seed = SEEDS[name.split(".", 1)[0]][0].read_text()
    compile(MUTANTS[name], name, "exec")
    assert MUTANTS[name] != seed


def test_the_anchors_are_the_optimizer_s_model_and_the_backward_s_loss() -> None:
    found = anchors(cst.parse_module(SEEDS["dcgan"][0].read_text()))
    assert found is not None
    assert (found.model, found.loss) == ("netD", "errD_real")
    found = anchors(cst.parse_module(SEEDS["trainer_class"][0].read_text()))
    assert found is not None and found.model == "self.model"


SAMPLE = sorted({name.split(".", 1)[1]: name for name in sorted(MUTANTS)}.values())


@pytest.fixture(scope="module")
def verdicts(request: pytest.FixtureRequest) -> dict:
    from runner import judge
    from sweep import judge_selected

    def verdict(source: str, name: str, runner) -> object:
        seed = name.removeprefix("sample_").split(".", 1)[0]
        return judge(source, name.replace(".", "_"), runner, train_size=SEEDS[seed][1])

    items = request.session.items
    return judge_selected(items, "test_mutant_is_right_or_refused", "name", MUTANTS.get, verdict)


@pytest.mark.slow
@pytest.mark.parametrize("name", SAMPLE)
def test_mutant_is_right_or_refused(name: str, verdicts: dict) -> None:
    verdict = verdicts[name]
    assert verdict.category not in (WRONG, UNEXPLAINED), (
        f"{verdict.category} {verdict.check}: {verdict.detail[:1500]}\n"
        f"again: python tests/oracle/mutate.py --only {name} --dump DIR"
    )
