"""The shard manager as a real daemon over gRPC: statuses, the Python client, snapshots,
deterministic sequences, Redis round trips per transition, and life without Redis."""

from __future__ import annotations

import functools
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis

from gearshift.common.channel import connect
from gearshift.common.errors import NotFoundError, PreconditionError, UnauthenticatedError
from gearshift.common.ports import free_port
from gearshift.common.sharding import rank_sequence, shard_indices
from gearshift.shardmanager.store import ShardStore
from gearshift.v1 import common_pb2, shardmanager_pb2, shardmanager_pb2_grpc
from gearshift.worker.shard_client import Shard, ShardClient
from tests.conftest import DaemonFactory
from tests.helpers import wait_until
from tests.integration.test_shard_consumers import (
    RedisServer,
    redis_servers,
    replica_factory,
)
from tests.integration.test_shard_store import snapshot

pb = shardmanager_pb2


@pytest.fixture
def sm(daemons: DaemonFactory, redis_url: str, unique_id: str) -> Callable[..., str]:
    return replica_factory(daemons, redis_url, f"gstest:{unique_id}")


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    yield from redis_servers(tmp_path)


def config(**kw: Any) -> shardmanager_pb2.DatasetConfig:
    values: dict[str, Any] = {
        "job_id": "job-1",
        "size": 100,
        "shard_size": 10,
        "seed": 3,
        "num_epochs": 2,
        "mode": common_pb2.DATA_MODE_DYNAMIC,
    }
    values.update(kw)
    return pb.DatasetConfig(**values)


