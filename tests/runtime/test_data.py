"""Prepared loaders on one process: placement, end-of-epoch tracking, epochs and resuming."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, defaultdict, namedtuple
from collections.abc import Iterator, Mapping

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from accelify.runtime import Accelerator, DistributedType, skip_first_batches
from accelify.runtime.data import prepare_loader, send_to_device
from accelify.runtime.state import ProcessState, StepState

from .conftest import CUDA

Pair = namedtuple("Pair", "x y")


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    label: str


class Frozen(Mapping):
    """A read-only mapping built from a dict, like many libraries' batch types."""

    def __init__(self, values: dict) -> None:
        self._values = dict(values)

    def __getitem__(self, key: str) -> object:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def test_tensors_move_inside_every_container_kind_which_keeps_its_type() -> None:
    factory = defaultdict(list, {"t": torch.ones(1)})
    batch = [
        (torch.ones(1), "kept"),
        Pair(torch.ones(1), 3),
        Batch(torch.ones(1), "label"),
        OrderedDict(a=torch.ones(1)),
        factory,
        Frozen({"t": torch.ones(1)}),
    ]
    moved = send_to_device(batch, torch.device("meta"))
    assert [type(item) for item in moved] == [type(item) for item in batch]
    assert moved[0][0].is_meta and moved[0][1] == "kept"
    assert moved[1].x.is_meta and moved[1].y == 3
    assert moved[2].x.is_meta and moved[2].label == "label"
    assert moved[3]["a"].is_meta
    assert moved[4]["t"].is_meta and moved[4].default_factory is list
    assert moved[5]["t"].is_meta


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_batches_arrive_on_the_accelerator_device(device: str) -> None:
    accelerator = Accelerator(cpu=device == "cpu")
    loader = accelerator.prepare(DataLoader([{"x": torch.ones(2)}] * 3, batch_size=2))
    assert all(batch["x"].device.type == device for batch in loader)


def test_the_last_batch_is_flagged_and_an_inner_loader_does_not_clobber_the_outer() -> None:
    accelerator = Accelerator(cpu=True)
    outer, inner = accelerator.prepare(DataLoader(range(6), batch_size=2), DataLoader(range(2)))
    flags = []
    for _ in outer:
        for _ in inner:
            pass
        flags.append(accelerator.gradient_state.end_of_dataloader)
    assert len(outer) == 3
    assert flags == [False, False, True]
    assert not accelerator.gradient_state.end_of_dataloader


class EpochSampler(Sampler):
    def __init__(self) -> None:
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __iter__(self) -> Iterator[int]:
        return iter(range(4))

    def __len__(self) -> int:
        return 4


def test_set_epoch_reaches_the_sampler_and_epochs_count_on() -> None:
    sampler = EpochSampler()
    loader = Accelerator(cpu=True).prepare(DataLoader(range(4), sampler=sampler, batch_size=2))
    loader.set_epoch(5)
    list(loader)
    list(loader)
    assert sampler.epochs[-2:] == [5, 6]
    assert loader.iteration == 7


def _shuffled(accelerator: Accelerator) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    return accelerator.prepare(
        DataLoader(range(12), batch_size=2, shuffle=True, generator=generator)
    )


def test_a_mid_epoch_position_replays_the_epoch_and_skipping_resumes_it() -> None:
    loader = _shuffled(Accelerator(cpu=True))
    epoch = iter(loader)
    done = [next(epoch).tolist(), next(epoch).tolist()]
    position = loader.state_dict()
    rest = [batch.tolist() for batch in epoch]
    following = [batch.tolist() for batch in loader]

    resumed = _shuffled(Accelerator(cpu=True))
    torch.manual_seed(123)  # the sampler's own generator, not the global one, decides
    resumed.load_state_dict(position)
    assert [batch.tolist() for batch in skip_first_batches(resumed, len(done))] == rest
    assert [batch.tolist() for batch in resumed] == following
    assert following != done + rest


def test_skip_first_batches_on_a_plain_loader() -> None:
    loader = skip_first_batches(DataLoader(range(6), batch_size=2), 2)
    assert [batch.tolist() for batch in loader] == [[4, 5]]


def _two_process_state() -> ProcessState:
    return ProcessState(2, 0, 0, torch.device("cpu"), DistributedType.MULTI_CPU, cpu=True)


def test_a_distributed_sampler_is_refused_instead_of_sharding_twice() -> None:
    loader = DataLoader(range(8), sampler=DistributedSampler(range(8), num_replicas=2, rank=0))
    with pytest.raises(ValueError, match="already uses a DistributedSampler"):
        prepare_loader(
            loader, _two_process_state(), StepState(), split_batches=False, even_batches=True
        )


def test_one_process_adopts_the_shuffle_generator_of_a_multi_process_checkpoint() -> None:
    saved = prepare_loader(
        DataLoader(range(8), shuffle=True),
        _two_process_state(),
        StepState(),
        split_batches=False,
        even_batches=True,
    )
    assert saved.batch_sampler.sampler.generator is not None
    single = Accelerator(cpu=True).prepare(DataLoader(range(8), shuffle=True))
    assert single.batch_sampler.sampler.generator is None
    single.load_state_dict(saved.state_dict())
    assert torch.equal(
        single.batch_sampler.sampler.generator.get_state(),
        saved.batch_sampler.sampler.generator.get_state(),
    )
