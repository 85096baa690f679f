"""The shard manager's state in Redis: datasets, shard transitions, leases and snapshots.

Every transition is one Lua script (see `gearshift.shardmanager.lua`), so it
is atomic and costs one Redis round trip; the only two-trip transitions are
the acquire that starts a new epoch and the restore into another epoch: the
first call finds that the next epoch's order is needed, the second passes it
in (the order is a pure function of seed and epoch, computed here with
gearshift.common.sharding, which Lua cannot run). The store keeps nothing
between calls but caches of those pure functions, so any number of replicas
can serve one Redis and a restarted replica loses nothing.

The logic of each operation is written once, as a generator that yields the
Redis round trips it needs (`Op`) and receives their replies; two drivers run
it: `ShardStore` with redis-py (blocking; tests, tools, the benchmark's
baseline) and `AsyncShardStore` on the daemon's event loop with pipelined
connections (`gearshift.shardmanager.redis_pipe`). Both send the same commands.

Errors are gearshift.common.errors exceptions naming the dataset, shard or
holder; a refused call changes nothing in Redis. Every holder call takes the
generation of the caller's placement (0: unfenced); a stale one is FencedError
(see the fences in `gearshift.shardmanager.lua`). Script replies are read by
name (`decode_reply`); one that does not match its script's declared fields is
an InternalError naming the script and the field.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import sys
import threading
from array import array
from collections.abc import Callable, Generator, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import NoScriptError
from redis.retry import Retry

from gearshift.common.errors import (
    ConflictError,
    FencedError,
    InternalError,
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
    ReleasedShard,
    ReleaseResult,
    RenewResult,
    ShardData,
    ShardsAt,
)
from gearshift.shardmanager.redis_pipe import RedisPipe

DEFAULT_PREFIX = "gearshift:sm"
DEFAULT_MAX_SHARDS = 1_000_000
DEFAULT_DELETED_TTL_SECONDS = 60

T = TypeVar("T")

# Redis being down, unreachable, loading its data or a read-only replica: retry later.
_UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ReadOnlyError)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class Reply:
    """A script's reply read by name: its status and the fields that status carries."""

    script: str
    status: str
    fields: Mapping[str, str]

    def __getitem__(self, name: str) -> str:
        try:
            return self.fields[name]
        except KeyError:  # a field read here that the script does not declare: a bug
            raise InternalError(
                f"Lua script {self.script!r}: reply {self.status} has no field {name!r}"
            ) from None

    def number(self, name: str) -> int:
        return int(self[name])

    def ids(self, name: str) -> tuple[int, ...]:
        """A comma-separated list of shard ids ('' for none)."""
        text = self[name]
        return tuple(int(x) for x in text.split(",")) if text else ()


def decode_reply(script: str, replies: Mapping[str, frozenset[str]], raw: Any) -> Reply:
    """A script's flat `status, S, name, value, ...` reply by name, checked against the
    fields its status declares (`replies`), so that a field added, renamed or dropped on
    one side only fails here, naming the script and the field, instead of being misread."""

    def wrong(problem: str) -> InternalError:
        return InternalError(f"Lua script {script!r} {problem}")

    if not isinstance(raw, list) or len(raw) % 2:
        raise wrong(f"replied {raw!r:.200}, not name/value pairs")
    fields = {_text(raw[i]): _text(raw[i + 1]) for i in range(0, len(raw), 2)}
    if len(fields) * 2 != len(raw):
        raise wrong(f"replied a field twice: {raw!r:.200}")
    status = fields.pop("status", None)
    if status is None:
        raise wrong("replied without field 'status'")
    expected = replies.get(status)
    if expected is None:
        raise wrong(f"replied unknown status {status!r}")
    if fields.keys() != expected:
        missing = sorted(expected - fields.keys())
        if missing:
            raise wrong(f"replied {status} without field {missing[0]!r}")
        unknown = sorted(fields.keys() - expected)
        raise wrong(f"replied {status} with unknown field {unknown[0]!r}")
    return Reply(script, status, fields)


