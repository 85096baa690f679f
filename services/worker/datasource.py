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
`<job>/est-<i>`). Which EST reads which shard depends on timing, so such a run
is **not** bitwise reproducible. The dataset has provisional acknowledgements:
a shard is acknowledged as soon as it is read (the epoch may roll over at once:
the ESTs of a synchronous job cannot finish a step while one of them waits for
an epoch to end, so no shard is held across a step), but the acknowledgement
stays provisional until a durable checkpoint holds the step that consumed it;
then the feed covers it (CoverShards) and it is final. A process that starts
(fresh, resumed, rescaled) first releases its ESTs' holders at the step it resumes
from (ReleaseHolder with resume_step; every grant recorded the step that reads it):
the shards a dead or stopped predecessor read for steps before it are final (the
checkpoint holds them, whether or not its writer lived to cover them), and those
it read at or after it (the steps rolled back, or handed out and never trained on)
go back to the queue, in their own epoch, and are read again. The scheduler's
release when a process dies takes back only the shards held unacknowledged, so it
cannot undo what a checkpoint holds. So every sample is read at least once per
epoch, by a step that a checkpoint keeps, and a sample is read twice exactly when
the step that read it was rolled back. The holders are per EST, not per process,
so the accounting follows an EST when a rescale moves it.

The holders are shared by every placement of the job, so each call for one carries
the placement's generation (`--generation`, from the scheduler's StartTaskRequest):
a placement that should be gone but still runs (its worker was declared lost) is
fenced out by the newer one's release at its start, and its next call for a holder
is refused. The feed then raises StalePlacementError: the process exits at once
(no retry, no checkpoint), since its covers would make final the reads that the
newer placement rolled back.

`--index-log-dir` makes the feed append what it does to a file of its own: every
shard read (step, EST, epoch, shard, sample indices), its release at the start
(with its placement's name, and each shard it put back with the step that had
read it) and, in the checkpoint writer's file, each cover, so a test can count
which samples were read and which again.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from gearshift.common import sharding
from gearshift.common.errors import (
    ConflictError,
    FencedError,
    GearshiftError,
    PreconditionError,
    ValidationError,
)
from gearshift.common.facts import shard_holder_id
from gearshift.worker.runtime.data import PendingReads, SupersededError
from gearshift.worker.shard_client import ShardClient, ShardConsumer

log = logging.getLogger("gearshift.worker.datasource")

_PAGE = 1000  # GetShardsAt's most shards per call
_COVER_BATCH = 10_000  # CoverShards' most shards per call
# Deliveries of a dynamic-mode shard before the shard manager gives up on it. Every kill
# hands out again the shards of the steps it rolled back, which are the first ones the
# next placement reads, so a job killed a few times in a row (chaos) would fail them at
# the shard manager's default of 3 and lose their samples; the scheduler's restart limit
# bounds a crash loop instead.
DYNAMIC_MAX_ATTEMPTS = 100


class StalePlacementError(SupersededError):
    """A newer placement of this job holds one of this process's ESTs: exit, no checkpoint.

    Raised by the dynamic feed on the shard manager's fenced refusal; the training
    process's entry point turns it into its log line and a failure exit code.
    """

    def __init__(self, est: int, fenced: FencedError) -> None:
        super().__init__(
            f"a newer placement of this job holds EST {est}: generation {fenced.generation} "
            f"< current {fenced.current}; exiting"
        )
        self.est = est
        self.fenced = fenced


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
    provisional_acks: bool = False,
    max_attempts: int = 0,
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
            provisional_acks=provisional_acks,
            max_attempts=max_attempts,
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


class IndexLog:
    """JSON lines of what a feed read, covered and released (`--index-log-dir`), for tests.

    Each line is written with one write() and no buffering left behind, so a process
    killed with SIGKILL loses no line it wrote; a line cut short cannot happen either.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: TextIO = path.open("a", buffering=1)

    def write(self, kind: str, **fields: Any) -> None:
        self._file.write(json.dumps({"kind": kind, **fields}) + "\n")

    def close(self) -> None:
        self._file.close()


def index_log_path(directory: Path, job_id: str, rank: int) -> Path:
    """A file of its own for this process (a restarted one gets a new one)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job_id) or "job"
    return directory / f"{safe}.rank{rank}.{os.getpid()}.{time.time_ns()}.jsonl"


