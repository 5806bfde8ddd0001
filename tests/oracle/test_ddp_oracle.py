"""The differential oracle on hand-written DDP scripts (ddp_programs.py): the original under
torchrun (or its own mp.spawn) against its conversion under accel-run, both on two CPU processes."""

from __future__ import annotations

import ast
import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ddp_programs import (
    AXES,
    convert_script,
    converted,
    differences,
    name,
    original,
    render,
    variants,
)

from accelify.transform.convert import convert
from accelify.transform.sources import python_ast

# Every value of every axis, in four runs.
SAMPLE = [
    {"launch": "torchrun", "wrap": "inline", "shuffle": "False", "save": "guarded",
     "reduce": "all_reduce"},
    {"launch": "spawn", "wrap": "ddp_model", "shuffle": "False", "save": "none", "reduce": "none"},
    {"launch": "tutorial", "wrap": "ddp_model", "shuffle": "True", "save": "helper",
     "reduce": "all_reduce"},
    {"launch": "tutorial", "wrap": "without_ddp", "shuffle": "True", "save": "guarded",
     "reduce": "none"},
]  # fmt: skip
SAMPLE = [
    {**choice, "accumulate": accumulate, "batching": batching, "backend": backend}
    for choice, accumulate, batching, backend in zip(
        SAMPLE,
        ("no_sync", "toggle", "none", "no_sync"),
        ("batch_sampler", "loader", "loader", "batch_sampler"),
        ("lookup", "literal", "lookup", "literal"),
        strict=True,
    )
]


def _main_of(code: str) -> str:
    """The converted ``main()`` function's source."""
    tree = python_ast(code)
    return next(
        ast.unparse(n) for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"
    )


def test_sample_covers_every_axis_value() -> None:
    seen = {(axis, choice[axis]) for choice in SAMPLE for axis in AXES}
    assert seen == {(a, v) for a, values in AXES.items() for v in values}


def _torchrun_forms() -> list[dict[str, str]]:
    """Each torchrun variant of the axes that shape the training once, the batching and the
    backend axes taking turns: the spawned forms differ from it only in how the processes
    start."""
    turns = itertools.cycle(itertools.product(AXES["batching"], AXES["backend"]))
    return [
        {**c, **dict(zip(("batching", "backend"), next(turns), strict=True))}
        for c in variants()
        if c["launch"] == "torchrun"
        and c["batching"] == AXES["batching"][0]
        and c["backend"] == AXES["backend"][0]
    ]


@pytest.mark.parametrize("choice", _torchrun_forms(), ids=name)
@pytest.mark.parametrize("launch", ["spawn", "tutorial"])
def test_torchrun_and_spawn_forms_convert_to_the_same_main(
    choice: dict[str, str], launch: str
) -> None:
    torchrun_result = convert(render(choice))
    spawn_result = convert(render({**choice, "launch": launch}))
    assert torchrun_result.changed and not torchrun_result.manual
    assert not spawn_result.manual, spawn_result.notes
    assert _main_of(torchrun_result.code) == _main_of(spawn_result.code)
    for gone in ("torch.distributed", "mp.spawn", "DistributedSampler", "init_process_group"):
        assert gone not in spawn_result.code


@pytest.mark.slow
@pytest.mark.parametrize("choice", SAMPLE, ids=name)
def test_converted_ddp_script_trains_like_the_original(choice: dict[str, str]) -> None:
    source = render(choice)
    before = original(source, choice)
    assert before.code == 0 and before.result is not None, before.output
    after = converted(convert_script(source))
    assert after.code == 0 and after.result is not None, after.output
    assert differences(choice, before.result, after.result) == []
