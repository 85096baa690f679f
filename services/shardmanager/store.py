"""The shard manager's state in Redis: datasets, shard transitions, leases and snapshots.

Every transition is one Lua script (see `gearshift.shardmanager.lua`), so it
is atomic and costs one Redis round trip; the only two-trip transitions are
the acquire that starts a new epoch and the restore into another epoch: the
first call finds that the next epoch's order is needed, the second passes it
in (the order is a pure function of seed and epoch, computed here with
gearshift.common.sharding, which Lua cannot run). The store keeps nothing
between calls but caches of those pure functions, so any number of replicas
can serve one Redis and a restarted replica loses nothing.

Errors are gearshift.common.errors exceptions naming the dataset, shard or
holder; a refused call changes nothing in Redis.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import NoScriptError
from redis.retry import Retry

from gearshift.common.errors import (
    ConflictError,
    NotFoundError,
    PreconditionError,
    UnavailableError,
    ValidationError,
)
from gearshift.common.sharding import epoch_order, rank_sequence, shard_indices, shard_range
from gearshift.shardmanager import lua
from gearshift.shardmanager.model import (
    AcquireResult,
    AcquireStatus,
    DatasetSettings,
    DatasetStatus,
    EpochProgress,
    Mode,
    ReleaseResult,
    RenewResult,
    ShardData,
    ShardsAt,
)

DEFAULT_PREFIX = "gearshift:sm"
DEFAULT_MAX_SHARDS = 1_000_000
DEFAULT_DELETED_TTL_SECONDS = 60


class Script:
    """A Lua script run by SHA (EVALSHA), falling back to EVAL when Redis lost its cache.

    EVAL also puts the script back into Redis's cache, so after a Redis
    restart the first call costs two round trips and the next ones one.
    """

    def __init__(self, name: str, body: str) -> None:
        self.name = name
        self.body = body
        self.sha = hashlib.sha1(body.encode()).hexdigest()

    def __call__(self, client: redis.Redis, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(self.body, len(keys), *keys, *args)


_ACQUIRE = Script("acquire", lua.ACQUIRE)
_ACK = Script("ack", lua.ACK)
_RENEW = Script("renew", lua.RENEW)
_RELEASE = Script("release", lua.RELEASE)
_CREATE = Script("create", lua.CREATE)
_DELETE = Script("delete", lua.DELETE)
_STATE = Script("state", lua.STATE)
_RESTORE = Script("restore", lua.RESTORE)
SCRIPTS = (_ACQUIRE, _ACK, _RENEW, _RELEASE, _CREATE, _DELETE, _STATE, _RESTORE)


@functools.lru_cache(maxsize=4)
def order_bytes(total_shards: int, seed: int, epoch: int) -> bytes:
    """An epoch's shard order as Redis keeps it: 4 bytes big-endian per shard."""
    packed = array("I", epoch_order(total_shards, seed, epoch))
    assert packed.itemsize == 4
    if sys.byteorder == "little":
        packed.byteswap()
    return packed.tobytes()


@functools.lru_cache(maxsize=1024)
def _rank_sequence(
    total_shards: int, seed: int, epoch: int, num_ranks: int, rank: int
) -> tuple[int, ...]:
    return tuple(rank_sequence(total_shards, seed, epoch, num_ranks, rank))


def shard_data(
    epoch: int,
    shard_id: int,
    *,
    size: int,
    shard_size: int,
    seed: int,
    shuffle_within_shard: bool,
    attempt: int = 0,
    lease_deadline_ms: int = 0,
) -> ShardData:
    """A shard's sample indices (a range, or a list when shuffled within the shard)."""
    start, end = shard_range(shard_id, size, shard_size)
    indices = None
    if shuffle_within_shard:
        indices = tuple(shard_indices(shard_id, size, shard_size, seed, epoch, shuffle_within=True))
    return ShardData(epoch, shard_id, start, end, indices, attempt, lease_deadline_ms)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pairs(flat: Any) -> dict[str, str]:
    """A Redis HGETALL reply (flat list; `{}` when cjson encoded it empty) as a dict."""
    items = flat if isinstance(flat, list) else []
    return {items[i]: items[i + 1] for i in range(0, len(items), 2)}


