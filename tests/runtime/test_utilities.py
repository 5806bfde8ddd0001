"""HF Accelerate's standalone utilities (``accelerate.utils`` and ``accelerate.logging``), checked
against HF's own functions where both can run on the same input."""

from __future__ import annotations

import collections
import inspect
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import accelerate.logging
import accelerate.utils
import pytest
import torch

import accelify.runtime
from accelify.runtime import (
    Accelerator,
    RNGType,
    find_executable_batch_size,
    get_logger,
    release_memory,
    send_to_device,
    state,
    synchronize_rng_state,
)

from .test_multiprocess import _run

TWO_RANKS = Path(__file__).resolve().parents[2] / "fixtures" / "runtime" / "utilities_two_ranks.py"


@pytest.mark.parametrize(
    "name",
    [
        "find_executable_batch_size",
        "release_memory",
        "send_to_device",
        "broadcast_object_list",
        "synchronize_rng_state",
        "synchronize_rng_states",
        "get_logger",
    ],
)
def test_parameters_are_hfs(name: str) -> None:
    """Same names, kinds and defaults, so keyword calls written for HF keep working."""
    theirs = getattr(accelerate.logging if name == "get_logger" else accelerate.utils, name)

    def parameters(function: Any) -> list[tuple]:
        found = inspect.signature(function).parameters.values()
        return [(p.name, p.kind, p.default) for p in found]

    assert parameters(getattr(accelify.runtime, name)) == parameters(theirs)


# --- find_executable_batch_size --------------------------------------------------------------


def _cuda_out_of_memory() -> None:
    raise torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB "
        "of which 1.06 GiB is free."
    )


def _cpu_out_of_memory() -> None:
    torch.empty(2**48, dtype=torch.uint8)  # 256 TiB: the allocator refuses it at once


def _training(fits_up_to: int, out_of_memory: Any) -> tuple[Any, list[int]]:
    """A ``train(batch_size, steps)`` that runs out of memory above ``fits_up_to``."""
    tried: list[int] = []

    def train(batch_size: int, steps: int) -> tuple[int, int]:
        tried.append(batch_size)
        if batch_size > fits_up_to:
            out_of_memory()
        return batch_size, steps

    return train, tried


@pytest.mark.parametrize("out_of_memory", [_cuda_out_of_memory, _cpu_out_of_memory])
def test_batch_size_shrinks_after_out_of_memory_as_in_hf(out_of_memory: Any) -> None:
    ours, ours_tried = _training(50, out_of_memory)
    theirs, theirs_tried = _training(50, out_of_memory)
    result = find_executable_batch_size(ours, starting_batch_size=128)(steps=3)
    expected = accelerate.utils.find_executable_batch_size(theirs, starting_batch_size=128)(steps=3)
    assert ours_tried == theirs_tried == [128, 115, 103, 92, 82, 73, 65, 58, 52, 46]
    assert result == expected == (46, 3)


def test_the_batch_size_found_is_kept_for_later_calls() -> None:
    train, tried = _training(120, _cuda_out_of_memory)
    decorated = find_executable_batch_size(starting_batch_size=128)(train)
    assert decorated(1) == (115, 1)
    assert decorated(2) == (115, 2)
    assert tried == [128, 115, 115]


def test_a_custom_reduction_chooses_the_next_batch_size() -> None:
    train, tried = _training(10, _cuda_out_of_memory)
    sizes = iter([32, 8])
    decorated = find_executable_batch_size(
        train, starting_batch_size=64, reduce_batch_size_fn=lambda: next(sizes)
    )
    assert decorated(1) == (8, 1)
    assert tried == [64, 32, 8]


