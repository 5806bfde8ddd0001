"""HF Accelerate's API surface on one process: constructor config objects, decorators,
triggers, gradient state and the option semantics HF defines (the 2-process side is checked by
HF's own scripts in tests/peer)."""

from __future__ import annotations

import accelerate
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from accelify.runtime import (
    Accelerator,
    AcceleratorState,
    DataLoaderConfiguration,
    DistributedType,
    GradientAccumulationPlugin,
    InitProcessGroupKwargs,
    PartialState,
    notebook_launcher,
    reduce,
    set_seed,
    skip_first_batches,
)
from accelify.runtime.handlers import collect


def test_config_objects_set_what_the_old_arguments_did() -> None:
    accelerator = Accelerator(
        dataloader_config=DataLoaderConfiguration(split_batches=True, even_batches=False),
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=4),
    )
    assert (accelerator.split_batches, accelerator.even_batches) == (True, False)
    assert accelerator.gradient_accumulation_steps == 4
    assert accelerator.gradient_state.num_steps == 4


def test_giving_an_option_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="not both"):
        Accelerator(
            gradient_accumulation_steps=2,
            gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2),
        )
    with pytest.raises(ValueError, match="inside dataloader_config"):
        Accelerator(split_batches=True, dataloader_config=DataLoaderConfiguration())


def test_unimplemented_loader_options_are_refused_not_ignored() -> None:
    config = DataLoaderConfiguration(use_stateful_dataloader=True)
    accelerator = Accelerator(dataloader_config=config)
    with pytest.raises(ValueError, match=r"use_stateful_dataloader=True\) is not supported"):
        accelerator.prepare(DataLoader(list(range(4)), batch_size=2))


def _sync_pattern(plugin: GradientAccumulationPlugin) -> list[bool]:
    accelerator = Accelerator(gradient_accumulation_plugin=plugin)
    loader = accelerator.prepare(DataLoader(list(range(3)), batch_size=1))
    pattern = []
    for _ in loader:
        with accelerator.accumulate():
            pattern.append(accelerator.sync_gradients)
    return pattern


def test_sync_with_dataloader_decides_whether_the_last_batch_syncs() -> None:
    assert _sync_pattern(GradientAccumulationPlugin(num_steps=2)) == [False, True, True]
    unsynced = GradientAccumulationPlugin(num_steps=2, sync_with_dataloader=False)
    assert _sync_pattern(unsynced) == [False, True, False]


def test_gradient_state_names_the_loader_being_iterated() -> None:
    accelerator = Accelerator()
    outer, inner = accelerator.prepare(
        DataLoader(list(range(2)), batch_size=1), DataLoader(list(range(2)), batch_size=1)
    )
    state = accelerator.gradient_state
    assert state.active_dataloader is None and not state.in_dataloader
    for _ in outer:
        assert state.active_dataloader is outer
        for _ in inner:
            assert state.active_dataloader is inner
        assert state.active_dataloader is outer
    assert state.active_dataloader is None


def test_every_hf_distributed_type_exists_and_compares_equal_to_hf() -> None:
    for member in accelerate.DistributedType:
        assert DistributedType[member.name] == member
    assert Accelerator().distributed_type != DistributedType.XLA


def test_reduce_matches_hf_on_one_process() -> None:
    """A copy, ``scale`` ignored (HF applies it on TPUs only); max and min are reductions too."""
    tensor = torch.tensor([1.0, 2.0])
    accelerator = Accelerator()
    for reduction in ("sum", "mean", "max", "min", "none"):
        reduced = accelerator.reduce(tensor, reduction, scale=3.0)
        assert reduced.tolist() == [1.0, 2.0] and reduced is not tensor
    with pytest.raises(ValueError, match="reduction must be one of"):
        reduce(tensor, "prod")


def test_process_decorators_and_triggers_on_one_process() -> None:
    accelerator = Accelerator()
    assert accelerator.on_process(lambda: "ran", process_index=0)() == "ran"
    assert accelerator.on_process(process_index=1)(lambda: "ran")() is None
    assert accelerator.on_local_process(lambda: "ran", local_process_index=0)() == "ran"
    assert accelerator.on_last_process(lambda: "ran")() == "ran"
    assert accelerator.check_trigger() is False
    accelerator.set_trigger()
    assert accelerator.check_trigger() is True
    assert accelerator.check_trigger() is False


def test_partial_state_is_the_accelerators_state() -> None:
    accelerator = Accelerator()
    assert PartialState() is accelerator.state and AcceleratorState() is accelerator.state
    AcceleratorState._reset_state()  # settings live on each Accelerator: nothing to forget
    assert PartialState() is accelerator.state


class _IndexListDataset(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 5

    def __getitem__(self, indices: list[int]) -> torch.Tensor:
        return torch.tensor(indices) * 10


def test_batch_sampler_given_as_sampler_fetches_whole_batches() -> None:
    sampler = BatchSampler(SequentialSampler(range(5)), batch_size=2, drop_last=False)
    loader = DataLoader(_IndexListDataset(), sampler=sampler, batch_size=None)
    prepared = Accelerator().prepare(loader)
    assert [batch.tolist() for batch in prepared] == [[0, 10], [20, 30], [40]]


def test_skip_first_batches_takes_hf_keyword() -> None:
    loader = DataLoader(list(range(6)), batch_size=2)
    skipped = skip_first_batches(dataloader=loader, num_batches=2)
    assert [batch.tolist() for batch in skipped] == [[4, 5]]
    accelerator = Accelerator()
    prepared = accelerator.prepare(loader)
    later = accelerator.skip_first_batches(dataloader=prepared, num_batches=1)
    assert [batch.tolist() for batch in later] == [[2, 3], [4, 5]]


def _epochs(loader: DataLoader, count: int) -> list[list[int]]:
    return [[i for batch in loader for i in batch.tolist()] for _ in range(count)]


def test_seedable_sampler_replays_an_epoch_from_seed_and_epoch() -> None:
    data = list(range(12))
    set_seed(42)
    config = DataLoaderConfiguration(use_seedable_sampler=True)
    loader = Accelerator(dataloader_config=config).prepare(
        DataLoader(data, batch_size=3, shuffle=True)
    )
    first = _epochs(loader, 2)
    assert first[0] != first[1]  # a new order each epoch
    torch.manual_seed(0)  # the global generator does not matter, seed + epoch does
    loader.set_epoch(0)
    assert _epochs(loader, 2) == first
    other = DataLoaderConfiguration(use_seedable_sampler=True, data_seed=7)
    reseeded = Accelerator(dataloader_config=other).prepare(
        DataLoader(data, batch_size=3, sampler=RandomSampler(data))
    )
    assert _epochs(reseeded, 1)[0] != first[0]


def test_init_process_group_kwargs_pass_only_what_was_changed() -> None:
    handler = InitProcessGroupKwargs(init_method="env://")
    assert collect([handler])["init"] == {"init_method": "env://"}
    assert collect([InitProcessGroupKwargs()])["init"] == {}


def test_notebook_launcher_refuses_options_it_cannot_honour() -> None:
    with pytest.raises(ValueError, match="rdzv_id='job-7' is not supported"):
        notebook_launcher(print, num_processes=2, rdzv_id="job-7")
