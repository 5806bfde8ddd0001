"""HF Accelerate's data and state helpers that scripts import by name: ``prepare_data_loader``,
``SeedableRandomSampler``, ``GradientState``, ``copy_tensor_to_devices`` and the ``is_*_available``
queries, each checked against HF's own on one process (the peer suite runs them on two)."""

from __future__ import annotations

import sys
from pathlib import Path

import accelerate
import accelerate.data_loader
import accelerate.utils
import pytest
import torch
from torch.utils.data import DataLoader

import accelify.runtime as ours
from accelify.runtime import (
    Accelerator,
    GradientAccumulationPlugin,
    GradientState,
    SeedableRandomSampler,
    copy_tensor_to_devices,
    prepare_data_loader,
)

from .test_multiprocess import _records, _run

DISPATCH = Path(__file__).parents[2] / "fixtures" / "runtime" / "dispatch_toy.py"
ACCEL_RUN = [sys.executable, "-c", "from accelify.runtime.launch.cli import main; main()", "--cpu"]
HF_ON_CPU = {"ACCELERATE_USE_CPU": "1"}  # else HF starts no gloo group on a CPU host


def _batches(loader: DataLoader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


@pytest.mark.parametrize("split_batches", [False, True])
@pytest.mark.parametrize("process_index", [0, 1])
def test_prepare_data_loader_gives_each_process_hfs_batches(
    process_index: int, split_batches: bool
) -> None:
    def shard(prepare):
        loader = DataLoader(range(20), batch_size=4)
        return _batches(
            prepare(
                loader, num_processes=2, process_index=process_index, split_batches=split_batches
            )
        )

    assert shard(prepare_data_loader) == shard(accelerate.data_loader.prepare_data_loader)


def test_prepare_data_loader_refuses_what_it_cannot_do_by_name() -> None:
    loader = DataLoader(range(8), batch_size=2)
    with pytest.raises(ValueError, match="use_stateful_dataloader=True"):
        prepare_data_loader(loader, use_stateful_dataloader=True)
    with pytest.raises(ValueError, match="slice_fn_for_dispatch"):
        prepare_data_loader(loader, slice_fn_for_dispatch=lambda batch, *_: batch)


def test_dispatched_batches_are_hfs_on_two_processes(tmp_path: Path) -> None:
    """Process 0 reads every round and sends each process its slice: map-style and streamed,
    uneven, shuffled, dict batches, split or not; batches, len() and gather_for_metrics as HF.
    accelify runs under accel-run, as users run it; HF's reference under torchrun."""
    _run(tmp_path, "--impl", "accelify", processes=2, script=DISPATCH, launcher=ACCEL_RUN)
    _run(tmp_path, "--impl", "hf", processes=2, script=DISPATCH, env=HF_ON_CPU)
    ours, theirs = _records(tmp_path, "accelify"), _records(tmp_path, "hf")
    assert len(ours) == 2 and ours == theirs
    padded = ours[1]["map_split0"]
    assert padded["batches"][-1] == [19, 20, 0], "a short last round is completed from the first"
    assert padded["gathered"][-1] == [16, 17, 18, 19, 20], "and gather_for_metrics trims it"


def test_prepare_data_loader_reports_to_the_newest_accelerators_step_state() -> None:
    accelerator = Accelerator()
    loader = prepare_data_loader(DataLoader(range(6), batch_size=2))
    ends = []
    for _ in loader:
        ends.append(accelerator.gradient_state.end_of_dataloader)
    assert ends == [False, False, True]


def test_seedable_sampler_orders_as_hfs_and_reshuffles_each_pass() -> None:
    def orders(cls: type) -> list[list[int]]:
        sampler = cls(range(10), data_seed=7)
        passes = [list(sampler), list(sampler)]
        sampler.set_epoch(0)
        return [*passes, list(sampler)]

    mine, hf = orders(SeedableRandomSampler), orders(accelerate.data_loader.SeedableRandomSampler)
    assert mine == hf
    assert mine[0] != mine[1], "a second pass without set_epoch must reshuffle, as in HF"
    assert mine[2] == mine[0], "set_epoch(0) replays the first pass"


def test_gradient_state_is_the_newest_accelerators_until_reset() -> None:
    first, second = Accelerator(), Accelerator(gradient_accumulation_steps=3)
    assert GradientState() is second.gradient_state
    assert GradientState() is not first.gradient_state
    GradientState._reset_state()
    fresh = GradientState(GradientAccumulationPlugin(num_steps=4, sync_each_batch=True))
    assert fresh is not second.gradient_state and GradientState() is fresh
    assert (fresh.num_steps, fresh.sync_each_batch, fresh.sync_gradients) == (4, True, True)
    assert second.gradient_state.num_steps == 3, "another Accelerator's settings stay its own"


def test_copy_tensor_to_devices_returns_the_holders_tensor_on_one_process() -> None:
    tensor = torch.tensor([1, 2, 3], dtype=torch.int)
    copied = copy_tensor_to_devices(tensor)
    assert copied.dtype == torch.int and copied.tolist() == [1, 2, 3]


@pytest.mark.parametrize(
    "query",
    [
        "is_bf16_available",
        "is_bnb_available",
        "is_cuda_available",
        "is_datasets_available",
        "is_fp16_available",
        "is_hpu_available",
        "is_mps_available",
        "is_pytest_available",
        "is_rocm_available",
        "is_schedulefree_available",
        "is_xpu_available",
    ],
)
def test_environment_queries_answer_as_hfs(query: str) -> None:
    assert getattr(ours, query)() is bool(getattr(accelerate.utils, query)())