class Script:
    """A Lua script run by SHA (EVALSHA), falling back to EVAL when Redis lost its cache.

    EVAL also puts the script back into Redis's cache, so after a Redis
    restart the first call costs two round trips and the next ones one.
    Replies come back decoded by name against `replies` (see `decode_reply`).
    """

    def __init__(self, name: str, body: str, replies: lua.Replies) -> None:
        self.name = name
        self.body = body
        self.sha = hashlib.sha1(body.encode()).hexdigest()
        self.replies = {status: frozenset(names) for status, names in replies.items()}

    def __call__(self, client: redis.Redis, keys: Sequence[str], args: Sequence[Any]) -> Reply:
        try:
            raw = client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            raw = client.eval(self.body, len(keys), *keys, *args)
        return self.decode(raw)

    async def run(self, pipe: RedisPipe, keys: Sequence[str], args: Sequence[Any]) -> Reply:
        """The same on a pipelined connection."""
        try:
            raw = await pipe.execute("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            raw = await pipe.execute("EVAL", self.body, len(keys), *keys, *args)
        return self.decode(raw)

    def decode(self, raw: Any) -> Reply:
        return decode_reply(self.name, self.replies, raw)


_ACQUIRE = Script("acquire", lua.ACQUIRE, lua.ACQUIRE_REPLIES)
_ACK = Script("ack", lua.ACK, lua.ACK_REPLIES)
_RENEW = Script("renew", lua.RENEW, lua.RENEW_REPLIES)
_RELEASE = Script("release", lua.RELEASE, lua.RELEASE_REPLIES)
_CREATE = Script("create", lua.CREATE, lua.CREATE_REPLIES)
_DELETE = Script("delete", lua.DELETE, lua.DELETE_REPLIES)
_STATE = Script("state", lua.STATE, lua.STATE_REPLIES)
_RESTORE = Script("restore", lua.RESTORE, lua.RESTORE_REPLIES)
_COVER = Script("cover", lua.COVER, lua.COVER_REPLIES)
SCRIPTS = (_ACQUIRE, _ACK, _RENEW, _RELEASE, _CREATE, _DELETE, _STATE, _RESTORE, _COVER)


class _Memo:
    """A small memo of a pure function that says whether it holds a value.

    An operation looks its epoch order up here and, on a miss, has it computed
    as an `Op` of its own: the async store runs that in a worker thread, so a
    million-shard permutation (~0.6 s) does not stall the event loop that
    serves every other consumer.
    """

    def __init__(self, function: Callable[..., Any], size: int) -> None:
        self.function = function
        self.size = size
        self._values: dict[Hashable, Any] = {}
        self._lock = threading.Lock()

    def get(self, *args: Hashable) -> Any:
        with self._lock:
            return self._values.get(args)

    def __call__(self, *args: Hashable) -> Any:
        value = self.get(*args)
        if value is None:
            value = self.function(*args)
            with self._lock:
                if len(self._values) >= self.size:
                    del self._values[next(iter(self._values))]
                self._values[args] = value
        return value


def _order_bytes(total_shards: int, seed: int, epoch: int) -> bytes:
    packed = array("I", epoch_order(total_shards, seed, epoch))
    assert packed.itemsize == 4
    if sys.byteorder == "little":
        packed.byteswap()
    return packed.tobytes()


_ORDERS = _Memo(_order_bytes, 4)
_SEQUENCES = _Memo(lambda *args: tuple(rank_sequence(*args)), 1024)


def order_bytes(total_shards: int, seed: int, epoch: int) -> bytes:
    """An epoch's shard order as Redis keeps it: 4 bytes big-endian per shard."""
    value: bytes = _ORDERS(total_shards, seed, epoch)
    return value


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


def _pairs(flat: Any) -> dict[Any, Any]:
    """A Redis HGETALL reply (flat list; `{}` when cjson encoded it empty; a dict from
    redis-py) as a dict."""
    if isinstance(flat, dict):
        return flat
    items = flat if isinstance(flat, list) else []
    return {items[i]: items[i + 1] for i in range(0, len(items), 2)}


@dataclass(frozen=True, slots=True)
class Op:
    """One step of an operation: a script on a dataset's keys, a plain command, or a
    pure computation (`compute`) that the async store runs off its event loop."""

    script: Script | None = None
    keys: Sequence[str] = ()
    args: Sequence[Any] = ()  # the script's ARGV, or the command and its arguments
    compute: Callable[[], Any] | None = None


# An operation: yields the steps it needs, receives each one's reply, returns its result.
Steps = Generator[Op, Any, T]


class _Operations:
    """Every operation of the store, once, independent of how Redis is reached."""

    def __init__(
        self,
        *,
        prefix: str = DEFAULT_PREFIX,
        deleted_ttl_seconds: int = DEFAULT_DELETED_TTL_SECONDS,
        max_shards: int = DEFAULT_MAX_SHARDS,
    ) -> None:
        self.prefix = prefix
        self.deleted_ttl_seconds = deleted_ttl_seconds
        self.max_shards = max_shards
        self._job_prefix = f"{prefix}:job:"
        self._keys: dict[str, tuple[str, ...]] = {}

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

    def _script(self, script: Script, dataset_id: str, args: Sequence[Any]) -> Op:
        return Op(script, self.keys(dataset_id), args)

    # -- datasets ----------------------------------------------------------

    def _create(self, dataset_id: str, settings: DatasetSettings) -> Steps[DatasetStatus]:
        if settings.num_shards > self.max_shards:
            raise ValidationError(
                "config.shard_size",
                f"{settings.num_shards} shards exceed this server's limit of {self.max_shards}; "
                "use larger shards",
            )
        order = b""
        if settings.mode is Mode.DYNAMIC:
            order = yield from _order(settings.num_shards, settings.seed, 0)
        fields = [x for kv in settings.stored().items() for x in kv]
        args = [dataset_id, self._job_prefix, order, *fields]
        reply: Reply = yield self._script(_CREATE, dataset_id, args)
        if reply.status == "CONFLICT":
            raise ConflictError(
                f"dataset {dataset_id!r} exists with {reply['field']}={reply['current']!r}, "
                f"not {reply['wanted']!r}"
            )
        return self._status(dataset_id, reply["state"])

    def _describe(self, dataset_id: str) -> Steps[DatasetStatus]:
        reply: Reply = yield self._script(_STATE, dataset_id, ["describe", ""])
        self._check(reply, dataset_id, "DescribeDataset")
        return self._status(dataset_id, reply["state"])

    def _delete(self, dataset_id: str) -> Steps[bool]:
        args = [dataset_id, self._job_prefix, self.deleted_ttl_seconds]
        reply: Reply = yield self._script(_DELETE, dataset_id, args)
        return reply.status == "DELETED"

    def _datasets_of_job(self, job_id: str) -> Steps[list[str]]:
        members = yield Op(args=("SMEMBERS", self.job_key(job_id)))
        return sorted(_text(m) for m in members)

    def _delete_job(self, job_id: str) -> Steps[list[str]]:
        deleted = []
        for dataset_id in (yield from self._datasets_of_job(job_id)):
            if (yield from self._delete(dataset_id)):
                deleted.append(dataset_id)
        return deleted

    # -- dynamic mode --------------------------------------------------------

    def _acquire(
        self,
        dataset_id: str,
        holder: str,
        request_id: str,
        ack: tuple[int, int] | None,
        read_step: int | None = None,
        *,
        generation: int = 0,
    ) -> Steps[AcquireResult]:
        ack_args: list[Any] = ["", ""] if ack is None else [ack[0], ack[1]]
        step_arg = "" if read_step is None else str(read_step)
        order: list[Any] = ["", ""]
        acked: bool | None = None
        for _ in range(4):
            reply: Reply = yield self._script(
                _ACQUIRE,
                dataset_id,
                [holder, request_id, *ack_args, *order, step_arg, generation],
            )
            self._check(
                reply, dataset_id, "AcquireShard", holder, generation, ack_field="ack.",
                ack_epoch=None if ack is None else ack[0],
                ack_shard=None if ack is None else ack[1],
            )  # fmt: skip
            if ack_args[0] != "":
                acked = _acked(reply)
            if reply.status != "NEED_ORDER":
                break
            # The epoch ended: start the next one with its order (second round
            # trip). The acknowledgement, if any, was applied by the first one.
            next_epoch = reply.number("epoch")
            total, seed = reply.number("num_shards"), reply.number("seed")
            order = [(yield from _order(total, seed, next_epoch)), next_epoch]
            ack_args = ["", ""]
        else:  # pragma: no cover - other replicas rolled epochs over under us 4 times
            raise UnavailableError(f"dataset {dataset_id!r}: epochs change too fast; retry")
        epoch = reply.number("epoch")
        if reply.status == "WAIT":
            return AcquireResult(AcquireStatus.WAIT, epoch, acked=acked)
        if reply.status == "END":
            return AcquireResult(AcquireStatus.END_OF_DATA, epoch, acked=acked)
        shard = shard_data(
            epoch,
            reply.number("shard"),
            size=reply.number("size"),
            shard_size=reply.number("shard_size"),
            seed=reply.number("seed"),
            shuffle_within_shard=reply["shuffle"] == "1",
            attempt=reply.number("attempt"),
            lease_deadline_ms=reply.number("deadline_ms"),
        )
        lease_seconds = reply.number("lease_ms") / 1000.0
        return AcquireResult(AcquireStatus.GRANTED, epoch, shard, lease_seconds, acked)

    def _ack(
        self, dataset_id: str, holder: str, epoch: int, shard_id: int, generation: int = 0
    ) -> Steps[bool]:
        args = [holder, epoch, shard_id, generation]
        reply: Reply = yield self._script(_ACK, dataset_id, args)
        self._check(
            reply, dataset_id, "AckShard", holder, generation, ack_epoch=epoch, ack_shard=shard_id
        )
        return reply.status == "OK"

    def _renew(
        self,
        dataset_id: str,
        holder: str,
        epoch: int,
        shard_ids: Sequence[int],
        generation: int = 0,
    ) -> Steps[RenewResult]:
        csv = ",".join(str(s) for s in shard_ids)
        reply: Reply = yield self._script(_RENEW, dataset_id, [holder, epoch, csv, generation])
        self._check(reply, dataset_id, "RenewLeases", holder, generation)
        return RenewResult(reply.number("renewed"), reply.number("deadline_ms"), reply.ids("lost"))

    def _release(
        self,
        dataset_id: str,
        holder: str,
        resume_step: int | None,
        keep_provisional: bool,
        *,
        generation: int = 0,
        request_id: str = "",
    ) -> Steps[ReleaseResult]:
        resume = "" if resume_step is None else resume_step
        args = [holder, resume, int(keep_provisional), generation, request_id]
        reply: Reply = yield self._script(_RELEASE, dataset_id, args)
        self._check(reply, dataset_id, "ReleaseHolder", holder, generation)
        released = []
        for item in filter(None, reply["released"].split(",")):
            epoch, shard, step, acked = item.split(":")
            released.append(ReleasedShard(int(epoch), int(shard), int(step), acked == "1"))
        return ReleaseResult(
            reply.number("epoch"),
            reply.ids("requeued"),
            reply.ids("failed"),
            reply.number("covered"),
            tuple(released),
            reply["repeat"] == "1",
        )

    def _cover(
        self,
        dataset_id: str,
        holder: str,
        shards: Sequence[tuple[int, int]],
        generation: int = 0,
    ) -> Steps[int]:
        csv = ",".join(f"{epoch}:{shard}" for epoch, shard in shards)
        reply: Reply = yield self._script(_COVER, dataset_id, [holder, csv, generation])
        self._check(reply, dataset_id, "CoverShards", holder, generation)
        return reply.number("covered")

    def _checkpoint(self, dataset_id: str, checkpoint_id: str) -> Steps[DatasetStatus]:
        reply: Reply = yield self._script(_STATE, dataset_id, ["checkpoint", checkpoint_id])
        self._check(reply, dataset_id, "CheckpointDataset")
        return self._status(dataset_id, reply["state"])

    def _restore(self, dataset_id: str, checkpoint_id: str, force: bool) -> Steps[DatasetStatus]:
        """Put a snapshot's progress back; the holders' fences stay as they are.

        Fences (each holder's newest placement generation) are not in a snapshot and a
        restore neither rewinds nor clears them. A generation counts the placements of
        the job, which only go forward; the data progress a snapshot rewinds says nothing
        about which placement runs now. Restoring a snapshot taken under generation 4 while
        generation 5 runs must leave generation 4 fenced out; putting back the snapshot's
        fences (or none) would let that stale placement read and cover again. Deleting the
        dataset drops its fences with its other keys (a dataset created again starts
        unfenced, as it starts with no progress).
        """
        flag = "1" if force else "0"
        reply: Reply = yield self._script(_RESTORE, dataset_id, [checkpoint_id, flag, "", ""])
        if reply.status == "NEED_ORDER":
            # The snapshot is of another epoch: pass its order in (second round trip).
            epoch = reply.number("epoch")
            total, seed = reply.number("num_shards"), reply.number("seed")
            order = yield from _order(total, seed, epoch)
            reply = yield self._script(_RESTORE, dataset_id, [checkpoint_id, flag, order, epoch])
        if reply.status == "NO_CHECKPOINT":
            raise NotFoundError("checkpoint", f"{dataset_id}/{checkpoint_id}")
        if reply.status == "LIVE":
            raise PreconditionError(
                f"dataset {dataset_id!r} is live: {reply.number('held')} shards are held by "
                "readers; stop them first or restore with force"
            )
        self._check(reply, dataset_id, "RestoreDataset")
        return self._status(dataset_id, reply["state"])

    # -- deterministic mode ---------------------------------------------------

    def _shards_at(
        self, dataset_id: str, rank: int, epoch: int, position: int, count: int
    ) -> Steps[ShardsAt]:
        fields = yield Op(args=("HGETALL", self.keys(dataset_id)[0]))
        meta = {_text(k): _text(v) for k, v in _pairs(fields).items()}
        if not meta or meta.get("deleted") == "1":
            raise NotFoundError("dataset", dataset_id)
        settings = DatasetSettings.from_stored(meta)
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
        key = (settings.num_shards, settings.seed, epoch, settings.num_ranks, rank)
        sequence: tuple[int, ...] | None = _SEQUENCES.get(*key)
        if sequence is None:
            sequence = yield Op(compute=functools.partial(_SEQUENCES, *key))
            assert sequence is not None
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

    def _check(
        self,
        reply: Reply,
        dataset_id: str,
        rpc: str,
        holder: str = "",
        generation: int = 0,
        *,
        ack_field: str = "",
        ack_epoch: int | None = None,
        ack_shard: int | None = None,
    ) -> None:
        """Turn a script's refusal into the error that names what was refused."""
        status = reply.status
        if status == "NOTFOUND":
            raise NotFoundError("dataset", dataset_id)
        if status == "FENCED":
            raise FencedError(dataset_id, holder, generation, reply.number("current"), rpc)
        if status == "MODE":
            mode = reply["mode"]
            needs = "GetShardsAt" if mode == Mode.DETERMINISTIC.value else "AcquireShard"
            raise PreconditionError(
                f"dataset {dataset_id!r} is in {mode} mode; use {needs}, not {rpc}"
            )
        if status not in lua.ACK_REFUSALS:
            return
        what = f"shard {ack_shard} of epoch {ack_epoch}" if ack_shard is not None else "the shard"
        if status == "RANGE":
            raise ValidationError(
                f"{ack_field}shard_id",
                f"must be < {reply['num_shards']}, the shards of dataset {dataset_id!r}",
            )
        if status == "FUTURE":
            raise ValidationError(
                f"{ack_field}epoch",
                f"has not started: dataset {dataset_id!r} is in epoch {reply['epoch']}",
            )
        if status == "PAST":
            raise PreconditionError(
                f"{what} of dataset {dataset_id!r} is not held by holder {holder!r}: "
                f"that epoch is over (the dataset is in epoch {reply['epoch']})"
            )
        state, other, why = reply["state"], reply["by"], reply["why"]
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
                        shards_undone=stats.get(f"{e}:shards_undone", 0),
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


def _order(total_shards: int, seed: int, epoch: int) -> Steps[bytes]:
    """An epoch's order: from the memo, or computed as a step of its own."""
    order: bytes | None = _ORDERS.get(total_shards, seed, epoch)
    if order is None:
        order = yield Op(compute=functools.partial(order_bytes, total_shards, seed, epoch))
        assert order is not None
    return order


class ShardStore(_Operations):
    """Datasets and their shards in one Redis, over redis-py (blocking calls)."""

    def __init__(self, client: redis.Redis, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.client = client

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

    @contextmanager
    def _redis(self) -> Iterator[None]:
        """Redis being down or loading its data is UNAVAILABLE: the caller may retry."""
        try:
            yield
        except _UNAVAILABLE as exc:
            raise UnavailableError(f"Redis is unavailable: {exc}") from None

    def _drive(self, steps: Steps[T]) -> T:
        """Run an operation: each step against Redis (or computed here), its reply sent back."""
        reply: Any = None
        try:
            while True:
                op = steps.send(reply)
                if op.compute is not None:
                    reply = op.compute()
                    continue
                with self._redis():
                    if op.script is not None:
                        reply = op.script(self.client, op.keys, op.args)
                    else:
                        reply = self.client.execute_command(*op.args)  # type: ignore[no-untyped-call]
        except StopIteration as done:
            result: T = done.value
            return result

    def create(self, dataset_id: str, settings: DatasetSettings) -> DatasetStatus:
        """Create a dataset; the same settings again return it, others are ALREADY_EXISTS."""
        return self._drive(self._create(dataset_id, settings))

    def describe(self, dataset_id: str) -> DatasetStatus:
        return self._drive(self._describe(dataset_id))

    def delete(self, dataset_id: str) -> bool:
        """Mark deleted (reads as not found at once) and let its keys expire after the grace."""
        return self._drive(self._delete(dataset_id))

    def datasets_of_job(self, job_id: str) -> list[str]:
        return self._drive(self._datasets_of_job(job_id))

    def delete_job(self, job_id: str) -> list[str]:
        """Delete every dataset of a job (each deletion atomic, the whole idempotent)."""
        return self._drive(self._delete_job(job_id))

    def acquire(
        self,
        dataset_id: str,
        holder: str,
        request_id: str = "",
        ack: tuple[int, int] | None = None,
        read_step: int | None = None,
        *,
        generation: int = 0,
    ) -> AcquireResult:
        """TODO -> DOING for `holder`, after acknowledging `ack` = (epoch, shard) if given;
        `read_step` is the step that reads the shard (see ReleaseHolder's resume_step).
        `generation` (here and below): the caller's placement; 0 is unfenced, one older
        than the holder's is FencedError and changes nothing."""
        return self._drive(
            self._acquire(dataset_id, holder, request_id, ack, read_step, generation=generation)
        )

    def ack(
        self, dataset_id: str, holder: str, epoch: int, shard_id: int, *, generation: int = 0
    ) -> bool:
        """DOING -> DONE; True when this call did it, False when the holder had acked before."""
        return self._drive(self._ack(dataset_id, holder, epoch, shard_id, generation))

    def renew(
        self,
        dataset_id: str,
        holder: str,
        epoch: int = 0,
        shard_ids: Sequence[int] = (),
        *,
        generation: int = 0,
    ) -> RenewResult:
        """Extend the listed shards' leases (all of the holder's when none are listed)."""
        return self._drive(self._renew(dataset_id, holder, epoch, shard_ids, generation))

    def release(
        self,
        dataset_id: str,
        holder: str,
        resume_step: int | None = None,
        *,
        keep_provisional: bool = False,
        generation: int = 0,
        request_id: str = "",
    ) -> ReleaseResult:
        """A holder is gone: its DOING shards go back to TODO (or FAILED past the limit),
        and its provisional acks of reads at or after `resume_step` (all, when None) are
        undone while those before it become final; `keep_provisional` leaves them all.
        A `generation` newer than the holder's becomes its generation (the fence). The
        holder's last `request_id` again replies what that release did (`repeat`)."""
        return self._drive(
            self._release(
                dataset_id,
                holder,
                resume_step,
                keep_provisional,
                generation=generation,
                request_id=request_id,
            )
        )

    def cover(
        self,
        dataset_id: str,
        holder: str,
        shards: Sequence[tuple[int, int]],
        *,
        generation: int = 0,
    ) -> int:
        """Make the holder's provisional acks of these (epoch, shard) final; how many were."""
        return self._drive(self._cover(dataset_id, holder, shards, generation))

    def checkpoint(self, dataset_id: str, checkpoint_id: str) -> DatasetStatus:
        """Snapshot TODO/DOING/DONE, epoch and counters under checkpoint_id (replacing it)."""
        return self._drive(self._checkpoint(dataset_id, checkpoint_id))

    def restore(self, dataset_id: str, checkpoint_id: str, *, force: bool = False) -> DatasetStatus:
        """Put a snapshot back; its DOING shards go to the head of TODO."""
        return self._drive(self._restore(dataset_id, checkpoint_id, force))

    def shards_at(
        self, dataset_id: str, rank: int, epoch: int, position: int, count: int
    ) -> ShardsAt:
        """Shards [position, position+count) of a logical rank's sequence in an epoch.

        The sequence is gearshift.common.sharding.rank_sequence: a pure function
        of (seed, epoch, num_ranks, rank), the same for every caller, at any time.
        """
        return self._drive(self._shards_at(dataset_id, rank, epoch, position, count))


class AsyncShardStore(_Operations):
    """The same operations on an event loop, over pipelined connections (the daemon's store).

    Concurrent calls share the connections: their commands go out together and
    their replies come back in order (see gearshift.shardmanager.redis_pipe).
    With several connections, calls take them in turn.
    """

    def __init__(self, pipes: Sequence[RedisPipe], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not pipes:
            raise ValueError("at least one connection is needed")
        self.pipes = tuple(pipes)
        self._next = 0

    @classmethod
    def from_url(cls, url: str, *, connections: int = 1, **kwargs: Any) -> AsyncShardStore:
        """A store over `connections` pipelined connections, opened on first use."""
        return cls([RedisPipe(url) for _ in range(connections)], **kwargs)

    def close(self) -> None:
        """Close the connections (from any thread)."""
        for pipe in self.pipes:
            pipe.close()

    def _pipe(self) -> RedisPipe:
        if len(self.pipes) == 1:
            return self.pipes[0]
        self._next = (self._next + 1) % len(self.pipes)
        return self.pipes[self._next]

    async def _drive(self, steps: Steps[T]) -> T:
        """Run an operation: each step on a pipelined connection (computations in a thread)."""
        reply: Any = None
        try:
            while True:
                op = steps.send(reply)
                if op.compute is not None:
                    reply = await asyncio.get_running_loop().run_in_executor(None, op.compute)
                    continue
                try:
                    if op.script is not None:
                        reply = await op.script.run(self._pipe(), op.keys, op.args)
                    else:
                        reply = await self._pipe().execute(*op.args)
                except _UNAVAILABLE as exc:
                    raise UnavailableError(f"Redis is unavailable: {exc}") from None
        except StopIteration as done:
            result: T = done.value
            return result

    async def create(self, dataset_id: str, settings: DatasetSettings) -> DatasetStatus:
        return await self._drive(self._create(dataset_id, settings))

    async def describe(self, dataset_id: str) -> DatasetStatus:
        return await self._drive(self._describe(dataset_id))

    async def delete(self, dataset_id: str) -> bool:
        return await self._drive(self._delete(dataset_id))

    async def delete_job(self, job_id: str) -> list[str]:
        return await self._drive(self._delete_job(job_id))

    async def acquire(
        self,
        dataset_id: str,
        holder: str,
        request_id: str = "",
        ack: tuple[int, int] | None = None,
        read_step: int | None = None,
        *,
        generation: int = 0,
    ) -> AcquireResult:
        return await self._drive(
            self._acquire(dataset_id, holder, request_id, ack, read_step, generation=generation)
        )

    async def ack(
        self, dataset_id: str, holder: str, epoch: int, shard_id: int, *, generation: int = 0
    ) -> bool:
        return await self._drive(self._ack(dataset_id, holder, epoch, shard_id, generation))

    async def renew(
        self,
        dataset_id: str,
        holder: str,
        epoch: int = 0,
        shard_ids: Sequence[int] = (),
        *,
        generation: int = 0,
    ) -> RenewResult:
        return await self._drive(self._renew(dataset_id, holder, epoch, shard_ids, generation))

    async def release(
        self,
        dataset_id: str,
        holder: str,
        resume_step: int | None = None,
        *,
        keep_provisional: bool = False,
        generation: int = 0,
        request_id: str = "",
    ) -> ReleaseResult:
        return await self._drive(
            self._release(
                dataset_id,
                holder,
                resume_step,
                keep_provisional,
                generation=generation,
                request_id=request_id,
            )
        )

    async def cover(
        self,
        dataset_id: str,
        holder: str,
        shards: Sequence[tuple[int, int]],
        *,
        generation: int = 0,
    ) -> int:
        return await self._drive(self._cover(dataset_id, holder, shards, generation))

    async def checkpoint(self, dataset_id: str, checkpoint_id: str) -> DatasetStatus:
        return await self._drive(self._checkpoint(dataset_id, checkpoint_id))

    async def restore(
        self, dataset_id: str, checkpoint_id: str, *, force: bool = False
    ) -> DatasetStatus:
        return await self._drive(self._restore(dataset_id, checkpoint_id, force))

    async def shards_at(
        self, dataset_id: str, rank: int, epoch: int, position: int, count: int
    ) -> ShardsAt:
        return await self._drive(self._shards_at(dataset_id, rank, epoch, position, count))


def _samples(settings: DatasetSettings, shard_id: int) -> int:
    start, end = shard_range(shard_id, settings.size, settings.shard_size)
    return end - start


def _acked(reply: Reply) -> bool | None:
    """The acknowledgement flag of an acquire reply that got past `_check` ('-1' none,
    '0' acknowledged before, '1' now)."""
    flag = reply["acked"]
    return None if flag == "-1" else flag == "1"
