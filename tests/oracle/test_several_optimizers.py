"""The differential oracle on scripts with several models and optimizers (several.py): GANs
alternating their optimizers, actor-critic, encoder-decoder with one optimizer each, with and
without the script's own gradient accumulation. The verdict is runner.judge's: bit-identical
losses and weights on one process, identical ranks and disjoint shards on two."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runner import CONVERTED, WITH_NOTES
from several import AXES, name, render, sample, variants

SAMPLE = {name(choice): choice for choice in sample(seed=0)}


def test_every_variant_is_in_the_sample_and_compiles() -> None:
    seen = {(axis, c[axis]) for c in SAMPLE.values() for axis in AXES}
    assert seen == {(axis, v) for axis, values in AXES.items() for v in values}
    for choice in variants():
        compile(render(choice), name(choice), "exec")


@pytest.fixture(scope="module")
def verdicts(request: pytest.FixtureRequest) -> dict:
    """Judge the selected scripts once, two at a time."""
    pytest.importorskip("accelerate")
    from sweep import judge_selected

    return judge_selected(
        request.session.items,
        "test_several_optimizers_match_original",
        "script",
        lambda s: render(SAMPLE[s]),
    )


@pytest.mark.slow
@pytest.mark.parametrize("script", list(SAMPLE))
def test_several_optimizers_match_original(script: str, verdicts: dict) -> None:
    verdict = verdicts[script]
    # Every shape here converts fully: a refusal would be a regression, not a pass.
    if verdict.category not in (CONVERTED, WITH_NOTES):
        pytest.fail(
            f"{script}: {verdict.category} ({verdict.check})\n{verdict.detail}\n\n"
            f"{render(SAMPLE[script])}\n" + "\n".join(verdict.notes),
            pytrace=False,
        )