def _ids(csv: Any) -> tuple[int, ...]:
    text = _text(csv)
    return tuple(int(x) for x in text.split(",")) if text else ()


class ShardStore:
    """Datasets and their shards in one Redis; every method is one atomic step."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        deleted_ttl_seconds: int = DEFAULT_DELETED_TTL_SECONDS,
        max_shards: int = DEFAULT_MAX_SHARDS,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.deleted_ttl_seconds = deleted_ttl_seconds
        self.max_shards = max_shards
        self._job_prefix = f"{prefix}:job:"
        self._keys: dict[str, tuple[str, ...]] = {}

    @classmethod
    def from_url(cls, url: str, *, pool_size: int = 64, **kwargs: Any) -> ShardStore:
        """A store over a connection pool; a few quick retries, then UNAVAILABLE."""
        client = redis.Redis.from_url(
            url,
            max_connections=pool_size,
            socket_connect_timeout=2.0,
            socket_timeout=10.0,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 3),
            health_check_interval=30,
        )
        return cls(client, **kwargs)

    def close(self) -> None:
        self.client.close()

    def load_scripts(self) -> None:
        """Put every script in Redis's cache (SCRIPT LOAD), so each call is one EVALSHA."""
        with self._redis():
            for script in SCRIPTS:
                self.client.script_load(script.body)

    # -- keys --------------------------------------------------------------

    def keys(self, dataset_id: str) -> tuple[str, ...]:
        """The dataset's keys, in the order the scripts expect (one hash tag per dataset)."""
        keys = self._keys.get(dataset_id)
        if keys is None:
            keys = tuple(f"{self.prefix}:{{{dataset_id}}}:{name}" for name in lua.KEY_NAMES)
            if len(self._keys) >= 10_000:  # a bounded memo of a pure function, not state
                self._keys.clear()
            self._keys[dataset_id] = keys
        return keys

    def job_key(self, job_id: str) -> str:
        return self._job_prefix + job_id

    @contextmanager
    def _redis(self) -> Iterator[None]:
        """Redis being down or loading its data is UNAVAILABLE: the caller may retry."""
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ReadOnlyError) as exc:
            raise UnavailableError(f"Redis is unavailable: {exc}") from None

    def _run(self, script: Script, dataset_id: str, args: Sequence[Any]) -> Any:
        with self._redis():
            return script(self.client, self.keys(dataset_id), args)

    # -- datasets ----------------------------------------------------------

    def create(self, dataset_id: str, settings: DatasetSettings) -> DatasetStatus:
        """Create a dataset; the same settings again return it, others are ALREADY_EXISTS."""
        if settings.num_shards > self.max_shards:
            raise ValidationError(
                "config.shard_size",
                f"{settings.num_shards} shards exceed this server's limit of {self.max_shards}; "
                "use larger shards",
            )
        order = b""
        if settings.mode is Mode.DYNAMIC:
            order = order_bytes(settings.num_shards, settings.seed, 0)
        fields = [x for kv in settings.stored().items() for x in kv]
        reply = self._run(_CREATE, dataset_id, [dataset_id, self._job_prefix, order, *fields])
        status = _text(reply[0])
        if status == "CONFLICT":
            field, current, wanted = (_text(x) for x in reply[1:4])
            raise ConflictError(
                f"dataset {dataset_id!r} exists with {field}={current!r}, not {wanted!r}"
            )
        return self._status(dataset_id, reply[1])

    def describe(self, dataset_id: str) -> DatasetStatus:
        reply = self._run(_STATE, dataset_id, ["describe", ""])
        self._check(reply, dataset_id, "DescribeDataset")
        return self._status(dataset_id, reply[1])

    def delete(self, dataset_id: str) -> bool:
        """Mark deleted (reads as not found at once) and let its keys expire after the grace."""
        args = [dataset_id, self._job_prefix, self.deleted_ttl_seconds]
        return bool(self._run(_DELETE, dataset_id, args))

    def datasets_of_job(self, job_id: str) -> list[str]:
        with self._redis():
            members = self.client.smembers(self.job_key(job_id))
        return sorted(_text(m) for m in members)

    def delete_job(self, job_id: str) -> list[str]:
        """Delete every dataset of a job (each deletion atomic, the whole idempotent)."""
        return [d for d in self.datasets_of_job(job_id) if self.delete(d)]

    # -- dynamic mode --------------------------------------------------------

    def acquire(
        self,
        dataset_id: str,
        holder: str,
        request_id: str = "",
        ack: tuple[int, int] | None = None,
    ) -> AcquireResult:
        """TODO -> DOING for `holder`, after acknowledging `ack` = (epoch, shard) if given."""
        ack_args: list[Any] = ["", ""] if ack is None else [ack[0], ack[1]]
        order: list[Any] = ["", ""]
        acked: bool | None = None
        for _ in range(4):
            reply = self._run(_ACQUIRE, dataset_id, [holder, request_id, *ack_args, *order])
            self._check(
                reply, dataset_id, "AcquireShard", holder, ack_field="ack.",
                ack_epoch=None if ack is None else ack[0],
                ack_shard=None if ack is None else ack[1],
            )  # fmt: skip
            if ack_args[0] != "":
                acked = _acked(reply)
            if _text(reply[0]) != "NEED_ORDER":
                break
            # The epoch ended: start the next one with its order (second round
            # trip). The acknowledgement, if any, was applied by the first one.
            next_epoch, total, seed = int(reply[1]), int(reply[3]), int(reply[4])
            order = [order_bytes(total, seed, next_epoch), next_epoch]
            ack_args = ["", ""]
        else:  # pragma: no cover - other replicas rolled epochs over under us 4 times
            raise UnavailableError(f"dataset {dataset_id!r}: epochs change too fast; retry")
        status = _text(reply[0])
        if status == "WAIT":
            return AcquireResult(AcquireStatus.WAIT, int(reply[1]), acked=acked)
        if status == "END":
            return AcquireResult(AcquireStatus.END_OF_DATA, int(reply[1]), acked=acked)
        epoch, shard_id, attempt, deadline = (int(x) for x in reply[1:5])
        lease_ms, size, shard_size, seed = (int(x) for x in reply[6:10])
        shard = shard_data(
            epoch,
            shard_id,
            size=size,
            shard_size=shard_size,
            seed=seed,
            shuffle_within_shard=_text(reply[10]) == "1",
            attempt=attempt,
            lease_deadline_ms=deadline,
        )
        return AcquireResult(AcquireStatus.GRANTED, epoch, shard, lease_ms / 1000.0, acked)

    def ack(self, dataset_id: str, holder: str, epoch: int, shard_id: int) -> bool:
        """DOING -> DONE; True when this call did it, False when the holder had acked before."""
        reply = self._run(_ACK, dataset_id, [holder, epoch, shard_id])
        self._check(reply, dataset_id, "AckShard", holder, ack_epoch=epoch, ack_shard=shard_id)
        return _text(reply[0]) == "OK"

    def renew(
        self, dataset_id: str, holder: str, epoch: int = 0, shard_ids: Sequence[int] = ()
    ) -> RenewResult:
        """Extend the listed shards' leases (all of the holder's when none are listed)."""
        csv = ",".join(str(s) for s in shard_ids)
        reply = self._run(_RENEW, dataset_id, [holder, epoch, csv])
        self._check(reply, dataset_id, "RenewLeases", holder)
        return RenewResult(int(reply[1]), int(reply[2]), _ids(reply[3]))

    def release(self, dataset_id: str, holder: str) -> ReleaseResult:
        """A holder is gone: its DOING shards go back to TODO (or FAILED past the limit)."""
        reply = self._run(_RELEASE, dataset_id, [holder])
        self._check(reply, dataset_id, "ReleaseHolder", holder)
        return ReleaseResult(int(reply[1]), _ids(reply[2]), _ids(reply[3]))

    def checkpoint(self, dataset_id: str, checkpoint_id: str) -> DatasetStatus:
        """Snapshot TODO/DOING/DONE, epoch and counters under checkpoint_id (replacing it)."""
        reply = self._run(_STATE, dataset_id, ["checkpoint", checkpoint_id])
        self._check(reply, dataset_id, "CheckpointDataset")
        return self._status(dataset_id, reply[1])

    def restore(self, dataset_id: str, checkpoint_id: str, *, force: bool = False) -> DatasetStatus:
        """Put a snapshot back; its DOING shards go to the head of TODO."""
        flag = "1" if force else "0"
        reply = self._run(_RESTORE, dataset_id, [checkpoint_id, flag, "", ""])
        if _text(reply[0]) == "NEED_ORDER":
            # The snapshot is of another epoch: pass its order in (second round trip).
            epoch, total, seed = int(reply[1]), int(reply[2]), int(reply[3])
            order = order_bytes(total, seed, epoch)
            reply = self._run(_RESTORE, dataset_id, [checkpoint_id, flag, order, epoch])
        status = _text(reply[0])
        if status == "NO_CHECKPOINT":
            raise NotFoundError("checkpoint", f"{dataset_id}/{checkpoint_id}")
        if status == "LIVE":
            raise PreconditionError(
                f"dataset {dataset_id!r} is live: {int(reply[1])} shards are held by readers; "
                "stop them first or restore with force"
            )
        self._check(reply, dataset_id, "RestoreDataset")
        return self._status(dataset_id, reply[1])

    # -- deterministic mode ---------------------------------------------------

    def shards_at(
        self, dataset_id: str, rank: int, epoch: int, position: int, count: int
    ) -> ShardsAt:
        """Shards [position, position+count) of a logical rank's sequence in an epoch.

        The sequence is gearshift.common.sharding.rank_sequence: a pure function
        of (seed, epoch, num_ranks, rank), the same for every caller, at any time.
        """
        settings = self._settings(dataset_id)
        if settings.mode is not Mode.DETERMINISTIC:
            raise PreconditionError(
                f"dataset {dataset_id!r} is in {settings.mode.value} mode; "
                "GetShardsAt serves deterministic datasets (use AcquireShard)"
            )
        if rank >= settings.num_ranks:
            raise ValidationError(
                "rank", f"must be < {settings.num_ranks}, the ranks of dataset {dataset_id!r}"
            )
        if epoch >= settings.num_epochs:
            raise ValidationError(
                "epoch", f"must be < {settings.num_epochs}, the epochs of dataset {dataset_id!r}"
            )
        sequence = _rank_sequence(
            settings.num_shards, settings.seed, epoch, settings.num_ranks, rank
        )
        shards = tuple(
            shard_data(
                epoch,
                s,
                size=settings.size,
                shard_size=settings.shard_size,
                seed=settings.seed,
                shuffle_within_shard=settings.shuffle_within_shard,
            )
            for s in sequence[position : position + count]
        )
        return ShardsAt(shards, len(sequence))

    # -- helpers -------------------------------------------------------------

    def _settings(self, dataset_id: str) -> DatasetSettings:
        with self._redis():
            fields = self.client.hgetall(self.keys(dataset_id)[0])
        meta = {_text(k): _text(v) for k, v in fields.items()}
        if not meta or meta.get("deleted") == "1":
            raise NotFoundError("dataset", dataset_id)
        return DatasetSettings.from_stored(meta)

    def _check(
        self,
        reply: Any,
        dataset_id: str,
        rpc: str,
        holder: str = "",
        *,
        ack_field: str = "",
        ack_epoch: int | None = None,
        ack_shard: int | None = None,
    ) -> None:
        """Turn a script's refusal into the error that names what was refused."""
        status = _text(reply[0])
        if status == "NOTFOUND":
            raise NotFoundError("dataset", dataset_id)
        if status == "MODE":
            mode = _text(reply[1])
            needs = "GetShardsAt" if mode == Mode.DETERMINISTIC.value else "AcquireShard"
            raise PreconditionError(
                f"dataset {dataset_id!r} is in {mode} mode; use {needs}, not {rpc}"
            )
        if status != "ERR":
            return
        kind = _text(reply[1])
        what = f"shard {ack_shard} of epoch {ack_epoch}" if ack_shard is not None else "the shard"
        if kind == "RANGE":
            raise ValidationError(
                f"{ack_field}shard_id",
                f"must be < {_text(reply[2])}, the shards of dataset {dataset_id!r}",
            )
        if kind == "FUTURE":
            raise ValidationError(
                f"{ack_field}epoch",
                f"has not started: dataset {dataset_id!r} is in epoch {_text(reply[2])}",
            )
        if kind == "PAST":
            raise PreconditionError(
                f"{what} of dataset {dataset_id!r} is not held by holder {holder!r}: "
                f"that epoch is over (the dataset is in epoch {_text(reply[2])})"
            )
        state, other, why = (_text(x) for x in reply[2:5])
        where = {
            "doing": f"now held by {other!r}",
            "done": f"acknowledged by {other!r}",
            "failed": "marked failed",
            "todo": "waiting in TODO",
        }[state]
        if why == "expired":
            raise PreconditionError(
                f"lease of holder {holder!r} on {what} of dataset {dataset_id!r} expired and the "
                f"shard was taken back; it is {where}"
            )
        if why == "released":
            raise PreconditionError(
                f"holder {holder!r} was released from {what} of dataset {dataset_id!r}; "
                f"it is {where}"
            )
        raise PreconditionError(
            f"{what} of dataset {dataset_id!r} is not held by holder {holder!r}; it is {where}"
        )

    def _status(self, dataset_id: str, raw: Any) -> DatasetStatus:
        state = json.loads(_text(raw))
        meta = _pairs(state["meta"])
        settings = DatasetSettings.from_stored(meta)
        epoch = int(meta["epoch"])
        stats = {k: int(v) for k, v in _pairs(state["stats"]).items()}
        failed: dict[int, list[int]] = {}
        for key in state["failed"] if isinstance(state["failed"], list) else []:
            e, _, s = key.partition(":")
            failed.setdefault(int(e), []).append(int(s))
        in_flight = sum(_samples(settings, int(s)) for s in _pairs(state["doing"]))
        epochs: list[EpochProgress] = []
        if settings.mode is Mode.DYNAMIC:
            for e in range(epoch + 1):
                done = stats.get(f"{e}:done", 0)
                lost = stats.get(f"{e}:failed", 0)
                flying = in_flight if e == epoch else 0
                epochs.append(
                    EpochProgress(
                        epoch=e,
                        samples_done=done,
                        samples_in_flight=flying,
                        samples_todo=settings.size - done - lost - flying if e == epoch else 0,
                        samples_redelivered=stats.get(f"{e}:redelivered", 0),
                        samples_failed=lost,
                        failed_shards=tuple(sorted(failed.get(e, []))),
                        shards_done=stats.get(f"{e}:shards_done", 0),
                        shards_redelivered=stats.get(f"{e}:shards_redelivered", 0),
                    )
                )
        return DatasetStatus(
            dataset_id=dataset_id,
            settings=settings,
            epoch=epoch,
            finished=meta.get("finished") == "1",
            epochs=tuple(epochs),
            at_ms=int(state["now_ms"]),
        )


def _samples(settings: DatasetSettings, shard_id: int) -> int:
    start, end = shard_range(shard_id, settings.size, settings.shard_size)
    return end - start


def _acked(reply: Any) -> bool | None:
    """The acknowledgement flag of an ACQUIRE reply ('-1' none, '0' before, '1' now)."""
    status = _text(reply[0])
    index = {"GRANTED": 5, "WAIT": 2, "END": 2, "NEED_ORDER": 2}.get(status)
    if index is None:
        return None
    flag = _text(reply[index])
    return None if flag == "-1" else flag == "1"
