"""The differential oracle in the default suite.

Fast tests check the generator itself (deterministic, compilable, varied, every variant reachable,
shrinking). The slow test judges a fixed sample of 10 scripts chosen so that every variant of the
catalogue appears in at least one of them (``sweep.py --count 300`` judges whole seeds); each
script is its own test, failing with the verdict and the command that reproduces it
(``sweep.py --only INDEX``, which also shrinks it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from generate import (
    AXES,
    RULES,
    all_variants,
    choose,
    consistent,
    covering_sample,
    free_names,
    generate,
    render,
    shrink,
    simplest,
)

SEED = 0
SAMPLE = covering_sample(SEED, 10)  # every variant at least once (the sweep goes deeper)


def _body(source: str) -> str:
    """The script without its header comment (which names the seed and index)."""
    return "\n".join(line for line in source.splitlines() if not line.startswith("# "))


def test_generation_is_deterministic() -> None:
    for index in (0, 1, 17, 299):
        assert generate(SEED, index) == generate(SEED, index)
    assert generate(SEED, 3)[1] != generate(SEED + 1, 3)[1]


def test_every_script_compiles_and_names_its_variants() -> None:
    for index in range(300):
        choice, source = generate(SEED, index)
        compile(source, f"script{index}.py", "exec")
        header = " ".join(line for line in source.splitlines()[:10] if line.startswith("# "))
        assert all(f"{axis}={variant}" in header for axis, variant in choice.items())


def test_at_least_300_distinct_scripts() -> None:
    assert len({_body(generate(SEED, i)[1]) for i in range(300)}) == 300


def test_at_least_40_variants() -> None:
    assert len(all_variants()) >= 40
    assert all(len(variants) >= 2 for variants in AXES.values())


def test_every_variant_is_reachable_and_in_the_sample() -> None:
    seen = {item for i in range(2000) for item in choose(SEED, i).items()}
    assert all_variants() - seen == set()
    in_sample = {item for i in SAMPLE for item in choose(SEED, i).items()}
    assert all_variants() - in_sample == set()


def test_choices_keep_the_rules() -> None:
    simplest_choice = {axis: simplest(axis) for axis in AXES}
    assert consistent(simplest_choice)
    for index in range(300):
        choice = choose(SEED, index)
        broken = [rule.why for rule in RULES if not rule.holds(choice)]
        assert not broken, (index, broken)


def test_shrink_keeps_only_what_the_failure_needs() -> None:
    choice = next(c for c in map(lambda i: choose(SEED, i), range(500)) if c["loop"] == "iter_for")

    def fails(c: dict[str, str]) -> bool:
        return c["loop"] == "iter_for"

    shrunk = shrink(choice, fails, budget=200)
    assert shrunk["loop"] == "iter_for"
    # Everything else is the simplest variant that the rules allow next to iter_for.
    assert consistent(shrunk)
    assert sum(v != simplest(a) for a, v in shrunk.items()) <= 2
    compile(render(shrunk), "shrunk.py", "exec")


def test_helper_parameters_are_the_names_the_body_reads() -> None:
    body = ["for x, y in train_loader:", "    loss = criterion(model(x), y)", "    print(epoch)"]
    assert free_names(body) == ["model", "train_loader", "criterion", "epoch"]


@pytest.fixture(scope="module")
def verdicts(request: pytest.FixtureRequest) -> dict:
    """Judge the selected scripts of the sample once, two at a time."""
    pytest.importorskip("accelerate")
    from sweep import judge_selected

    return judge_selected(
        request.session.items,
        "test_conversion_matches_original",
        "index",
        lambda i: generate(SEED, i)[1],
    )


@pytest.mark.slow
@pytest.mark.parametrize("index", SAMPLE)
def test_conversion_matches_original(index: int, verdicts: dict) -> None:
    from sweep import short

    verdict = verdicts[index]
    if verdict.failed:
        pytest.fail(
            f"script {index} of seed {SEED}: {verdict.category} ({verdict.check})\n"
            f"variants: {short(choose(SEED, index))}\n"
            f"reproduce and shrink: .venv/bin/python tests/oracle/sweep.py --only {index} "
            f"--dump /tmp/oracle\n\n{verdict.detail}",
            pytrace=False,
        )
