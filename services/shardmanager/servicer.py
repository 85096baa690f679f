"""gRPC servicer of the shard manager: validate the request, call the store, build the reply.

Nothing here holds state: every answer comes from one or two atomic Redis
steps in the store, so replicas of this servicer are interchangeable.
Bad input is rejected before Redis is touched (INVALID_ARGUMENT naming the
field); refusals that depend on the stored state come from the store.

Every method is a coroutine on the daemon's event loop (grpc.aio) over
`AsyncShardStore`: a consumer's StreamShards stream then holds no thread, and
the Redis commands of concurrent calls share pipelined connections.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from typing import Any

import grpc

from gearshift.common.errors import GearshiftError
from gearshift.common.validation import check_generation, check_name, require
from gearshift.shardmanager import metrics
from gearshift.shardmanager.model import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_MAX_ATTEMPTS,
    AcquireStatus,
    DatasetSettings,
    DatasetStatus,
    Mode,
    ShardData,
)
from gearshift.shardmanager.store import AsyncShardStore
from gearshift.v1 import common_pb2, shardmanager_pb2, shardmanager_pb2_grpc

log = logging.getLogger("gearshift.shardmanager")

MAX_SIZE = 10**12  # samples; keeps every counter exact in Redis's Lua (doubles)
MAX_EPOCHS = 1_000_000
MAX_RANKS = 1_000_000
MAX_ATTEMPTS = 1000
MIN_LEASE_SECONDS = 0.05
MAX_LEASE_SECONDS = 86_400.0
MAX_COUNT = 1000
MAX_RENEW_IDS = 10_000
MAX_HOLDER_LENGTH = 256
MAX_REQUEST_ID_LENGTH = 128

_MODES = {
    common_pb2.DATA_MODE_UNSPECIFIED: Mode.DETERMINISTIC,
    common_pb2.DATA_MODE_DYNAMIC: Mode.DYNAMIC,
    common_pb2.DATA_MODE_DETERMINISTIC: Mode.DETERMINISTIC,
}
_MODE_ENUMS = {
    Mode.DYNAMIC: common_pb2.DATA_MODE_DYNAMIC,
    Mode.DETERMINISTIC: common_pb2.DATA_MODE_DETERMINISTIC,
}
_ACQUIRE_STATUS = {
    AcquireStatus.GRANTED: shardmanager_pb2.ACQUIRE_STATUS_GRANTED,
    AcquireStatus.WAIT: shardmanager_pb2.ACQUIRE_STATUS_WAIT,
    AcquireStatus.END_OF_DATA: shardmanager_pb2.ACQUIRE_STATUS_END_OF_DATA,
}


# -- validation ----------------------------------------------------------------


def check_holder(value: str, field: str = "holder_id") -> None:
    """A holder id: 1-256 printable characters, no whitespace (e.g. "job-1/rank-3")."""
    require(bool(value), field, "is required")
    require(
        len(value) <= MAX_HOLDER_LENGTH, field, f"must be {MAX_HOLDER_LENGTH} characters or fewer"
    )
    require(
        value.isprintable() and not any(c.isspace() for c in value),
        field,
        f"{value!r} must be printable characters without spaces",
    )


def check_request_id(value: str) -> None:
    """A retry's id (empty: none); '|' separates it from what the store keeps with it."""
    require(
        len(value) <= MAX_REQUEST_ID_LENGTH,
        "request_id",
        f"must be at most {MAX_REQUEST_ID_LENGTH} characters",
    )
    require(
        value.isprintable() and not any(c.isspace() or c == "|" for c in value),
        "request_id",
        f"{value!r} must be printable characters without spaces or '|'",
    )


def _non_negative(value: int, field: str) -> None:
    require(value >= 0, field, f"must be >= 0 (got {value})")


