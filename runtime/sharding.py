"""Which batches each process reads: HF Accelerate's batch-level sharding, reimplemented.

Process ``i`` of ``n`` takes batches ``i, i+n, i+2n, ...`` of the original batch sampler (or, with
``split_batches``, the ``i``-th slice of every batch). With ``even_batches`` the last round is
completed with samples from the start of the epoch so every process runs the same number of steps;
``gather_for_metrics`` later drops those duplicates.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler


def check_split(batch_size: int | None, num_processes: int) -> None:
    """``split_batches`` gives each process an equal slice of every batch, so it needs one."""
    if batch_size is None or batch_size % num_processes:
        raise ValueError(
            f"split_batches needs a batch size divisible by the {num_processes} processes, "
            f"got {batch_size}"
        )


class ShardedBatchSampler(BatchSampler):
    """One process's share of ``batch_sampler``'s batches, same order on every process."""

    def __init__(
        self,
        batch_sampler: Iterable[list],
        num_processes: int,
        process_index: int,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        batch_size = getattr(batch_sampler, "batch_size", None)
        if split_batches:
            check_split(batch_size, num_processes)
        if not even_batches and batch_size is None:
            raise ValueError("even_batches=False needs a batch sampler with a batch_size")
        self.batch_sampler = batch_sampler
        self.sampler = getattr(batch_sampler, "sampler", None)
        self.batch_size = batch_size
        self.drop_last = getattr(batch_sampler, "drop_last", False)
        self.num_processes, self.process_index = num_processes, process_index
        self.split_batches, self.even_batches = split_batches, even_batches

    def __len__(self) -> int:
        total = len(self.batch_sampler)  # type: ignore[arg-type]
        if self.split_batches:
            return total - (0 if self.even_batches else self._empty_tail())
        rounds, left = divmod(total, self.num_processes)
        if left == 0 or self.drop_last:
            return rounds
        return rounds + (1 if self.even_batches or self.process_index < left else 0)

    def _empty_tail(self) -> int:
        """1 when ``even_batches=False`` leaves this process nothing of the short last batch.

        (HF Accelerate still counts that batch in ``len()``; here ``len()`` is what iterates.)
        """
        if self.drop_last or not hasattr(self.sampler, "__len__"):
            return 0
        tail = len(self.sampler) % self.batch_size  # type: ignore[arg-type, operator]
        share = self.batch_size // self.num_processes  # type: ignore[operator]
        return 1 if 0 < tail <= share * self.process_index else 0

    def __iter__(self) -> Iterator[list]:
        return self._split() if self.split_batches else self._interleave()

    def _interleave(self) -> Iterator[list]:
        n, rank, size = self.num_processes, self.process_index, self.batch_size
        head: list = []  # the epoch's first batches, recycled to complete the last round
        round_: list[list] = []
        for batch in self.batch_sampler:
            if len(head) < n:
                head.append(batch)
            round_.append(batch)
            if len(round_) == n and (size is None or len(batch) == size):
                yield round_[rank]
                round_ = []
        if self.drop_last or not round_:
            return
        if not self.even_batches:
            if rank < len(round_):
                yield round_[rank]
            return
        yield _complete_round(round_, head, n, size)[rank]

    def _split(self) -> Iterator[list]:
        share = self.batch_size // self.num_processes  # type: ignore[operator]
        start = share * self.process_index
        first: list = []
        for batch in self.batch_sampler:
            first = first or list(batch)
            if len(batch) == self.batch_size:
                yield batch[start : start + share]
            elif not self.drop_last:  # the short last batch
                if not self.even_batches:
                    if len(batch) > start:
                        yield batch[start : start + share]
                    return
                filler = itertools.cycle(first)
                full = list(batch) + [next(filler) for _ in range(self.batch_size - len(batch))]
                yield full[start : start + share]


def _complete_round(round_: list[list], head: list[list], n: int, size: int | None) -> list[list]:
    """Fill the last round up to ``n`` full batches with samples cycled from the epoch's start."""
    if size is None:  # batches of unknown size: recycle whole batches
        whole = itertools.cycle(head)
        return round_ + [next(whole) for _ in range(n - len(round_))]
    filler = itertools.cycle([index for batch in head for index in batch])
    done = [list(batch) for batch in round_]
    done[-1] += [next(filler) for _ in range(size - len(done[-1]))]
    done += [[next(filler) for _ in range(size)] for _ in range(n - len(done))]
    return done


class SkipBatchSampler(BatchSampler):
    """``batch_sampler`` without its first ``skip`` batches (skipped before any data is read)."""

    def __init__(self, batch_sampler: Iterable[list], skip: int) -> None:
        self.batch_sampler, self.skip = batch_sampler, skip
        self.sampler = getattr(batch_sampler, "sampler", None)
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = getattr(batch_sampler, "drop_last", False)

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[list]:
        return itertools.islice(self.batch_sampler, self.skip, None)


class IterableDatasetShard(IterableDataset):
    """Batch-level sharding of a stream: each round of ``n`` batches is split between processes."""

    def __init__(
        self,
        dataset: Iterable[Any],
        batch_size: int,
        *,
        num_processes: int,
        process_index: int,
        split_batches: bool = False,
        drop_last: bool = False,
    ) -> None:
        self.dataset, self.drop_last = dataset, drop_last
        self.round_size = batch_size if split_batches else batch_size * num_processes
        share = self.round_size // num_processes
        self.window = slice(share * process_index, share * (process_index + 1))

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        first: list = []
        chunk: list = []
        for item in self.dataset:
            chunk.append(item)
            if len(chunk) == self.round_size:
                yield from chunk[self.window]
                first = first or chunk
                chunk = []
        if chunk and not self.drop_last:
            filler = itertools.cycle(first or list(chunk))
            chunk += [next(filler) for _ in range(self.round_size - len(chunk))]
            yield from chunk[self.window]


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose order depends only on ``initial_seed + epoch`` (HF Accelerate's
    ``use_seedable_sampler``, with its signature): re-seeding and ``set_epoch(e)`` replay epoch
    ``e`` exactly, and each finished pass moves to the next epoch, so a loop that never calls
    ``set_epoch`` still reshuffles. ``data_seed`` defaults to torch's initial seed."""

    def __init__(self, *args: Any, data_seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initial_seed = data_seed if data_seed is not None else torch.random.initial_seed()
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if self.generator is None:
            self.generator = torch.Generator()
        self.generator.manual_seed(self.initial_seed + self.epoch)
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)
