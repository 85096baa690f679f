"""A training process's data from the shard manager, in either of its modes.

Deterministic mode (every EST job by default): `ManagedShards` reads logical
rank i's shard sequence of an epoch with GetShardsAt and the shards' sample
orders from the same answer. The dataset is created with the job's size, shard
size and seed, `num_ranks` = the job's ESTs and shuffling within shards, so the
stream is exactly the one `LocalShards` computes in-process: a job reads the
same samples with or without the shard manager, and a run through the cluster
ends with the digest of a local run. The position in the stream is part of
every EST's checkpoint; the service keeps no per-reader state, so it may
restart at any time (calls are retried meanwhile).

Dynamic mode (a job that sets `dataset.mode = DATA_MODE_DYNAMIC`): `DynamicFeed`
pulls each EST's mini-batch as one shard of B/N samples (AcquireShard, holder
`<job>/est-<i>`) and acknowledges it as soon as it is read. Which EST reads
which shard depends on timing, so such a run is **not** bitwise reproducible.
Within an epoch every sample is handed out once; a shard held by a process
that died goes back to the queue (ReleaseHolder from the scheduler, or its
lease running out) and is read again by someone else; the samples of steps
rolled back to the last checkpoint after a crash are not read again in that
epoch. A shard is acknowledged on read rather than after its step because the
ESTs of a synchronous job cannot finish a step while one of them waits for an
epoch to end: holding a shard across a step boundary could deadlock the epoch.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from gearshift.common import sharding
from gearshift.common.errors import ConflictError, PreconditionError, ValidationError
from gearshift.common.facts import shard_holder_id
from gearshift.worker.shard_client import ShardClient, ShardConsumer

log = logging.getLogger("gearshift.worker.datasource")

_PAGE = 1000  # GetShardsAt's most shards per call


@dataclass(frozen=True)
class DataPlan:
    """What the dataset of a job looks like in the shard manager."""

    dataset_id: str
    job_id: str
    size: int
    shard_size: int
    seed: int
    num_ranks: int
    num_epochs: int


def epochs_needed(
    size: int, shard_size: int, num_ranks: int, per_rank_batch: int, total_steps: int
) -> int:
    """Epochs a run of `total_steps` can reach, plus one: the dataset must not end first.

    The shortest rank sequence of an epoch has `num_shards // num_ranks` shards, one
    of which may be the short last shard.
    """
    shards = sharding.num_shards(size, shard_size)
    if shards < num_ranks:
        raise ValidationError(
            "--shard-size",
            f"{size} samples in shards of {shard_size} make {shards} shards, fewer than the "
            f"{num_ranks} ESTs; use a smaller shard size",
        )
    last = size - (shards - 1) * shard_size
    fewest = (shards // num_ranks - 1) * shard_size + last
    return math.ceil(total_steps * per_rank_batch / max(fewest, 1)) + 1


def _create_dataset(
    client: ShardClient,
    plan: DataPlan,
    *,
    shard_size: int,
    mode: str,
    num_ranks: int = 0,
    shuffle_within_shard: bool = False,
) -> None:
    """Create the plan's dataset, or find it with the same settings (every process calls this)."""
    try:
        client.create_dataset(
            plan.dataset_id,
            job_id=plan.job_id,
            size=plan.size,
            shard_size=shard_size,
            seed=plan.seed,
            num_epochs=plan.num_epochs,
            mode=mode,
            num_ranks=num_ranks,
            shuffle_within_shard=shuffle_within_shard,
        )
    except ConflictError as exc:
        raise ValidationError(
            "dataset_id",
            f"{plan.dataset_id!r} exists in the shard manager with other settings: {exc.message}",
        ) from None


class ManagedShards:
    """ShardSource over GetShardsAt: the shards of (epoch, rank) and their sample orders."""

    def __init__(self, client: ShardClient, plan: DataPlan) -> None:
        self.client = client
        self.plan = plan
        self.size = plan.size  # checked against the job's dataset by the trainer
        self._samples: dict[tuple[int, int], list[int]] = {}
        self._epochs: list[int] = []

    def create(self) -> None:
        """Create the dataset, or find it with the same settings (every process calls this)."""
        _create_dataset(
            self.client,
            self.plan,
            shard_size=self.plan.shard_size,
            mode="deterministic",
            num_ranks=self.plan.num_ranks,
            shuffle_within_shard=True,
        )

    def rank_shards(self, epoch: int, rank: int) -> list[int]:
        ids: list[int] = []
        for shard in self.client.rank_shards(self.plan.dataset_id, rank, epoch, 0, batch=_PAGE):
            self._samples[(epoch, shard.shard_id)] = shard.sample_indices()
            ids.append(shard.shard_id)
        if epoch not in self._epochs:
            self._epochs.append(epoch)
            # An EST moves to epoch e+1 only after reading all of e: keep the two newest.
            for old in self._epochs[:-2]:
                for key in [k for k in self._samples if k[0] == old]:
                    del self._samples[key]
            self._epochs = self._epochs[-2:]
        return ids

    def shard_samples(self, shard_id: int, epoch: int) -> list[int]:
        samples = self._samples.get((epoch, shard_id))
        if samples is None:
            raise RuntimeError(f"shard {shard_id} of epoch {epoch} was read before its rank list")
        return samples


class DynamicFeed:
    """BatchFeed over AcquireShard/AckShard: one shard of B/N samples per EST mini-batch."""

    def __init__(self, client: ShardClient, plan: DataPlan, per_est_batch: int) -> None:
        self.client = client
        self.plan = plan
        self.per_est_batch = per_est_batch
        self.size = plan.size
        self._consumers: dict[int, ShardConsumer] = {}

    def create(self) -> None:
        _create_dataset(self.client, self.plan, shard_size=self.per_est_batch, mode="dynamic")

    def next_samples(self, est: int, count: int) -> tuple[int, list[int]]:
        consumer = self._consumers.get(est)
        if consumer is None:
            consumer = self.client.consumer(
                self.plan.dataset_id, shard_holder_id(self.plan.job_id, est)
            )
            self._consumers[est] = consumer
        shard = consumer.acquire()
        if shard is None:
            raise RuntimeError(f"dataset {self.plan.dataset_id!r} has no samples left")
        try:
            consumer.ack(shard)
        except PreconditionError as exc:  # taken back meanwhile: someone reads it again
            log.warning("shard taken back before its acknowledgement", extra={"error": exc.message})
        return shard.epoch, shard.sample_indices()[:count]

    def close(self) -> None:
        for consumer in self._consumers.values():
            consumer.close()
