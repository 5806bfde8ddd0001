"""Prepared data loaders: sharding, device placement and end-of-epoch tracking.

A prepared loader iterates one batch ahead so that, while the last batch is being used, the
shared :class:`~.state.StepState` already says ``end_of_dataloader`` (gradient accumulation syncs
there and ``gather_for_metrics`` trims the padding). It also remembers where the sampler's random
generator stood when the epoch began, which is what a checkpoint needs to replay the epoch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
)

from . import config, ops, rng
from .parallelism import data_parallel_share
from .sharding import (
    IterableDatasetShard,
    SeedableRandomSampler,
    ShardedBatchSampler,
    SkipBatchSampler,
    check_split,
)
from .state import GradientState, PartialState, ProcessState, StepState

# DataLoader arguments carried over to the rebuilt loader (those that exist in this torch).
_LOADER_ARGS = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


def send_to_device(
    tensor: Any,
    device: torch.device | str | int,
    non_blocking: bool = False,
    skip_keys: str | Sequence[str] | None = None,
) -> Any:
    """Move every tensor in a batch (nested in any container) to ``device``.

    HF Accelerate's ``accelerate.utils.send_to_device``: anything with a ``.to`` method (a
    tokenizer's ``BatchEncoding``, a module) is moved by it, and mapping values under
    ``skip_keys`` stay where they are, at any depth.
    """
    skipped = (skip_keys,) if isinstance(skip_keys, str) else tuple(skip_keys or ())

    def _move(item: Any) -> Any:
        try:
            return item.to(device, non_blocking=non_blocking)
        except TypeError:  # a custom ``.to`` without ``non_blocking``, which HF also retries
            return item.to(device)

    return ops.apply(_move, tensor, is_leaf=lambda item: hasattr(item, "to"), skip_keys=skipped)


class _Position:
    """Epoch counter and the sampler generator's state at the start of the running epoch."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.iteration = 0
        self.epoch_start: torch.Tensor | None = None  # set while an epoch is running

    @property
    def generator(self) -> torch.Generator | None:
        return getattr(self.sampler, "generator", None)

    def state_dict(self) -> dict[str, Any]:
        rng = self.epoch_start
        if rng is None and self.generator is not None:
            rng = self.generator.get_state()
        return {"iteration": self.iteration, "generator": rng}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the position; a generator saved by a run on more processes is adopted."""
        self.iteration = int(state["iteration"])
        saved = state["generator"]
        if saved is None:
            return  # saved by one process whose sampler drew from the (restored) global RNG
        if not hasattr(self.sampler, "generator"):
            raise ValueError("the checkpointed data loader shuffled, this one does not")
        if self.sampler.generator is None:
            self.sampler.generator = torch.Generator()
        self.sampler.generator.set_state(saved)


class PreparedDataLoader(DataLoader):
    """A ``DataLoader`` over this process's batches, placing them on the device."""

    def __init__(
        self,
        dataset: Any,
        *,
        batch_sampler: Any,
        device: torch.device | None,
        step_state: StepState,
        position: _Position,
        remainder: int,
        total_batch_size: int | None,
        loader_args: dict[str, Any],
        fetch_whole_batches: bool = False,
        non_blocking: bool = False,
        rng_types: Sequence[str] = (),
        synchronized_generator: torch.Generator | None = None,
        dispatch: Dispatch | None = None,
    ) -> None:
        if batch_sampler is None:  # iterable dataset: batching stays with DataLoader
            super().__init__(dataset, **loader_args)
        elif fetch_whole_batches:  # the script's sampler yields index lists: dataset[indices]
            super().__init__(dataset, sampler=batch_sampler, batch_size=None, **loader_args)
        else:
            super().__init__(dataset, batch_sampler=batch_sampler, **loader_args)
        self.index_batches = batch_sampler
        self.fetch_whole_batches = fetch_whole_batches
        self.non_blocking = non_blocking
        self.device = device
        self.remainder = remainder
        self.total_batch_size = total_batch_size
        self.end_of_dataloader = False
        self._step_state = step_state
        self._position = position
        self._loader_args = loader_args
        self.rng_types = list(rng_types)  # synchronised from process 0 as each epoch starts
        self.synchronized_generator = synchronized_generator
        self.dispatch = dispatch

    @property
    def iteration(self) -> int:
        return self._position.iteration

    def __len__(self) -> int:
        whole = super().__len__()
        if self.dispatch is None or self.dispatch.split_batches:
            return whole
        n = self.dispatch.num_processes
        return (
            whole // n if getattr(self.index_batches, "drop_last", False) else math.ceil(whole / n)
        )

    def set_epoch(self, epoch: int) -> None:
        """Forwarded to the sampler and dataset; epoch-seeded samplers reshuffle from it."""
        self._position.iteration = epoch
        for owner in (getattr(self.index_batches, "sampler", None), self.dataset):
            if hasattr(owner, "set_epoch"):
                owner.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self._position.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._position.load_state_dict(state)

    def __iter__(self) -> Iterator[Any]:
        position, shared = self._position, self._step_state
        rng.synchronize_rng_states(self.rng_types, self.synchronized_generator)
        if position.generator is not None:
            position.epoch_start = position.generator.get_state()
        self.set_epoch(position.iteration)
        self.end_of_dataloader = False
        shared.active_loaders.append(self)
        shared.end_of_dataloader, shared.remainder = False, self.remainder
        try:
            yield from self._batches(self._dispatched() if self.dispatch else super().__iter__())
            position.iteration += 1
        finally:
            position.epoch_start = None
            shared.active_loaders.remove(self)
            outer = shared.active_loaders[-1] if shared.active_loaders else None
            shared.end_of_dataloader = outer is not None and outer.end_of_dataloader
            shared.remainder = outer.remainder if outer is not None else -1

    def _batches(self, batches: Iterator[Any]) -> Iterator[Any]:
        device = self.device
        # A blocking copy to a GPU first waits for every kernel already queued, so the host cannot
        # queue the next step while the GPU runs this one: GPT-2 small on an H100 lost 15% of its
        # speed to it. A non-blocking host-to-GPU copy is as safe (CUDA stages pageable memory
        # before returning; torch keeps pinned blocks until their copy is done) and gives the
        # same values, so HF's ``non_blocking`` setting only ever turns it on.
        non_blocking = self.non_blocking or (device is not None and device.type == "cuda")
        try:
            current = next(batches)
        except StopIteration:
            return
        for upcoming in batches:
            yield current if device is None else send_to_device(current, device, non_blocking)
            current = upcoming
        self.end_of_dataloader = self._step_state.end_of_dataloader = True
        yield current if device is None else send_to_device(current, device, non_blocking)

    def _dispatched(self) -> Iterator[Any]:
        """HF's ``dispatch_batches``: process 0 reads each round (``num_processes`` batches, or one
        with ``split_batches``) and sends it to all, which keep their slice. A short last round is
        completed from the first, as in HF, and its real size is the remainder."""
        n, rank = self.dispatch.num_processes, self.dispatch.process_index
        size = 1 if self.dispatch.split_batches else n
        drop_last = getattr(self.index_batches, "drop_last", False) or self.drop_last
        rounds = _rounds(super().__iter__(), size, drop_last) if rank == 0 else iter(())
        first = None
        while message := ops.broadcast_object_list([next(rounds, None)])[0]:
            batch, last = message
            first = batch if first is None else first
            length = _length(batch)
            share = length // n
            if last:
                self.remainder = self._step_state.remainder = length
                if length % n:
                    batch, share = _concatenate([batch, first]), share + 1
            yield ops.apply(lambda tensor, k=share: tensor[rank * k : (rank + 1) * k], batch)

    def skipping(self, num_batches: int) -> PreparedDataLoader:
        """The same loader without its first ``num_batches`` batches (sharing the position)."""
        if self.index_batches is None or isinstance(self.dataset, IterableDataset):
            raise ValueError("skip_first_batches needs a map-style dataset with a batch sampler")
        return PreparedDataLoader(
            self.dataset,
            batch_sampler=SkipBatchSampler(self.index_batches, num_batches * self._whole_per_own),
            device=self.device,
            step_state=self._step_state,
            position=self._position,
            remainder=self.remainder,
            total_batch_size=self.total_batch_size,
            loader_args=self._loader_args,
            fetch_whole_batches=self.fetch_whole_batches,
            non_blocking=self.non_blocking,
            rng_types=self.rng_types,
            synchronized_generator=self.synchronized_generator,
            dispatch=self.dispatch,
        )

    @property
    def _whole_per_own(self) -> int:
        """Batches of the underlying sampler per batch this process gets."""
        if self.dispatch is None or self.dispatch.split_batches:
            return 1
        return self.dispatch.num_processes


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """Where a dispatching loader sends its rounds (see :meth:`PreparedDataLoader._dispatched`)."""

    num_processes: int
    process_index: int
    split_batches: bool


