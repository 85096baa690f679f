"""Fuzzing every RPC of every service, on real daemon processes: random and boundary
messages generated from the proto descriptors (tests/proto_strategies.py), and raw
garbage bytes on the wire. Never INTERNAL or UNKNOWN, never a dead daemon, and a rejected
call leaves the scheduler's and the Brain's rows as they were."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gearshift.client.processes import DaemonProcess, start_daemon
from gearshift.common.channel import connect
from gearshift.v1 import brain_pb2, scheduler_pb2, shardmanager_pb2, worker_pb2
from tests.helpers import scheduler_config
from tests.proto_strategies import messages

EXAMPLES = 25  # per RPC: 41 RPCs in about a minute on 2 cores
FORBIDDEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
CALL_TIMEOUT = 5.0


@dataclass
class Target:
    daemon: DaemonProcess
    channel: grpc.Channel
    database: Path | None  # SQLite file whose rows a rejected call must not change
    redis: redis.Redis | None = None  # and the Redis keys under `prefix`
    prefix: str = ""


def _methods() -> list[tuple[str, MethodDescriptor]]:
    owners = {
        "scheduler": scheduler_pb2,
        "brain": brain_pb2,
        "shardmanager": shardmanager_pb2,
        "worker": worker_pb2,
    }
    return [
        (name, method)
        for name, module in owners.items()
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    ]


METHODS = _methods()


@pytest.fixture(scope="module")
def targets(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[dict[str, Target]]:
    run = tmp_path_factory.mktemp("fuzz")
    databases = {"scheduler": run / "scheduler.db", "brain": run / "brain.db"}
    prefix = f"fuzz-{uuid.uuid4().hex[:8]}:"
    args = {
        "scheduler": [
            *("--database-url", f"sqlite:///{databases['scheduler']}"),
            *scheduler_config(run, round={"seconds": 3600}, heartbeats={"relays": 0}),
        ],
        "brain": ["--database-url", f"sqlite:///{databases['brain']}"],
        "shardmanager": ["--redis-url", redis_url, "--key-prefix", prefix],
        "worker": ["--devices", "cpu:1", "--work-dir", str(run / "worker")],
    }
    out: dict[str, Target] = {}
    try:
        for name, flags in args.items():
            daemon = start_daemon(name, flags, run_dir=run / name)
            daemon.wait_ready(60)
            out[name] = Target(daemon, connect(daemon.address), databases.get(name))
        out["shardmanager"].redis = redis.Redis.from_url(redis_url)
        out["shardmanager"].prefix = prefix
        yield out
    finally:
        for target in out.values():
            target.channel.close()
            target.daemon.stop()
            if target.redis is not None:
                for key in target.redis.scan_iter(match=f"{target.prefix}*"):
                    target.redis.delete(key)
                target.redis.close()


def _state(target: Target) -> dict[str, Any]:
    """What a rejected call must leave as it was: row counts per table, Redis keys' values."""
    state: dict[str, Any] = {}
    if target.database is not None and target.database.exists():
        with sqlite3.connect(target.database) as db:
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            for t in tables:
                state[t] = db.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
    if target.redis is not None:
        for key in target.redis.scan_iter(match=f"{target.prefix}*"):
            state[f"redis:{key!r}"] = target.redis.dump(key)
    return state


def _call(channel: grpc.Channel, method: MethodDescriptor, request: Any) -> grpc.StatusCode:
    """Call the method with the request; the status it ended with."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    reply = GetMessageClass(method.output_type)
    kwargs = {
        "request_serializer": lambda m: m.SerializeToString(),
        "response_deserializer": reply.FromString,
    }
    try:
        if method.client_streaming and method.server_streaming:
            list(channel.stream_stream(path, **kwargs)(iter([request]), timeout=CALL_TIMEOUT))
        elif method.client_streaming:
            channel.stream_unary(path, **kwargs)(iter([request, request]), timeout=CALL_TIMEOUT)
        elif method.server_streaming:
            stream = channel.unary_stream(path, **kwargs)(request, timeout=1.0)
            for _ in zip(range(3), stream, strict=False):
                pass
            stream.cancel()  # type: ignore[no-untyped-call]
        else:
            channel.unary_unary(path, **kwargs)(request, timeout=CALL_TIMEOUT)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize(("name", "method"), METHODS, ids=[f"{n}.{m.name}" for n, m in METHODS])
def test_random_messages_never_crash_and_never_write_half(
    targets: dict[str, Target], name: str, method: MethodDescriptor
) -> None:
    target = targets[name]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(request=messages(method.input_type))
    def one(request: Any) -> None:
        before = _state(target)
        code = _call(target.channel, method, request)
        assert code not in FORBIDDEN, f"{method.full_name}({request}) -> {code}"
        if code not in (
            grpc.StatusCode.OK,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.CANCELLED,
        ):
            assert _state(target) == before, f"{method.full_name} rejected but wrote"
        assert target.daemon.process.poll() is None, target.daemon.log_tail()

    one()


@pytest.mark.parametrize("name", ["scheduler", "brain", "shardmanager", "worker"])
def test_garbage_bytes_on_the_wire(targets: dict[str, Target], name: str) -> None:
    target = targets[name]
    methods = [m for n, m in METHODS if n == name and not m.client_streaming]

    @settings(max_examples=30, deadline=None, database=None)
    @given(st.sampled_from(methods), st.binary(min_size=1, max_size=200))
    def one(method: MethodDescriptor, garbage: bytes) -> None:
        path = f"/{method.containing_service.full_name}/{method.name}"
        raw: dict[str, Any] = {"request_serializer": None, "response_deserializer": None}
        try:
            if method.server_streaming:
                stream = target.channel.unary_stream(path, **raw)(garbage, timeout=1.0)
                for _ in zip(range(2), stream, strict=False):
                    pass
            else:
                target.channel.unary_unary(path, **raw)(garbage, timeout=CALL_TIMEOUT)
        except grpc.RpcError as exc:
            assert exc.code() not in FORBIDDEN, (
                f"{path} on garbage -> {exc.code()}: {exc.details()}"
            )
        assert target.daemon.process.poll() is None, target.daemon.log_tail()

    one()