def status_of(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as exc:
        call()
    return exc.value.code(), str(exc.value.details())


INVALID = grpc.StatusCode.INVALID_ARGUMENT
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
NOT_FOUND = grpc.StatusCode.NOT_FOUND
DETERMINISTIC = common_pb2.DATA_MODE_DETERMINISTIC


def create(dataset_id: str = "x", **kw: Any) -> shardmanager_pb2.CreateDatasetRequest:
    return pb.CreateDatasetRequest(dataset_id=dataset_id, config=config(**kw))


def acquire(holder: str = "h", **kw: Any) -> shardmanager_pb2.AcquireShardRequest:
    return pb.AcquireShardRequest(dataset_id="ds", holder_id=holder, **kw)


def ack(holder: str, shard_id: int) -> shardmanager_pb2.AckShardRequest:
    return pb.AckShardRequest(dataset_id="ds", holder_id=holder, shard_id=shard_id)


BAD_REQUESTS: list[tuple[str, str, Any]] = [
    ("CreateDataset", "dataset_id:", create("")),
    ("CreateDataset", "dataset_id:", create("a b")),
    ("CreateDataset", "config:", pb.CreateDatasetRequest(dataset_id="x")),
    ("CreateDataset", "config.job_id:", create(job_id="")),
    ("CreateDataset", "config.size:", create(size=0)),
    ("CreateDataset", "config.size:", create(size=-5)),
    ("CreateDataset", "config.shard_size:", create(shard_size=0)),
    ("CreateDataset", "config.shard_size:", create(shard_size=101)),
    ("CreateDataset", "config.shard_size:", create(size=10**7, shard_size=1)),  # > max shards
    ("CreateDataset", "config.num_epochs:", create(num_epochs=0)),
    ("CreateDataset", "config.mode:", create(mode=7)),
    ("CreateDataset", "config.num_ranks:", create(mode=DETERMINISTIC)),
    ("CreateDataset", "config.lease_seconds:", create(lease_seconds=0.001)),
    ("CreateDataset", "config.lease_seconds:", create(lease_seconds=float("nan"))),
    ("CreateDataset", "config.max_attempts:", create(max_attempts=-1)),
    ("AcquireShard", "holder_id:", acquire("")),
    ("AcquireShard", "holder_id:", acquire("a b")),
    ("AcquireShard", "request_id:", acquire(request_id="r" * 129)),
    ("AcquireShard", "ack.shard_id:", acquire(ack=pb.ShardRef(shard_id=-1))),
    ("AcquireShard", "ack.shard_id: must be < 10", acquire(ack=pb.ShardRef(shard_id=10))),
    ("AcquireShard", "ack.epoch: has not started", acquire(ack=pb.ShardRef(epoch=1))),
    ("AckShard", "epoch:", pb.AckShardRequest(dataset_id="ds", holder_id="h", epoch=-1)),
    ("AckShard", "shard_id:", ack("h", -2)),
    ("RenewLeases", "shard_ids[1]:", pb.RenewLeasesRequest(dataset_id="ds", holder_id="h",
                                                           shard_ids=[1, -1])),
    ("ReleaseHolder", "holder_id:", pb.ReleaseHolderRequest(dataset_id="ds")),
    ("AcquireShard", "generation:", acquire(generation=-1)),
    ("AckShard", "generation:", pb.AckShardRequest(dataset_id="ds", holder_id="h",
                                                   generation=-1)),
    ("CoverShards", "generation:", pb.CoverShardsRequest(dataset_id="ds", holder_id="h",
                                                         generation=-1)),
    ("RenewLeases", "generation:", pb.RenewLeasesRequest(dataset_id="ds", holder_id="h",
                                                         generation=-1)),
    ("ReleaseHolder", "generation:", pb.ReleaseHolderRequest(dataset_id="ds", holder_id="h",
                                                             generation=-1)),
    ("GetShardsAt", "position:", pb.GetShardsAtRequest(dataset_id="ds", position=-1)),
    ("GetShardsAt", "count:", pb.GetShardsAtRequest(dataset_id="ds", count=1001)),
    ("CheckpointDataset", "checkpoint_id:", pb.CheckpointDatasetRequest(dataset_id="ds")),
    ("RestoreDataset", "checkpoint_id:", pb.RestoreDatasetRequest(dataset_id="ds",
                                                                  checkpoint_id="a/b")),
    ("DeleteJobDatasets", "job_id:", pb.DeleteJobDatasetsRequest()),
]  # fmt: skip


def test_bad_calls_get_a_status_naming_the_field_or_object_and_change_nothing(
    sm: Callable[..., str], redis_url: str, unique_id: str
) -> None:
    address = sm()
    store = ShardStore.from_url(redis_url, prefix=f"gstest:{unique_id}")
    with connect(address, retry=False) as channel:
        stub = shardmanager_pb2_grpc.ShardManagerStub(channel)
        stub.CreateDataset(create("ds"))
        held = stub.AcquireShard(acquire(request_id="1")).shard.shard_id
        todo = next(s for s in range(10) if s != held)
        stub.CheckpointDataset(pb.CheckpointDatasetRequest(dataset_id="ds", checkpoint_id="c"))
        before = snapshot(store, "ds")

        for method, prefix, request in BAD_REQUESTS:
            code, details = status_of(functools.partial(getattr(stub, method), request))
            assert (code, details[: len(prefix)]) == (INVALID, prefix), (method, details)

        def restore(checkpoint: str) -> Any:
            request = pb.RestoreDatasetRequest(dataset_id="ds", checkpoint_id=checkpoint)
            return stub.RestoreDataset(request)

        assert status_of(lambda: stub.CreateDataset(create("ds", seed=4))) == (
            grpc.StatusCode.ALREADY_EXISTS,
            "dataset 'ds' exists with seed='3', not '4'",
        )
        missing = (NOT_FOUND, "dataset 'nope' not found")
        assert (
            status_of(lambda: stub.DescribeDataset(pb.DescribeDatasetRequest(dataset_id="nope")))
            == missing
        )
        assert (
            status_of(
                lambda: stub.AcquireShard(pb.AcquireShardRequest(dataset_id="nope", holder_id="h"))
            )
            == missing
        )
        assert (
            status_of(
                lambda: stub.CheckpointDataset(
                    pb.CheckpointDatasetRequest(dataset_id="nope", checkpoint_id="c")
                )
            )
            == missing
        )
        assert status_of(lambda: stub.AckShard(ack("x", held))) == (
            PRECONDITION,
            f"shard {held} of epoch 0 of dataset 'ds' is not held by holder 'x'; "
            "it is now held by 'h'",
        )
        assert status_of(lambda: stub.AckShard(ack("h", todo))) == (
            PRECONDITION,
            f"shard {todo} of epoch 0 of dataset 'ds' is not held by holder 'h'; "
            "it is waiting in TODO",
        )
        code, details = status_of(
            lambda: stub.AcquireShard(acquire("x", ack=pb.ShardRef(shard_id=held)))
        )
        assert code == PRECONDITION and "not held by holder 'x'" in details
        code, details = status_of(lambda: stub.GetShardsAt(pb.GetShardsAtRequest(dataset_id="ds")))
        assert code == PRECONDITION and "dataset 'ds' is in dynamic mode" in details
        code, details = status_of(lambda: restore("c"))
        assert code == PRECONDITION and "dataset 'ds' is live: 1 shards are held" in details
        assert status_of(lambda: restore("zz")) == (NOT_FOUND, "checkpoint 'ds/zz' not found")
        assert snapshot(store, "ds") == before
        assert not store.client.exists(store.keys("x")[0])
    store.close()


def test_client_iterates_acknowledges_and_renews_in_the_background(
    sm: Callable[..., str], unique_id: str
) -> None:
    address = sm()
    with ShardClient(address) as client:
        client.create_dataset("ds", job_id="j", size=20, shard_size=10, lease_seconds=1.0)
        renewing = client.consumer("ds", "keeper")
        shards = iter(renewing)
        kept = next(shards)
        # Hold it for more than two leases: background renewals keep it.
        wait_until(lambda: renewing.renewals >= 7, 30, "seven renewals")
        with connect(address) as channel:
            raw = shardmanager_pb2_grpc.ShardManagerStub(channel)
            other = raw.AcquireShard(pb.AcquireShardRequest(dataset_id="ds", holder_id="o"))
            assert other.status == pb.ACQUIRE_STATUS_GRANTED
            assert other.shard.shard_id != kept.shard_id
            waiting = raw.AcquireShard(pb.AcquireShardRequest(dataset_id="ds", holder_id="o"))
            assert waiting.status == pb.ACQUIRE_STATUS_WAIT
            raw.AckShard(
                pb.AckShardRequest(dataset_id="ds", holder_id="o", shard_id=other.shard.shard_id)
            )
        assert next(shards, None) is None  # acknowledges `kept`; the only epoch is over
        assert renewing.lost == []
        renewing.close()
        progress = client.describe("ds").epochs[0]
        assert (progress.shards_done, progress.shards_redelivered) == (2, 0)

        client.create_dataset("lapse", job_id="j", size=10, shard_size=10, lease_seconds=0.5)
        silent = client.consumer("lapse", "silent", renew=False)
        lost = silent.acquire()
        assert lost is not None
        taker = client.consumer("lapse", "taker")
        again = taker.acquire()  # waits until the lease runs out, then gets the shard again
        assert again is not None and (again.shard_id, again.attempt) == (lost.shard_id, 2)
        with pytest.raises(PreconditionError, match=r"lease of holder 'silent' .* expired"):
            silent.ack(lost)
        assert taker.ack(again)
        taker.close()
        progress = client.describe("lapse").epochs[0]
        assert (progress.shards_done, progress.shards_redelivered) == (1, 1)


def test_checkpoint_consume_restore_resumes_the_same_stream(sm: Callable[..., str]) -> None:
    first, second = sm(), sm()  # two replicas: the snapshot lives in Redis, not in a replica
    with ShardClient(first) as a, ShardClient(second) as b:
        a.create_dataset("ds", job_id="j", size=95, shard_size=10, num_epochs=3, seed=9,
                         shuffle_within_shard=True)  # fmt: skip
        reader = a.consumer("ds", "r1")
        it = iter(reader)
        for _ in range(4):
            next(it)
        it.close()  # the 4th shard was not acknowledged: still DOING under r1
        taken = a.checkpoint("ds", "step-3")
        assert taken.epochs[0].samples_done == 30 and taken.epochs[0].samples_in_flight == 10

        def stream(client: ShardClient, holder: str) -> list[Shard]:
            with client.consumer("ds", holder) as consumer:
                return [
                    Shard(s.dataset_id, s.epoch, s.shard_id, s.start, s.end, s.indices)
                    for s in consumer
                ]

        reader.release("the job stops for a checkpoint")
        reader.close()
        after = stream(a, "r2")  # the rest of the data, epochs 0..2
        assert len(after) == 3 * 10 - 3
        restored = b.restore("ds", "step-3")
        assert restored.epochs[0].samples_done == 30 and restored.epoch == 0
        assert restored.state == pb.DATASET_STATE_ACTIVE
        resumed = stream(b, "r3")
        assert resumed == after
        assert [s.indices for s in resumed[:3]] == [
            tuple(shard_indices(s.shard_id, 95, 10, 9, s.epoch, shuffle_within=True))
            for s in resumed[:3]
        ]


def test_deterministic_sequences_are_the_same_across_readers_replicas_and_runs(
    daemons: DaemonFactory, redis_url: str, unique_id: str
) -> None:
    args = ["--redis-url", redis_url, "--key-prefix", f"gstest:{unique_id}"]
    settings: dict[str, Any] = {
        "job_id": "j", "size": 1000, "shard_size": 7, "seed": 11, "num_epochs": 3,
        "mode": "deterministic", "num_ranks": 4, "shuffle_within_shard": True,
    }  # fmt: skip

    def expected(rank: int, epoch: int) -> list[tuple[int, tuple[int, ...]]]:
        return [
            (s, tuple(shard_indices(s, 1000, 7, 11, epoch, shuffle_within=True)))
            for s in rank_sequence(143, 11, epoch, 4, rank)
        ]

    def whole(client: ShardClient, rank: int, epoch: int) -> list[tuple[int, tuple[int, ...]]]:
        return [
            (s.shard_id, s.indices or ()) for s in client.rank_shards("det", rank, epoch, batch=5)
        ]

    run1 = [daemons("shardmanager", args), daemons("shardmanager", args)]
    clients = [ShardClient(d.address) for d in run1]
    clients[0].create_dataset("det", **settings)
    first = {(r, e): whole(clients[0], r, e) for r in range(4) for e in range(3)}
    assert first == {(r, e): expected(r, e) for r in range(4) for e in range(3)}

    # Other readers: random positions and counts, from threads, over both replicas.
    got: dict[tuple[int, int, int], tuple[int, tuple[int, ...]]] = {}
    lock = threading.Lock()

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(60):
            rank, epoch = rng.randrange(4), rng.randrange(3)
            position, count = rng.randrange(40), rng.randrange(1, 9)
            client = clients[rng.randrange(2)]
            shards, length = client.shards_at("det", rank, epoch, position, count)
            assert length == len(first[(rank, epoch)])
            with lock:
                for k, s in enumerate(shards):
                    got[(rank, epoch, position + k)] = (s.shard_id, s.indices or ())

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert got and all(first[(r, e)][k] == v for (r, e, k), v in got.items())
    for c in clients:
        c.close()

    # Another run: the dataset deleted, the replicas gone, a new daemon, a new dataset.
    for d in run1:
        d.kill()
    with ShardClient(daemons("shardmanager", args).address) as fresh:
        assert fresh.delete_dataset("det")
        with pytest.raises(NotFoundError):
            fresh.shards_at("det", 0, 0, 0)
        fresh.create_dataset("det", **settings)
        assert {(r, e): whole(fresh, r, e) for r in range(4) for e in range(3)} == first


def test_delete_job_datasets_over_grpc(sm: Callable[..., str]) -> None:
    with ShardClient(sm()) as client:
        for name in ("a", "b"):
            client.create_dataset(name, job_id="job-9", size=10, shard_size=5)
        client.create_dataset("c", job_id="job-8", size=10, shard_size=5)
        assert client.delete_job_datasets("job-9") == ["a", "b"]
        assert client.delete_job_datasets("job-9") == []
        with pytest.raises(NotFoundError, match="dataset 'a' not found"):
            client.describe("a")
        assert client.describe("c").num_shards == 2


def test_each_transition_costs_at_most_two_redis_round_trips(
    daemons: DaemonFactory, private_redis: Callable[..., RedisServer]
) -> None:
    """Counted by Redis itself (MONITOR): commands the daemon sends, not those its scripts run."""
    server = private_redis()
    daemon = daemons("shardmanager", ["--redis-url", server.url])
    seen: list[dict[str, Any]] = []
    monitor_client = redis.Redis.from_url(server.url)
    marker = redis.Redis.from_url(server.url)

    def watch() -> None:
        with monitor_client.monitor() as m:  # type: ignore[no-untyped-call]
            for command in m.listen():
                seen.append(command)
                if command["command"] == "ECHO stop":
                    return

    watcher = threading.Thread(target=watch)
    watcher.start()
    wait_until(lambda: marker.echo("ready") and any(c["command"] == "ECHO ready" for c in seen),
               10, "monitor started")  # fmt: skip
    names: list[str] = []

    def count(name: str, action: Callable[[], Any]) -> Any:
        marker.echo(f"begin {name}")
        result = action()
        marker.echo(f"end {name}")
        names.append(name)
        return result

    with ShardClient(daemon.address) as client:
        raw = client.consumer("ds", "h")
        count("create", lambda: client.create_dataset("ds", job_id="j", size=30, shard_size=10,
                                                      num_epochs=2))  # fmt: skip
        a = count("acquire", raw.acquire)
        count("ack", lambda: raw.ack(a))
        b = count("acquire again", raw.acquire)
        count("renew", raw.renew_now)
        count("acquire+ack", lambda: raw.acquire(ack=b))
        count("checkpoint", lambda: client.checkpoint("ds", "c"))
        count("release", lambda: raw.release("test"))
        c = raw.acquire()
        count("acquire+ack at an epoch change", lambda: raw.acquire(ack=c))
        count("restore into another epoch", lambda: client.restore("ds", "c", force=True))
        count("describe", lambda: client.describe("ds"))
        client.create_dataset("det", job_id="j", size=30, shard_size=10, mode="deterministic",
                              num_ranks=2)  # fmt: skip
        count("shards at", lambda: client.shards_at("det", 1, 0, 0, 3))
        count("delete", lambda: client.delete_dataset("ds"))
        raw.close(release=False)
        client.create_dataset("u", job_id="j", size=30, shard_size=10)
        # The unary AcquireShard RPC (consumers use the stream), called as it is.
        unary = pb.AcquireShardRequest(dataset_id="u", holder_id="h", request_id="u1")
        d = count("unary acquire", lambda: client.call("AcquireShard", unary)).shard
        ack = pb.ShardRef(epoch=d.epoch, shard_id=d.shard_id)
        acked = pb.AcquireShardRequest(dataset_id="u", holder_id="h", request_id="u2", ack=ack)
        count("unary acquire+ack", lambda: client.call("AcquireShard", acked))
    marker.echo("stop")
    watcher.join(timeout=30)
    per: dict[str, int] = {}
    current = None
    for command in seen:
        text = command["command"]
        if text.startswith("ECHO begin "):
            current = text[len("ECHO begin ") :]
        elif text.startswith("ECHO end "):
            current = None
        elif current is not None and command["client_type"] != "lua":
            per[current] = per.get(current, 0) + 1
    print(per)
    assert per["acquire"] == per["ack"] == per["acquire+ack"] == per["renew"] == 1, per
    assert per["unary acquire"] == per["unary acquire+ack"] == 1, per
    assert per["acquire+ack at an epoch change"] == 2
    assert set(per) == set(names) and max(per.values()) <= 2, per
    monitor_client.close()
    marker.close()


def test_daemon_without_redis_answers_unavailable_then_recovers(
    daemons: DaemonFactory, tmp_path: Path
) -> None:
    port = free_port()
    daemon = daemons("shardmanager", ["--redis-url", f"redis://127.0.0.1:{port}/0"])
    with ShardClient(daemon.address, retry_seconds=0) as client:
        with connect(daemon.address, retry=False) as channel:
            stub = shardmanager_pb2_grpc.ShardManagerStub(channel)
            code, details = status_of(
                lambda: stub.DescribeDataset(pb.DescribeDatasetRequest(dataset_id="x"))
            )
        assert code == grpc.StatusCode.UNAVAILABLE and details.startswith("Redis is unavailable")
        server = RedisServer(tmp_path / "redis", port=port).start()
        try:
            created = client.create_dataset("x", job_id="j", size=10, shard_size=5)
            assert created.num_shards == 2  # the same daemon, no restart
        finally:
            server.kill()


def test_client_carries_the_bearer_token(
    daemons: DaemonFactory, redis_url: str, unique_id: str
) -> None:
    args = ["--redis-url", redis_url, "--key-prefix", f"gstest:{unique_id}", "--token", "s3cret"]
    address = daemons("shardmanager", args).address
    with ShardClient(address, token="s3cret") as client:
        assert client.create_dataset("ds", job_id="j", size=10, shard_size=5).num_shards == 2
    with ShardClient(address, token="wrong") as client, pytest.raises(UnauthenticatedError):
        client.describe("ds")