class DynamicFeed:
    """BatchFeed over AcquireShard/AckShard: one shard of B/N samples per EST mini-batch.

    CheckpointAware (runtime/data.py): `begin` releases this process's ESTs' holders
    (what a predecessor read after its last checkpoint is read again) and numbers the
    batches from the start step; the process that writes a checkpoint covers every
    process's shards of the steps before it as soon as it is durable, so only the steps
    a crash can roll back stay provisional.

    Every holder call carries `generation`; a fenced one raises StalePlacementError
    (and so does every later call of the feed, `pending_before` included: a process
    whose renewals were fenced must not write the checkpoint of its next step either).
    """

    def __init__(
        self,
        client: ShardClient,
        plan: DataPlan,
        per_est_batch: int,
        *,
        index_log: Path | None = None,
        placement: str = "",
        generation: int = 0,
    ) -> None:
        """`placement` names the processes started together (the task id up to its worker),
        in the index log: a checkpoint's covers are logged by the process that wrote it.
        `generation`: the placement's generation (0: unfenced, as before fences existed)."""
        self.client = client
        self.placement = placement
        self.generation = generation
        self._stale: StalePlacementError | None = None
        self.plan = plan
        self.per_est_batch = per_est_batch
        self.size = plan.size
        self._consumers: dict[int, ShardConsumer] = {}
        self._start = 0
        self._taken: dict[int, int] = {}  # EST -> batches handed out since begin
        # EST -> (step, epoch, shard) read and not covered yet, oldest first.
        self._uncovered: dict[int, deque[tuple[int, int, int]]] = {}
        self.log = IndexLog(index_log) if index_log is not None else None

    def create(self) -> None:
        _create_dataset(
            self.client,
            self.plan,
            shard_size=self.per_est_batch,
            mode="dynamic",
            provisional_acks=True,
            max_attempts=DYNAMIC_MAX_ATTEMPTS,
        )

    def _holder(self, est: int) -> str:
        return shard_holder_id(self.plan.job_id, est)

    def _fenced(self, est: int, exc: FencedError) -> StalePlacementError:
        """The error to stop with, said once in the log (the process exits with it)."""
        if self._stale is None:
            self._stale = StalePlacementError(est, exc)
            log.error(
                str(self._stale),
                extra={"dataset_id": self.plan.dataset_id, "est": est, "error": exc.message},
            )
            if self.log is not None:
                self.log.write(
                    "fenced", est=est, generation=exc.generation, current=exc.current,
                    placement=self.placement,
                )  # fmt: skip
        return self._stale

    def _check_fenced(self) -> None:
        """Raise if any call of the feed, a background renewal's included, was fenced."""
        if self._stale is not None:
            raise self._stale
        for est, consumer in self._consumers.items():
            if consumer.fenced is not None:
                raise self._fenced(est, consumer.fenced)

    def begin(self, step: int, ests: Sequence[int]) -> None:
        self._start = step
        self._taken = {est: 0 for est in ests}
        self._uncovered = {est: deque() for est in ests}
        requeued: dict[int, int] = {}
        covered: dict[int, int] = {}
        released: dict[int, list[tuple[int, int, int, bool]]] = {}
        for est in ests:
            try:
                reply = self.client.release_holder(
                    self.plan.dataset_id,
                    self._holder(est),
                    f"a process starts EST {est} at step {step}: what it read since its last "
                    "checkpoint is read again",
                    resume_step=step,
                    generation=self.generation,
                )
            except FencedError as exc:  # a newer placement started before this one began
                raise self._fenced(est, exc) from None
            requeued[est] = reply.requeued
            covered[est] = reply.covered
            released[est] = [
                (r.epoch, r.shard_id, r.read_step, r.acknowledged) for r in reply.released
            ]
        if any(requeued.values()):
            log.info(
                "shards read after the last checkpoint go back to the queue",
                extra={"dataset_id": self.plan.dataset_id, "step": step, "requeued": requeued},
            )
        if self.log is not None:
            self.log.write(
                "begin", step=step, ests=list(ests), requeued=requeued, covered=covered,
                released=released, placement=self.placement,
            )  # fmt: skip

    def next_samples(self, est: int, count: int) -> tuple[int, list[int]]:
        self._check_fenced()
        consumer = self._consumers.get(est)
        if consumer is None:
            consumer = self.client.consumer(
                self.plan.dataset_id, self._holder(est), generation=self.generation
            )
            self._consumers[est] = consumer
        taken = self._taken.get(est, 0)
        step = self._start + taken
        try:
            shard = consumer.acquire(read_step=step)
        except FencedError as exc:
            raise self._fenced(est, exc) from None
        if shard is None:
            raise RuntimeError(f"dataset {self.plan.dataset_id!r} has no samples left")
        try:
            consumer.ack(shard)
        except FencedError as exc:
            raise self._fenced(est, exc) from None
        except PreconditionError as exc:  # taken back meanwhile: someone reads it again
            log.warning("shard taken back before its acknowledgement", extra={"error": exc.message})
        self._taken[est] = taken + 1
        self._uncovered.setdefault(est, deque()).append((step, shard.epoch, shard.shard_id))
        samples = shard.sample_indices()[:count]
        if self.log is not None:
            self.log.write(
                "read", step=step, est=est, epoch=shard.epoch, shard=shard.shard_id,
                indices=samples,
            )  # fmt: skip
        return shard.epoch, samples

    def pending_before(self, step: int) -> PendingReads:
        self._check_fenced()  # before the checkpoint of `step` is written: none if fenced
        return {
            est: [(epoch, shard) for read_at, epoch, shard in reads if read_at < step]
            for est, reads in self._uncovered.items()
        }

    def checkpoint_durable(self, step: int, pending: Sequence[PendingReads] | None) -> None:
        """The checkpoint of `step` is on disk: the writer covers every process's reads of
        the steps before it; every process forgets its own. A cover that fails leaves
        them provisional: a restart reads them again (never fewer reads, at worst more)."""
        for reads in self._uncovered.values():
            while reads and reads[0][0] < step:
                reads.popleft()
        for part in pending or ():
            for est, refs in part.items():
                self._cover(step, est, refs)

    def _cover(self, step: int, est: int, refs: list[tuple[int, int]]) -> None:
        covered = 0
        try:
            for first in range(0, len(refs), _COVER_BATCH):
                chunk = refs[first : first + _COVER_BATCH]
                covered += self.client.cover(
                    self.plan.dataset_id, self._holder(est), chunk, generation=self.generation
                )
        except FencedError as exc:  # the checkpoint is written; no more of this placement
            raise self._fenced(est, exc) from None
        except GearshiftError as exc:
            log.warning(
                "shards not covered by the checkpoint; they stay provisional",
                extra={"step": step, "est": est, "error": exc.message},
            )
            return
        if self.log is not None:
            self.log.write("covered", step=step, est=est, shards=covered)

    def close(self) -> None:
        for consumer in self._consumers.values():
            consumer.close()
        if self.log is not None:
            self.log.close()