def _rounds(batches: Iterator[Any], size: int, drop_last: bool) -> Iterator[tuple[Any, bool]]:
    """Rounds of ``size`` batches joined into one, each with whether it is the last one."""

    def read() -> Any:
        taken = list(itertools.islice(batches, size))
        if not taken or (drop_last and len(taken) < size):
            return None
        return _concatenate(taken)

    current = read()
    while current is not None:
        upcoming = read()
        yield current, upcoming is None
        current = upcoming


def _concatenate(batches: list[Any]) -> Any:
    """Batches of the same structure joined along their first dimension."""
    first = batches[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(batches)
    if isinstance(first, dict):
        return type(first)({key: _concatenate([b[key] for b in batches]) for key in first})
    if isinstance(first, (list, tuple)):
        parts = [_concatenate(list(column)) for column in zip(*batches, strict=True)]
        return type(first)(*parts) if hasattr(first, "_fields") else type(first)(parts)
    raise TypeError(f"dispatch_batches joins batches of tensors, not {type(first).__name__}")


def _length(batch: Any) -> int:
    """The batch's size: the first dimension of its first tensor."""
    found: list[int] = []
    ops.apply(lambda tensor: found.append(len(tensor)), batch)
    return found[0]


def prepare_loader(
    loader: DataLoader,
    state: ProcessState,
    step_state: StepState,
    *,
    split_batches: bool,
    even_batches: bool,
    device_placement: bool = True,
    non_blocking: bool = False,
    seedable_sampler: bool = False,
    data_seed: int | None = None,
    rng_types: Sequence[str] = (),
    dispatch_batches: bool = False,
    shards: tuple[int, int] | None = None,
) -> PreparedDataLoader:
    """Rebuild ``loader`` over this process's share of the batches.

    A ``BatchSampler`` given as ``sampler`` (with ``batch_size=None``) is sharded like a batch
    sampler; its index lists still reach the dataset whole, as the script had it. With
    ``seedable_sampler`` a shuffling sampler is replaced by one seeded with ``data_seed`` (else
    torch's initial seed) plus the epoch. ``rng_types`` (HF's ``Accelerator(rng_types=...)``)
    are synchronised at the start of each epoch; ``"generator"``, the sampler's (or iterable
    dataset's) generator, only where processes share one, as in HF. With ``dispatch_batches``
    only process 0 reads the data, whole, and sends each process its share of every round.
    ``shards`` is (processes, index) of this process's data-parallel group when the other
    processes of its tensor-parallel group read the same batches (``parallelism.py``).
    """
    args = {name: getattr(loader, name) for name in _LOADER_ARGS if hasattr(loader, name)}
    generator = None
    n, rank = shards or (state.num_processes, state.process_index)
    dataset, batch_sampler = loader.dataset, loader.batch_sampler
    fetch_whole = batch_sampler is None and isinstance(loader.sampler, BatchSampler)
    if fetch_whole:
        batch_sampler = loader.sampler
    if seedable_sampler:
        batch_sampler = _epoch_seeded(batch_sampler, data_seed, state.device)
    batch_size = getattr(batch_sampler, "batch_size", None) or loader.batch_size
    dispatch = Dispatch(n, rank, split_batches) if dispatch_batches and n > 1 else None
    if dispatch is not None:
        if batch_size is None:
            raise ValueError("dispatch_batches needs a DataLoader with a batch_size")
        if split_batches:
            check_split(batch_size, n)
        if isinstance(dataset, IterableDataset):
            batch_sampler = None
            args.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif isinstance(dataset, IterableDataset):
        batch_sampler = None
        if n > 1:
            generator = getattr(dataset, "generator", None)
            if loader.batch_size is None:
                raise ValueError("cannot shard an IterableDataset loader with batch_size=None")
            dataset = IterableDatasetShard(
                dataset,
                loader.batch_size,
                num_processes=n,
                process_index=rank,
                split_batches=split_batches,
                drop_last=loader.drop_last,
            )
        size = loader.batch_size // n if split_batches and n > 1 else loader.batch_size
        args.update(batch_size=size, drop_last=loader.drop_last)
    elif batch_sampler is None:
        if n > 1:
            raise ValueError("cannot shard a DataLoader with batch_size=None across processes")
        args.update(sampler=loader.sampler, batch_size=None)
    elif state.num_processes > 1:  # every process shuffles alike, sharded or not
        if isinstance(getattr(batch_sampler, "sampler", None), DistributedSampler):
            raise ValueError(
                "this DataLoader already uses a DistributedSampler; give prepare() a plain "
                "sampler, it shards the batches itself"
            )
        _share_sampler_generator(batch_sampler, state.device)
        generator = getattr(getattr(batch_sampler, "sampler", None), "generator", None)
        if n > 1:
            batch_sampler = ShardedBatchSampler(batch_sampler, n, rank, split_batches, even_batches)
    total = None if batch_size is None else batch_size * (1 if split_batches else n)
    return PreparedDataLoader(
        dataset,
        batch_sampler=batch_sampler,
        device=state.device if device_placement and state.device.type != "cpu" else None,
        step_state=step_state,
        position=_Position(getattr(batch_sampler, "sampler", None)),
        remainder=_remainder(loader, total),
        total_batch_size=total,
        loader_args=args,
        fetch_whole_batches=fetch_whole,
        non_blocking=non_blocking,
        rng_types=[kind for kind in rng_types if kind != "generator" or generator is not None],
        synchronized_generator=generator,
        dispatch=dispatch,
    )


def prepare_data_loader(  # noqa: PLR0917 (HF Accelerate's signature, positional args included)
    dataloader: DataLoader,
    device: torch.device | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: Sequence[str] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
) -> PreparedDataLoader:
    """HF Accelerate's ``prepare_data_loader``: what ``prepare()`` does to a loader, without an
    ``Accelerator``. The process count, index and device default to this process's; the loader
    reports to ``GradientState()``, the newest ``Accelerator``'s step state. Batches stay where
    the dataset puts them unless ``put_on_device``, HF's default. With ``torch_device_mesh`` the
    processes of a tensor-parallel group read the same batches, as in HF."""
    if slice_fn_for_dispatch is not None:
        raise ValueError(
            "prepare_data_loader: slice_fn_for_dispatch is not supported by accelify (batches are "
            "sliced along their first dimension)"
        )
    config.check_loader_config(
        config.DataLoaderConfiguration(use_stateful_dataloader=use_stateful_dataloader)
    )
    here = PartialState()
    state = dataclasses.replace(
        here,
        num_processes=here.num_processes if num_processes is None else num_processes,
        process_index=here.process_index if process_index is None else process_index,
        device=here.device if device is None else torch.device(device),
    )
    return prepare_loader(
        dataloader,
        state,
        GradientState(),
        shards=data_parallel_share(torch_device_mesh, state.num_processes, state.process_index),
        split_batches=split_batches,
        even_batches=even_batches,
        device_placement=put_on_device,
        non_blocking=non_blocking,
        seedable_sampler=use_seedable_sampler,
        data_seed=data_seed,
        rng_types=[str(getattr(kind, "value", kind)) for kind in rng_types or ()],
        dispatch_batches=bool(dispatch_batches),
    )


@contextlib.contextmanager
def even_batches_overridden(
    loaders: Sequence[PreparedDataLoader], even_batches: bool | None
) -> Iterator[None]:
    """Set ``even_batches`` on the prepared map-style loaders for the block, then restore it.

    Iterable-dataset loaders cannot change it (each process reads its own stream); they get a
    warning, as in HF Accelerate.
    """
    if even_batches is None:
        yield
        return
    streams = [loader for loader in loaders if isinstance(loader.dataset, IterableDataset)]
    samplers = [loader.index_batches for loader in loaders if loader not in streams]
    sharded = [sampler for sampler in samplers if hasattr(sampler, "even_batches")]
    if streams:
        warnings.warn(
            "Overriding even_batches is only supported for map-style datasets, yet some "
            "dataloaders given were iterable",
            stacklevel=4,
        )
    saved = [sampler.even_batches for sampler in sharded]
    for sampler in sharded:
        sampler.even_batches = even_batches
    try:
        yield
    finally:
        for sampler, value in zip(sharded, saved, strict=True):
            sampler.even_batches = value


def _epoch_seeded(batch_sampler: Any, data_seed: int | None, device: torch.device) -> Any:
    """``batch_sampler`` rebuilt over a :class:`SeedableRandomSampler` when it shuffles with a
    plain ``RandomSampler`` (others are kept); rank 0's seed is used everywhere."""
    if type(batch_sampler) is not BatchSampler or type(batch_sampler.sampler) is not RandomSampler:
        return batch_sampler
    seed = data_seed if data_seed is not None else torch.initial_seed() % 2**63
    seed = int(ops.broadcast(torch.tensor(seed, device=device)).item())
    given = batch_sampler.sampler
    sampler = SeedableRandomSampler(
        given.data_source,
        replacement=given.replacement,
        num_samples=given._num_samples,
        generator=torch.Generator(),
        data_seed=seed,
    )
    return BatchSampler(sampler, batch_sampler.batch_size, batch_sampler.drop_last)


def _share_sampler_generator(batch_sampler: Any, device: torch.device) -> None:
    """Give a shuffling sampler one generator, seeded identically on every process.

    The seed is drawn from torch's global generator (as HF Accelerate does, so seeded runs
    shuffle the same way under both runtimes) and then taken from rank 0, so processes agree
    even when the script forgot ``set_seed``.
    """
    sampler = getattr(batch_sampler, "sampler", None)
    if sampler is None or not hasattr(sampler, "generator"):
        return
    if sampler.generator is None:
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        sampler.generator = torch.Generator().manual_seed(seed)
    rng_state = ops.broadcast(sampler.generator.get_state().to(device))  # nccl needs it there
    sampler.generator.set_state(rng_state.cpu())


def _remainder(loader: DataLoader, total_batch_size: int | None) -> int:
    """Real samples in the last round (``-1``: unknown or nothing padded), as HF computes it."""
    if loader.drop_last or total_batch_size is None:
        return -1
    try:
        return len(loader.dataset) % total_batch_size  # type: ignore[arg-type]
    except TypeError:
        return -1


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """A loader that starts ``num_batches`` batches in (to resume inside an epoch)."""
    if isinstance(dataloader, PreparedDataLoader):
        return dataloader.skipping(num_batches)
    if dataloader.batch_sampler is None:
        raise ValueError("skip_first_batches needs a DataLoader with a batch sampler")
    args = {name: getattr(dataloader, name) for name in _LOADER_ARGS if hasattr(dataloader, name)}
    sampler = SkipBatchSampler(dataloader.batch_sampler, num_batches)
    return DataLoader(dataloader.dataset, batch_sampler=sampler, **args)
