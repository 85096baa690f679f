"""Deterministic sharding is a pure function and covers every sample exactly once per epoch."""

from __future__ import annotations

import pytest

from gearshift.common.sharding import (
    epoch_order,
    num_shards,
    permutation,
    rank_sequence,
    shard_indices,
    shard_range,
)


def test_ranges_cover_the_dataset() -> None:
    assert num_shards(10, 3) == 4
    assert [shard_range(i, 10, 3) for i in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    with pytest.raises(ValueError, match="out of range"):
        shard_range(4, 10, 3)


def test_permutation_is_stable_and_seeded() -> None:
    # Pinned values: a change here would silently change every job's data order.
    assert permutation(8, "gearshift/epoch/1/0") == epoch_order(8, 1, 0)
    assert epoch_order(8, 1, 0) == [7, 4, 5, 3, 6, 0, 2, 1]
    assert epoch_order(8, 1, 1) != epoch_order(8, 1, 0)
    assert sorted(epoch_order(100, 7, 3)) == list(range(100))


@pytest.mark.parametrize("num_ranks", [1, 3, 4, 8])
def test_ranks_partition_each_epoch(num_ranks: int) -> None:
    size, shard_size, seed = 1797, 64, 5
    total = num_shards(size, shard_size)
    for epoch in range(3):
        seen = [
            index
            for rank in range(num_ranks)
            for shard in rank_sequence(total, seed, epoch, num_ranks, rank)
            for index in shard_indices(shard, size, shard_size, seed, epoch, shuffle_within=True)
        ]
        assert sorted(seen) == list(range(size))
        lengths = [len(rank_sequence(total, seed, epoch, num_ranks, r)) for r in range(num_ranks)]
        assert max(lengths) - min(lengths) <= 1


def test_within_shard_shuffle_is_a_permutation_of_the_range() -> None:
    indices = shard_indices(2, 100, 10, seed=3, epoch=1, shuffle_within=True)
    assert sorted(indices) == list(range(20, 30))
    assert indices != list(range(20, 30))
    assert shard_indices(2, 100, 10, seed=3, epoch=1, shuffle_within=False) == list(range(20, 30))