def check_acquire(request: shardmanager_pb2.AcquireShardRequest, *, identity: bool = True) -> None:
    """An AcquireShard request; `identity=False` skips dataset and holder (checked before)."""
    if identity:
        check_name(request.dataset_id, "dataset_id")
        check_holder(request.holder_id)
    check_request_id(request.request_id)
    if request.HasField("ack"):
        _non_negative(request.ack.epoch, "ack.epoch")
        _non_negative(request.ack.shard_id, "ack.shard_id")
    if request.HasField("read_step"):
        _non_negative(request.read_step, "read_step")
    check_generation(request.generation)


def check_release(request: shardmanager_pb2.ReleaseHolderRequest) -> None:
    """A ReleaseHolder request: a resume step is >= 0 and excludes keep_provisional."""
    check_name(request.dataset_id, "dataset_id")
    check_holder(request.holder_id)
    check_generation(request.generation)
    check_request_id(request.request_id)
    if request.HasField("resume_step"):
        _non_negative(request.resume_step, "resume_step")
        require(
            not request.keep_provisional,
            "keep_provisional",
            "cannot be set with resume_step (a release either settles the provisional "
            "acknowledgements at a step or keeps them)",
        )


def settings_from_request(config: shardmanager_pb2.DatasetConfig) -> DatasetSettings:
    """Validate a DatasetConfig field by field and apply its defaults."""
    check_name(config.job_id, "config.job_id")
    require(
        0 < config.size <= MAX_SIZE, "config.size", f"must be 1..{MAX_SIZE} (not {config.size})"
    )
    require(
        0 < config.shard_size <= config.size,
        "config.shard_size",
        f"must be 1..size ({config.size}) (got {config.shard_size})",
    )
    require(
        0 < config.num_epochs <= MAX_EPOCHS,
        "config.num_epochs",
        f"must be 1..{MAX_EPOCHS} (got {config.num_epochs})",
    )
    require(config.mode in _MODES, "config.mode", f"unknown value {config.mode}")
    mode = _MODES[config.mode]
    if mode is Mode.DETERMINISTIC:
        require(
            0 < config.num_ranks <= MAX_RANKS,
            "config.num_ranks",
            f"must be 1..{MAX_RANKS} in deterministic mode (got {config.num_ranks})",
        )
    else:
        _non_negative(config.num_ranks, "config.num_ranks")
    lease = config.lease_seconds or DEFAULT_LEASE_SECONDS
    require(
        math.isfinite(lease) and MIN_LEASE_SECONDS <= lease <= MAX_LEASE_SECONDS,
        "config.lease_seconds",
        f"must be 0 (default) or {MIN_LEASE_SECONDS}..{MAX_LEASE_SECONDS} (got {lease})",
    )
    attempts = config.max_attempts or DEFAULT_MAX_ATTEMPTS
    require(
        0 < attempts <= MAX_ATTEMPTS,
        "config.max_attempts",
        f"must be 0 (default) or 1..{MAX_ATTEMPTS} (got {config.max_attempts})",
    )
    return DatasetSettings(
        job_id=config.job_id,
        size=config.size,
        shard_size=config.shard_size,
        seed=config.seed,
        num_epochs=config.num_epochs,
        mode=mode,
        num_ranks=config.num_ranks,
        lease_ms=round(lease * 1000),
        max_attempts=attempts,
        shuffle_within_shard=config.shuffle_within_shard,
        provisional_acks=mode is Mode.DYNAMIC and config.provisional_acks,
    )


# -- messages ------------------------------------------------------------------


def config_message(settings: DatasetSettings) -> shardmanager_pb2.DatasetConfig:
    return shardmanager_pb2.DatasetConfig(
        job_id=settings.job_id,
        size=settings.size,
        shard_size=settings.shard_size,
        seed=settings.seed,
        num_epochs=settings.num_epochs,
        mode=_MODE_ENUMS[settings.mode],
        num_ranks=settings.num_ranks,
        lease_seconds=settings.lease_ms / 1000.0,
        max_attempts=settings.max_attempts,
        shuffle_within_shard=settings.shuffle_within_shard,
        provisional_acks=settings.provisional_acks,
    )


