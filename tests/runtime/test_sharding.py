"""Batch-level sharding matches HF Accelerate's, batch for batch, on every process."""

from __future__ import annotations

import itertools

import pytest
from accelerate.data_loader import BatchSamplerShard
from accelerate.data_loader import IterableDatasetShard as HFIterableShard
from torch.utils.data import BatchSampler, SequentialSampler

from accelify.runtime.sharding import IterableDatasetShard, ShardedBatchSampler, SkipBatchSampler


def _shards(batch_sampler, n, **kwargs):
    return [list(ShardedBatchSampler(batch_sampler, n, rank, **kwargs)) for rank in range(n)]


def test_ten_samples_on_two_processes_pad_the_last_round_from_the_start() -> None:
    batches = BatchSampler(SequentialSampler(range(10)), 4, drop_last=False)
    assert _shards(batches, 2) == [
        [[0, 1, 2, 3], [8, 9, 0, 1]],
        [[4, 5, 6, 7], [2, 3, 4, 5]],
    ]
    assert _shards(batches, 2, even_batches=False) == [[[0, 1, 2, 3], [8, 9]], [[4, 5, 6, 7]]]
    assert _shards(batches, 2, split_batches=True) == [
        [[0, 1], [4, 5], [8, 9]],
        [[2, 3], [6, 7], [0, 1]],
    ]


GRID = [
    (size, batch, n, drop_last, even, split)
    for size, batch, n, drop_last, even, split in itertools.product(
        (1, 5, 8, 10, 13, 24), (1, 3, 4), (2, 3), (False, True), (True, False), (False, True)
    )
    if not split or batch % n == 0
]


@pytest.mark.parametrize("case", GRID, ids=str)
def test_every_process_gets_what_hf_accelerate_gives_it(case: tuple) -> None:
    size, batch, n, drop_last, even, split = case
    batches = BatchSampler(SequentialSampler(range(size)), batch, drop_last=drop_last)
    for rank in range(n):
        ours = ShardedBatchSampler(batches, n, rank, split_batches=split, even_batches=even)
        theirs = BatchSamplerShard(batches, n, rank, split_batches=split, even_batches=even)
        assert list(ours) == list(theirs)
        assert len(ours) == len(list(ours))  # HF over-counts with split_batches, uneven ends


def test_batches_of_unknown_size_are_padded_with_whole_batches() -> None:
    batches = [[0, 1], [2], [3, 4, 5]]
    for rank in range(2):
        expected = list(BatchSamplerShard(batches, 2, rank))
        assert list(ShardedBatchSampler(batches, 2, rank)) == expected


def test_split_batches_needs_a_batch_size_divisible_by_the_processes() -> None:
    batches = BatchSampler(SequentialSampler(range(10)), 3, drop_last=False)
    with pytest.raises(ValueError, match="divisible"):
        ShardedBatchSampler(batches, 2, 0, split_batches=True)


@pytest.mark.parametrize(
    ("size", "drop_last", "split"),
    [(10, False, False), (10, True, False), (13, False, True), (3, False, False)],
)
def test_iterable_datasets_are_sharded_like_hf_accelerate(
    size: int, drop_last: bool, split: bool
) -> None:
    for rank in range(2):
        ours = IterableDatasetShard(
            range(size),
            4,
            num_processes=2,
            process_index=rank,
            split_batches=split,
            drop_last=drop_last,
        )
        theirs = HFIterableShard(
            range(size),
            4,
            drop_last=drop_last,
            num_processes=2,
            process_index=rank,
            split_batches=split,
        )
        assert list(ours) == list(theirs)


def test_skipping_drops_leading_batches_and_shortens_the_length() -> None:
    batches = BatchSampler(SequentialSampler(range(10)), 4, drop_last=False)
    skipped = SkipBatchSampler(batches, 2)
    assert list(skipped) == [[8, 9]]
    assert len(skipped) == 1
