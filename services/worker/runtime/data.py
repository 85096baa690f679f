"""Each EST's sample stream: a pure function of (seed, epoch, N, EST index), and its position.

EST i reads logical rank i's shard sequence (gearshift.common.sharding), epoch
after epoch; a mini-batch is the next B/N indices of that stream and may span
shards and epochs. The shard sequence comes from a `ShardSource`, so a source
backed by the shard manager's deterministic mode (GetShardsAt) can stand in for
the local computation and yield the identical stream.

A `BatchFeed` is the other kind of source: it hands out each EST's next samples
itself (the shard manager's dynamic mode), so what an EST reads depends on
timing and the run is not reproducible; the position then only counts samples.
A feed that is also `CheckpointAware` is told the step a process starts from and
every checkpoint that became durable: what it handed out for the steps up to that
checkpoint can no longer be rolled back (the dynamic feed makes those shards'
acknowledgements final then; the rest is read again after a restart).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gearshift.common import sharding
from gearshift.common.errors import ValidationError


class ShardSource(Protocol):
    """Which shards a logical rank reads in an epoch, and which samples a shard holds."""

    def rank_shards(self, epoch: int, rank: int) -> Sequence[int]: ...

    def shard_samples(self, shard_id: int, epoch: int) -> Sequence[int]: ...


@runtime_checkable
class BatchFeed(Protocol):
    """Hands out samples on demand: `next_samples(est, count)` -> (epoch, up to `count`
    indices; fewer only at the end of an epoch, never none)."""

    def next_samples(self, est: int, count: int) -> tuple[int, list[int]]: ...


DataSource = ShardSource | BatchFeed


# What a process read and no checkpoint holds yet: EST -> [(epoch, shard), ...] (plain data:
# it travels to the process that writes the checkpoint with the ESTs' contexts).
PendingReads = dict[int, list[tuple[int, int]]]


class SupersededError(RuntimeError):
    """A newer placement of the job has taken over this process's data: the process must
    stop, and a checkpoint it wrote meanwhile must not be resumed from (it holds reads the
    data service no longer counts as this placement's)."""


@runtime_checkable
class CheckpointAware(Protocol):
    """A source that must know which steps a durable checkpoint holds.

    `begin(step, ests)`: this process trains `ests` from global step `step` (a fresh start
    or a resume); called before the first batch is asked for. Each EST then takes one
    batch per step, so the k-th batch of an EST belongs to step `step + k`.
    `pending_before(step)`: what this process read for the steps before `step` that no
    checkpoint holds yet; every process gives it to the one that writes the checkpoint.
    `checkpoint_durable(step, pending)`: the checkpoint of `step` is on disk. The writer
    calls it at once with every process's pending reads (it makes them final before any
    peer can die in the barrier that follows); the others call it after the barrier with
    None, and forget theirs. Any of them may raise SupersededError.
    """

    def begin(self, step: int, ests: Sequence[int]) -> None: ...

    def pending_before(self, step: int) -> PendingReads: ...

    def checkpoint_durable(self, step: int, pending: Sequence[PendingReads] | None) -> None: ...


@dataclass(frozen=True)
class LocalShards:
    """The deterministic shard plan computed in-process (no shard manager)."""

    size: int
    shard_size: int
    seed: int
    num_ranks: int

    def __post_init__(self) -> None:
        total = sharding.num_shards(self.size, self.shard_size)
        if total < self.num_ranks:
            raise ValidationError(
                "--shard-size",
                f"{self.size} samples in shards of {self.shard_size} make {total} shards, fewer "
                f"than the {self.num_ranks} ESTs; use a smaller shard size",
            )

    def rank_shards(self, epoch: int, rank: int) -> Sequence[int]:
        total = sharding.num_shards(self.size, self.shard_size)
        return sharding.rank_sequence(total, self.seed, epoch, self.num_ranks, rank)

    def shard_samples(self, shard_id: int, epoch: int) -> Sequence[int]:
        return sharding.shard_indices(
            shard_id, self.size, self.shard_size, self.seed, epoch, shuffle_within=True
        )


@dataclass(frozen=True)
class DataPosition:
    """How far an EST has read: `offset` samples into its stream of `epoch`."""

    epoch: int = 0
    offset: int = 0


def epoch_samples(source: ShardSource, epoch: int, est: int) -> list[int]:
    """All sample indices EST `est` reads in `epoch`, in order."""
    return [
        i for shard in source.rank_shards(epoch, est) for i in source.shard_samples(shard, epoch)
    ]


class EstStream:
    """Reads an EST's stream from a position; `take` is deterministic given the position."""

    def __init__(self, source: DataSource, est: int, position: DataPosition) -> None:
        # Checked once: isinstance against a runtime-checkable Protocol takes ~60 us.
        self._feed: BatchFeed | None = None
        self._shards: ShardSource | None = None
        if isinstance(source, BatchFeed):
            self._feed = source
        else:
            self._shards = source
        self.est = est
        self.position = position
        self._epoch = -1
        self._samples: list[int] = []

    def _load(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            assert self._shards is not None
            self._samples = epoch_samples(self._shards, epoch, self.est)
            self._epoch = epoch
        return self._samples

    def take(self, count: int) -> list[int]:
        """The next `count` sample indices; advances the position."""
        if self._feed is not None:
            return self._take_fed(self._feed, count)
        out: list[int] = []
        epoch, offset = self.position.epoch, self.position.offset
        while len(out) < count:
            samples = self._load(epoch)
            if not samples:
                raise RuntimeError(f"EST {self.est} has no samples to read in epoch {epoch}")
            if offset >= len(samples):
                epoch, offset = epoch + 1, 0
                continue
            chunk = samples[offset : offset + count - len(out)]
            out += chunk
            offset += len(chunk)
        self.position = DataPosition(epoch, offset)
        return out

    def _take_fed(self, feed: BatchFeed, count: int) -> list[int]:
        epoch, out = feed.next_samples(self.est, count)
        if not out:
            raise RuntimeError(f"EST {self.est} was handed no samples")
        offset = self.position.offset if epoch == self.position.epoch else 0
        self.position = DataPosition(epoch, offset + len(out))
        return out