def dataset_message(status: DatasetStatus) -> shardmanager_pb2.Dataset:
    return shardmanager_pb2.Dataset(
        dataset_id=status.dataset_id,
        config=config_message(status.settings),
        epoch=status.epoch,
        state=(
            shardmanager_pb2.DATASET_STATE_FINISHED
            if status.finished
            else shardmanager_pb2.DATASET_STATE_ACTIVE
        ),
        epochs=[
            shardmanager_pb2.EpochProgress(
                epoch=p.epoch,
                samples_done=p.samples_done,
                samples_in_flight=p.samples_in_flight,
                samples_todo=p.samples_todo,
                samples_redelivered=p.samples_redelivered,
                samples_failed=p.samples_failed,
                failed_shards=p.failed_shards,
                shards_done=p.shards_done,
                shards_redelivered=p.shards_redelivered,
                shards_undone=p.shards_undone,
            )
            for p in status.epochs
        ],
        num_shards=status.settings.num_shards,
    )


def shard_message(shard: ShardData) -> shardmanager_pb2.Shard:
    return shardmanager_pb2.Shard(
        epoch=shard.epoch,
        shard_id=shard.shard_id,
        start=shard.start,
        end=shard.end,
        indices=shard.indices or (),
        attempt=shard.attempt,
        lease_deadline=shard.lease_deadline_ms / 1000.0,
    )


# -- the servicer ----------------------------------------------------------------


Context = grpc.aio.ServicerContext[Any, Any]


