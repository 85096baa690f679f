"""An EST's sample stream: a pure function of (seed, epoch, N, EST), resumable from a position."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gearshift.common import sharding
from gearshift.common.errors import ValidationError
from gearshift.worker.runtime.data import DataPosition, EstStream, LocalShards, epoch_samples


def test_est_i_reads_logical_rank_i_shards() -> None:
    source = LocalShards(size=1797, shard_size=32, seed=3, num_ranks=4)
    total = sharding.num_shards(1797, 32)
    for est in range(4):
        expected = [
            i
            for shard in sharding.rank_sequence(total, 3, 0, 4, est)
            for i in sharding.shard_indices(shard, 1797, 32, 3, 0, shuffle_within=True)
        ]
        assert epoch_samples(source, 0, est) == expected


def test_ests_partition_every_epoch() -> None:
    source = LocalShards(size=500, shard_size=16, seed=1, num_ranks=3)
    for epoch in range(3):
        seen = sorted(i for est in range(3) for i in epoch_samples(source, epoch, est))
        assert seen == list(range(500))
    assert epoch_samples(source, 0, 0) != epoch_samples(source, 1, 0)


def test_stream_resumes_from_its_position_across_epochs() -> None:
    source = LocalShards(size=100, shard_size=10, seed=0, num_ranks=4)
    whole = EstStream(source, 2, DataPosition())
    batches = [whole.take(7) for _ in range(12)]  # 84 samples: 4 epochs of 20, and 4 more
    assert len(epoch_samples(source, 0, 2)) == 20
    assert whole.position == DataPosition(epoch=4, offset=4)
    again = EstStream(source, 2, DataPosition())
    resumed_batches = [again.take(7) for _ in range(5)]
    resumed = EstStream(source, 2, again.position)
    resumed_batches += [resumed.take(7) for _ in range(7)]
    assert resumed_batches == batches
    first_epoch = epoch_samples(source, 0, 2)
    assert [i for b in batches for i in b][: len(first_epoch)] == first_epoch


class ManagerLikeSource:
    """Stands in for a shard manager serving the deterministic plan (GetShardsAt)."""

    def __init__(self, plan: dict[tuple[int, int], list[int]], shards: dict[int, list[int]]):
        self.plan = plan
        self.shards = shards

    def rank_shards(self, epoch: int, rank: int) -> Sequence[int]:
        return self.plan[(epoch, rank)]

    def shard_samples(self, shard_id: int, epoch: int) -> Sequence[int]:
        return self.shards[shard_id]


def test_another_source_with_the_same_plan_gives_the_same_stream() -> None:
    local = LocalShards(size=64, shard_size=8, seed=5, num_ranks=2)
    plan = {(e, r): list(local.rank_shards(e, r)) for e in range(4) for r in range(2)}
    shards = {s: list(local.shard_samples(s, 0)) for s in range(8)}
    # Within-shard order depends on the epoch; give the stand-in epoch 0's for every epoch
    # and compare one epoch.
    stand_in = ManagerLikeSource(plan, shards)
    assert EstStream(stand_in, 1, DataPosition()).take(32) == EstStream(
        local, 1, DataPosition()
    ).take(32)


def test_fewer_shards_than_ests_is_refused() -> None:
    with pytest.raises(ValidationError, match="--shard-size: 100 samples in shards of 40"):
        LocalShards(size=100, shard_size=40, seed=0, num_ranks=4)