def test_always_out_of_memory_stops_at_zero_with_hfs_message() -> None:
    ours, ours_tried = _training(0, _cpu_out_of_memory)
    theirs, theirs_tried = _training(0, _cpu_out_of_memory)
    with pytest.raises(RuntimeError) as raised:
        find_executable_batch_size(ours, starting_batch_size=16)(steps=1)
    with pytest.raises(RuntimeError) as hf_raised:
        accelerate.utils.find_executable_batch_size(theirs, starting_batch_size=16)(steps=1)
    assert str(raised.value) == str(hf_raised.value)
    assert str(raised.value) == "No executable batch size found, reached zero."
    assert ours_tried == theirs_tried == [16, 14, 12, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1]


@pytest.mark.parametrize(
    "error",
    [ValueError("bad input"), RuntimeError("Expected all tensors to be on the same device")],
)
def test_errors_other_than_out_of_memory_propagate_at_once(error: Exception) -> None:
    tried = []

    @find_executable_batch_size(starting_batch_size=8)
    def train(batch_size: int) -> None:
        tried.append(batch_size)
        raise error

    with pytest.raises(type(error), match=str(error)):
        train()
    assert tried == [8]


def test_passing_the_batch_size_is_refused_before_running() -> None:
    tried = []

    @find_executable_batch_size(starting_batch_size=8)
    def train(batch_size: int, model: str) -> None:
        tried.append(batch_size)

    message = r"Batch size was passed into `train`.*`train\(model='m'\)`"
    with pytest.raises(TypeError, match=message):
        train(8, "m")
    assert tried == []
    train("m")
    assert tried == [8]


def test_release_memory_returns_one_none_per_object() -> None:
    a, b = torch.ones(3), [torch.zeros(2)]
    assert release_memory(a, b) == [None, None] == accelerate.utils.release_memory(a, b)


# --- send_to_device ----------------------------------------------------------------------------

Pair = collections.namedtuple("Pair", ["inputs", "labels"])


class Batch(dict):
    """A dict subclass, as tokenizers' outputs and many datasets' batches are."""


class Movable:
    """Not a tensor, but has ``.to`` (without ``non_blocking``, which HF retries without)."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def to(self, device: Any) -> Movable:
        return Movable(str(device))


def _devices(data: Any) -> Any:
    """``data``'s structure with each leaf replaced by its device (or kept), types included."""
    if isinstance(data, torch.Tensor):
        return str(data.device)
    if isinstance(data, Movable):
        return f"movable:{data.device}"
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return (type(data).__name__, *map(_devices, data))
    if isinstance(data, (list, tuple)):
        return (type(data).__name__, *map(_devices, data))
    if isinstance(data, dict):
        return (type(data).__name__, {key: _devices(value) for key, value in data.items()})
    return data


def test_send_to_device_keeps_container_types_like_hf() -> None:
    batch = Batch(
        pair=Pair(torch.ones(2), [torch.zeros(1), "text", 3]),
        nested={"mask": torch.ones(1)},
        extra=Movable(),
    )
    moved = send_to_device(batch, "meta")
    assert type(moved) is Batch and type(moved["pair"]) is Pair
    assert _devices(moved) == _devices(accelerate.utils.send_to_device(batch, "meta"))
    assert _devices(moved) == (
        "Batch",
        {
            "pair": ("Pair", "meta", ("list", "meta", "text", 3)),
            "nested": ("dict", {"mask": "meta"}),
            "extra": "movable:meta",
        },
    )


@pytest.mark.parametrize("skip_keys", ["labels", ["labels", "ids"]])
def test_send_to_device_leaves_skipped_keys_where_they_are(skip_keys: Any) -> None:
    batch = {"ids": torch.ones(2), "labels": torch.ones(2), "inner": {"labels": torch.ones(1)}}
    moved = send_to_device(batch, torch.device("meta"), skip_keys=skip_keys)
    hf_moved = accelerate.utils.send_to_device(batch, torch.device("meta"), skip_keys=skip_keys)
    assert _devices(moved) == _devices(hf_moved)
    assert moved["labels"] is batch["labels"]
    assert moved["inner"]["labels"] is batch["inner"]["labels"]
    assert moved["ids"].device.type == ("cpu" if "ids" in skip_keys else "meta")