class ShardManagerServicer(shardmanager_pb2_grpc.ShardManagerServicer):
    """Every RPC: validate, one store call, reply."""

    def __init__(self, store: AsyncShardStore) -> None:
        self.store = store

    async def CreateDataset(
        self, request: shardmanager_pb2.CreateDatasetRequest, context: Context
    ) -> shardmanager_pb2.Dataset:
        check_name(request.dataset_id, "dataset_id")
        require(request.HasField("config"), "config", "is required")
        settings = settings_from_request(request.config)
        status = await self.store.create(request.dataset_id, settings)
        metrics.transition("created")
        return dataset_message(status)

    async def DescribeDataset(
        self, request: shardmanager_pb2.DescribeDatasetRequest, context: Context
    ) -> shardmanager_pb2.Dataset:
        check_name(request.dataset_id, "dataset_id")
        return dataset_message(await self.store.describe(request.dataset_id))

    async def DeleteDataset(
        self, request: shardmanager_pb2.DeleteDatasetRequest, context: Context
    ) -> shardmanager_pb2.DeleteDatasetResponse:
        check_name(request.dataset_id, "dataset_id")
        deleted = await self.store.delete(request.dataset_id)
        metrics.transition("deleted", int(deleted))
        if deleted:
            log.info("dataset deleted", extra={"dataset_id": request.dataset_id})
        return shardmanager_pb2.DeleteDatasetResponse(deleted=deleted)

    async def DeleteJobDatasets(
        self, request: shardmanager_pb2.DeleteJobDatasetsRequest, context: Context
    ) -> shardmanager_pb2.DeleteJobDatasetsResponse:
        check_name(request.job_id, "job_id")
        deleted = await self.store.delete_job(request.job_id)
        metrics.transition("deleted", len(deleted))
        if deleted:
            log.info("job datasets deleted", extra={"job_id": request.job_id, "datasets": deleted})
        return shardmanager_pb2.DeleteJobDatasetsResponse(dataset_ids=deleted)

    async def AcquireShard(
        self, request: shardmanager_pb2.AcquireShardRequest, context: Context
    ) -> shardmanager_pb2.AcquireShardResponse:
        check_acquire(request)
        return await self._acquire(request)

    async def StreamShards(
        self,
        request_iterator: AsyncIterator[shardmanager_pb2.StreamShardsRequest],
        context: Context,
    ) -> AsyncIterator[shardmanager_pb2.StreamShardsResponse]:
        """AcquireShard per message; refusals answered in-band so the stream stays open.

        The stream's dataset and holder are validated once, not per message,
        while they stay the same. Unexpected errors end the stream (INTERNAL).
        """
        checked: tuple[str, str] | None = None
        async for message in request_iterator:
            request = message.acquire
            try:
                if checked != (request.dataset_id, request.holder_id):
                    require(message.HasField("acquire"), "acquire", "is required")
                    check_acquire(request)
                    checked = (request.dataset_id, request.holder_id)
                else:
                    check_acquire(request, identity=False)
                reply = await self._acquire(request)
            except GearshiftError as exc:
                yield shardmanager_pb2.StreamShardsResponse(
                    error_code=exc.code.value[0], error_message=exc.message
                )
                continue
            yield shardmanager_pb2.StreamShardsResponse(reply=reply)

    async def _acquire(
        self, request: shardmanager_pb2.AcquireShardRequest
    ) -> shardmanager_pb2.AcquireShardResponse:
        ack = None
        if request.HasField("ack"):
            ack = (request.ack.epoch, request.ack.shard_id)
        read_step = request.read_step if request.HasField("read_step") else None
        result = await self.store.acquire(
            request.dataset_id,
            request.holder_id,
            request.request_id,
            ack,
            read_step,
            generation=request.generation,
        )
        metrics.transition("acked", int(bool(result.acked)))
        metrics.transition("acquired", int(result.shard is not None))
        return shardmanager_pb2.AcquireShardResponse(
            status=_ACQUIRE_STATUS[result.status],
            shard=None if result.shard is None else shard_message(result.shard),
            lease_seconds=result.lease_seconds,
            acked=bool(result.acked),
        )

    async def AckShard(
        self, request: shardmanager_pb2.AckShardRequest, context: Context
    ) -> shardmanager_pb2.AckShardResponse:
        check_name(request.dataset_id, "dataset_id")
        check_holder(request.holder_id)
        _non_negative(request.epoch, "epoch")
        _non_negative(request.shard_id, "shard_id")
        check_generation(request.generation)
        acked = await self.store.ack(
            request.dataset_id,
            request.holder_id,
            request.epoch,
            request.shard_id,
            generation=request.generation,
        )
        metrics.transition("acked", int(acked))
        return shardmanager_pb2.AckShardResponse(acknowledged=acked)

    async def CoverShards(
        self, request: shardmanager_pb2.CoverShardsRequest, context: Context
    ) -> shardmanager_pb2.CoverShardsResponse:
        check_name(request.dataset_id, "dataset_id")
        check_holder(request.holder_id)
        require(
            len(request.shards) <= MAX_RENEW_IDS,
            "shards",
            f"must list at most {MAX_RENEW_IDS} shards",
        )
        for i, ref in enumerate(request.shards):
            _non_negative(ref.epoch, f"shards[{i}].epoch")
            _non_negative(ref.shard_id, f"shards[{i}].shard_id")
        check_generation(request.generation)
        refs = [(ref.epoch, ref.shard_id) for ref in request.shards]
        covered = await self.store.cover(
            request.dataset_id, request.holder_id, refs, generation=request.generation
        )
        metrics.transition("covered", covered)
        return shardmanager_pb2.CoverShardsResponse(covered=covered)

    async def RenewLeases(
        self, request: shardmanager_pb2.RenewLeasesRequest, context: Context
    ) -> shardmanager_pb2.RenewLeasesResponse:
        check_name(request.dataset_id, "dataset_id")
        check_holder(request.holder_id)
        _non_negative(request.epoch, "epoch")
        require(
            len(request.shard_ids) <= MAX_RENEW_IDS,
            "shard_ids",
            f"must list at most {MAX_RENEW_IDS} shards",
        )
        for i, shard_id in enumerate(request.shard_ids):
            _non_negative(shard_id, f"shard_ids[{i}]")
        check_generation(request.generation)
        result = await self.store.renew(
            request.dataset_id,
            request.holder_id,
            request.epoch,
            list(request.shard_ids),
            generation=request.generation,
        )
        return shardmanager_pb2.RenewLeasesResponse(
            renewed=result.renewed,
            lease_deadline=result.lease_deadline_ms / 1000.0,
            lost_shard_ids=result.lost,
        )

    async def ReleaseHolder(
        self, request: shardmanager_pb2.ReleaseHolderRequest, context: Context
    ) -> shardmanager_pb2.ReleaseHolderResponse:
        check_release(request)
        resume = request.resume_step if request.HasField("resume_step") else None
        result = await self.store.release(
            request.dataset_id,
            request.holder_id,
            resume,
            keep_provisional=request.keep_provisional,
            generation=request.generation,
            request_id=request.request_id,
        )
        if not result.repeat:  # a retry's answer: counted when it was first carried out
            metrics.transition("requeued", len(result.requeued))
            metrics.transition("failed", len(result.failed))
            metrics.transition("covered", result.covered)
        # Logged again on a retry (`repeat`): the first call's line is missing when this
        # daemon was killed after Redis ran the release and before it logged; audits count
        # a request id once.
        if result.requeued or result.failed or result.covered:
            log.info(
                "holder released",
                extra={
                    "dataset_id": request.dataset_id,
                    "holder_id": request.holder_id,
                    "reason": request.reason,
                    "requeued": list(result.requeued),
                    "failed": list(result.failed),
                    "resume_step": resume,
                    "generation": request.generation,
                    "covered": result.covered,
                    # epoch:shard:read step:1 if its ack was undone (0: held), for audits
                    "released": [
                        f"{r.epoch}:{r.shard_id}:{r.read_step}:{int(r.acknowledged)}"
                        for r in result.released
                    ],
                    "request_id": request.request_id,
                    "repeat": result.repeat,
                },
            )
        return shardmanager_pb2.ReleaseHolderResponse(
            requeued=len(result.requeued),
            failed=len(result.failed),
            epoch=result.epoch,
            requeued_shard_ids=result.requeued,
            failed_shard_ids=result.failed,
            covered=result.covered,
            released=[
                shardmanager_pb2.ReleasedShard(
                    epoch=r.epoch,
                    shard_id=r.shard_id,
                    read_step=r.read_step,
                    acknowledged=r.acknowledged,
                )
                for r in result.released
            ],
        )

    async def GetShardsAt(
        self, request: shardmanager_pb2.GetShardsAtRequest, context: Context
    ) -> shardmanager_pb2.GetShardsAtResponse:
        check_name(request.dataset_id, "dataset_id")
        _non_negative(request.rank, "rank")
        _non_negative(request.epoch, "epoch")
        _non_negative(request.position, "position")
        require(
            0 <= request.count <= MAX_COUNT,
            "count",
            f"must be 0..{MAX_COUNT} (not {request.count})",
        )
        found = await self.store.shards_at(
            request.dataset_id, request.rank, request.epoch, request.position, request.count or 1
        )
        metrics.deterministic_read(len(found.shards))
        return shardmanager_pb2.GetShardsAtResponse(
            shards=[shard_message(s) for s in found.shards],
            sequence_length=found.sequence_length,
        )

    async def CheckpointDataset(
        self, request: shardmanager_pb2.CheckpointDatasetRequest, context: Context
    ) -> shardmanager_pb2.CheckpointDatasetResponse:
        check_name(request.dataset_id, "dataset_id")
        check_name(request.checkpoint_id, "checkpoint_id")
        status = await self.store.checkpoint(request.dataset_id, request.checkpoint_id)
        metrics.transition("checkpointed")
        return shardmanager_pb2.CheckpointDatasetResponse(
            checkpoint_id=request.checkpoint_id, dataset=dataset_message(status)
        )

    async def RestoreDataset(
        self, request: shardmanager_pb2.RestoreDatasetRequest, context: Context
    ) -> shardmanager_pb2.Dataset:
        check_name(request.dataset_id, "dataset_id")
        check_name(request.checkpoint_id, "checkpoint_id")
        status = await self.store.restore(
            request.dataset_id, request.checkpoint_id, force=request.force
        )
        metrics.transition("restored")
        log.info(
            "dataset restored",
            extra={
                "dataset_id": request.dataset_id,
                "checkpoint_id": request.checkpoint_id,
                "epoch": status.epoch,
            },
        )
        return dataset_message(status)
