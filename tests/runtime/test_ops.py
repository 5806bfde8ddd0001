"""Collectives and helpers on a single process, and the per-process split."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from accelify.runtime import Accelerator
from accelify.runtime.ops import split


def test_single_process_collectives_return_their_input() -> None:
    accelerator = Accelerator(cpu=True)
    data = {"a": torch.arange(3), "b": [torch.tensor(2.0)]}
    assert accelerator.gather(data) is data
    assert accelerator.pad_across_processes(data) is data
    reduced = accelerator.reduce(data, reduction="mean", scale=2.0)  # HF ignores scale off TPU
    assert reduced["a"].tolist() == [0, 1, 2] and reduced["b"][0].item() == 2.0
    assert reduced["a"] is not data["a"]
    assert accelerator.gather_for_metrics(["x", "y"]) == ["x", "y"]


def test_split_gives_the_first_processes_the_extra_items() -> None:
    items = list(range(7))
    assert [split(items, 3, rank, False) for rank in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [split(items, 3, rank, True) for rank in range(3)] == [[0, 1, 2], [3, 4, 4], [5, 6, 6]]
    padded = split(torch.arange(14).view(7, 2), 3, 2, True)
    assert padded.tolist() == [[10, 11], [12, 13], [12, 13]]
    letters = list("abcdefg")
    assert split({"n": items, "c": letters}, 3, 1, False) == {"n": [3, 4], "c": ["d", "e"]}
    with pytest.raises(ValueError, match="one length"):
        split({"a": [1], "b": [1, 2]}, 2, 0, False)


def test_main_process_helpers_run_on_the_only_process(capsys: pytest.CaptureFixture) -> None:
    accelerator = Accelerator(cpu=True)
    accelerator.print("hello")
    assert accelerator.on_main_process(lambda: 7)() == 7
    with accelerator.main_process_first():
        pass
    with accelerator.split_between_processes([1, 2]) as share:
        assert share == [1, 2]
    assert capsys.readouterr().out == "hello\n"


def _imported_after(statement: str, modules: tuple[str, ...]) -> list[str]:
    code = (
        f"import json, sys\n{statement}\n"
        f"print(json.dumps([m for m in {modules!r} if m in sys.modules]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout)


def test_importing_the_runtime_leaves_heavy_and_unrelated_modules_alone() -> None:
    heavy = ("deepspeed", "torch._dynamo", "libcst", "accelerate")
    # Every public name, the Accelerator included, is loaded by the star import.
    assert _imported_after("from accelify.runtime import *", heavy) == []


def test_the_package_loads_its_public_names_on_first_use() -> None:
    """accel-run's --help and config commands import accelify.runtime without needing torch."""
    assert _imported_after("import accelify.runtime", ("torch",)) == []
    assert _imported_after("from accelify.runtime import Accelerator", ("torch",)) == ["torch"]


def test_gather_of_anything_but_tensors_raises_on_several_processes(monkeypatch) -> None:
    """As in HF Accelerate: passed through, one process's number would stand for all of them."""
    from accelify.runtime import ops

    monkeypatch.setattr(ops, "is_distributed", lambda: True)
    for data in (1.5, [torch.tensor(1.0), 2], {"loss": 0.5}):
        with pytest.raises(TypeError, match="gather takes tensors"):
            ops.gather(data)

    @dataclasses.dataclass
    class Output:
        loss: torch.Tensor

    assert ops.only_tensors(Output(torch.tensor(1.0)))
    assert not ops.only_tensors(Output(1.0))