# --- get_logger ----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def root_level_kept() -> Any:
    """``get_logger(name, log_level)`` sets the root logger's level too, as HF's does."""
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)


def test_the_logger_needs_the_state_first_with_hfs_message() -> None:
    message = r"calling either `PartialState\(\)` or `Accelerator\(\)`"
    with pytest.raises(RuntimeError, match=message):
        get_logger("early").info("too soon")


def test_the_logger_marks_the_rank_and_reports_the_callers_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    Accelerator(cpu=True)
    logger = get_logger("single", log_level="INFO")
    logger.info("loss %.1f", 0.5)
    logger.log(logging.INFO, "direct")
    logger.warning_once("once")
    logger.warning_once("once")
    assert [r.getMessage() for r in caplog.records] == [
        "[RANK 0] loss 0.5",
        "[RANK 0] direct",
        "[RANK 0] once",
    ]
    assert {r.filename for r in caplog.records} == {Path(__file__).name}


def test_other_processes_log_only_when_asked(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    second = state.ProcessState(2, 1, 1, torch.device("cpu"), state.DistributedType.MULTI_CPU, True)
    monkeypatch.setitem(state._resolved, "state", second)  # as rank 1 of 2 (no collective made)
    logger = get_logger("second", log_level="INFO")
    logger.info("main only")
    logger.info("everyone", main_process_only=False)
    assert [r.getMessage() for r in caplog.records] == ["[RANK 1] everyone"]


def test_log_level_comes_from_the_argument_or_accelerate_log_level(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = logging.getLogger()
    assert get_logger("by_argument", log_level="debug").logger.level == logging.DEBUG
    monkeypatch.setenv("ACCELERATE_LOG_LEVEL", "error")
    assert get_logger("by_environment").logger.level == logging.ERROR
    assert root.level == logging.ERROR


def test_the_logging_module_hides_no_standard_module() -> None:
    """``accelify.runtime.logging`` must not stand in for the standard library's ``logging``."""
    code = (
        "import logging, accelify.runtime.logging as ours, accelify.runtime.launch.run as run\n"
        "assert run.logging is logging and ours.logging is logging, logging\n"
        "assert logging.__file__.endswith('/logging/__init__.py'), logging.__file__\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- RNG states ----------------------------------------------------------------------------------


def test_rng_types_are_hfs_and_hfs_own_members_are_accepted() -> None:
    assert {t.value for t in RNGType} == {t.value for t in accelerate.utils.RNGType}
    generator = torch.Generator().manual_seed(3)
    synchronize_rng_state(accelerate.utils.RNGType.GENERATOR, generator=generator)  # 1 process
    assert torch.equal(generator.get_state(), torch.Generator().manual_seed(3).get_state())
    with pytest.raises(ValueError, match="Need a generator"):
        synchronize_rng_state("generator")
    with pytest.raises(RuntimeError, match="Can't synchronize xla seeds"):
        synchronize_rng_state(RNGType.XLA)


# --- two processes -------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_processes_share_objects_random_states_and_log_in_order(tmp_path: Path) -> None:
    _run(tmp_path, processes=2, script=TWO_RANKS)
    first, second = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert first["from_zero"] == second["from_zero"] == ["made by 0", {"rank": 0}, [0]]
    assert first["from_one"] == second["from_one"] == ["made by 1"]
    assert first["before"] != second["before"]  # seeded differently: the check can fail
    assert first["torch"] == second["torch"]
    assert first["generator"] == second["generator"]
    lines = (tmp_path / "log.txt").read_text().splitlines()
    assert lines.count("[RANK 0] main only") == 1 and "[RANK 1] main only" not in lines
    assert {"[RANK 0] everyone", "[RANK 1] everyone"} <= set(lines)
    in_order = [line for line in lines if "in order" in line]
    assert in_order == ["[RANK 0] in order from 0", "[RANK 1] in order from 1"]
