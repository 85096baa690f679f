"""RedisPipe, the shard manager's pipelined asyncio connection, against real Redis servers.

Replies must reach the command that asked (many in flight on one connection),
errors must be redis-py's classes (the store maps them to statuses), and a
broken, slow or absent Redis must fail the commands in flight and recover
on the next command, never answer one command with another's reply.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis
import redis.exceptions as rex

from gearshift.common.errors import UnavailableError
from gearshift.common.ports import free_port
from gearshift.shardmanager.model import AcquireStatus, DatasetSettings, DatasetStatus, Mode
from gearshift.shardmanager.redis_pipe import RedisAddress, RedisPipe
from gearshift.shardmanager.store import AsyncShardStore, ShardStore
from tests.integration.test_shard_consumers import RedisServer, redis_servers


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    yield from redis_servers(tmp_path)


def test_concurrent_commands_get_their_own_replies_in_few_writes(
    redis_url: str, unique_id: str
) -> None:
    key = f"gstest:{unique_id}:pipe"

    async def run() -> tuple[list[object], int]:
        pipe = RedisPipe(redis_url)
        echoes = [pipe.execute("ECHO", f"m{i}") for i in range(500)]
        counts = [pipe.execute("INCR", key) for _ in range(100)]
        got = await asyncio.gather(*echoes, *counts)
        opened = pipe.connections
        pipe.close()
        return got, opened

    got, opened = asyncio.run(run())
    assert got[:500] == [f"m{i}".encode() for i in range(500)]
    assert got[500:] == list(range(1, 101))  # in the order they were sent
    assert opened == 1
    redis.Redis.from_url(redis_url).delete(key)


def test_error_replies_are_redis_py_errors_and_the_connection_goes_on(redis_url: str) -> None:
    async def run() -> None:
        pipe = RedisPipe(redis_url)
        with pytest.raises(rex.NoScriptError):
            await pipe.execute("EVALSHA", "0" * 40, 0)
        with pytest.raises(rex.ResponseError, match="unknown command"):
            await pipe.execute("NO-SUCH-COMMAND")
        with pytest.raises(rex.ResponseError, match="bad order length"):
            await pipe.execute("EVAL", "return redis.error_reply('bad order length')", 0)
        assert await pipe.execute("PING") == b"PONG"
        assert pipe.connections == 1
        pipe.close()

    asyncio.run(run())


def test_url_selects_the_database_and_logs_in(private_redis: Callable[..., RedisServer]) -> None:
    server = private_redis()
    admin = redis.Redis.from_url(server.url)
    admin.config_set("requirepass", "s3cret")
    authed = redis.Redis.from_url(f"redis://:s3cret@127.0.0.1:{server.port}/3")
    url = f"redis://:s3cret@127.0.0.1:{server.port}/3"
    assert RedisAddress.from_url(url) == RedisAddress("127.0.0.1", server.port, db=3,
                                                      password="s3cret")  # fmt: skip

    async def run() -> None:
        pipe = RedisPipe(url)
        assert await pipe.execute("SET", "where", "db3") is not None
        pipe.close()
        wrong = RedisPipe(f"redis://:nope@127.0.0.1:{server.port}/3")
        with pytest.raises(rex.ConnectionError, match="refused the login"):
            await wrong.execute("PING")

    asyncio.run(run())
    assert authed.get("where") == b"db3"
    assert authed.dbsize() == 1
    authed.select(0)
    authed.close()
    admin.close()


def test_no_redis_fails_fast_then_the_next_command_connects(tmp_path: Path) -> None:
    port = free_port()

    async def attempt(pipe: RedisPipe) -> float:
        started = time.monotonic()
        with pytest.raises(rex.ConnectionError, match="cannot connect"):
            await pipe.execute("PING")
        return time.monotonic() - started

    async def run() -> None:
        pipe = RedisPipe(f"redis://127.0.0.1:{port}/0")
        assert await attempt(pipe) < 2.0  # refused: three quick tries, no waiting
        server = RedisServer(tmp_path / "redis", port=port).start()
        try:
            assert await pipe.execute("PING") == b"PONG"
        finally:
            server.kill()
        pipe.close()

    asyncio.run(run())


def test_redis_killed_fails_the_commands_in_flight_and_reconnects(
    private_redis: Callable[..., RedisServer],
) -> None:
    server = private_redis()

    async def run() -> None:
        pipe = RedisPipe(server.url)
        assert await pipe.execute("PING") == b"PONG"
        blocked = asyncio.ensure_future(pipe.execute("BLPOP", "never", 30))
        await asyncio.sleep(0.2)
        await asyncio.get_running_loop().run_in_executor(None, server.kill)
        with pytest.raises(rex.ConnectionError):
            await asyncio.wait_for(blocked, 10)
        await asyncio.get_running_loop().run_in_executor(None, server.start)
        assert await pipe.execute("PING") == b"PONG"
        assert pipe.connections == 2
        pipe.close()

    asyncio.run(run())


def test_a_reply_overdue_by_the_timeout_fails_and_the_connection_is_replaced(
    redis_url: str, unique_id: str
) -> None:
    async def run() -> None:
        pipe = RedisPipe(redis_url, command_timeout=1.0)
        started = time.monotonic()
        blocked = asyncio.ensure_future(pipe.execute("BLPOP", f"gstest:{unique_id}:never", 20))
        await asyncio.sleep(0.1)
        behind = asyncio.ensure_future(pipe.execute("PING"))  # behind it on the same connection
        with pytest.raises(rex.TimeoutError, match="no reply within 1 s"):
            await blocked
        with pytest.raises(rex.TimeoutError):
            await behind
        assert 1.0 <= time.monotonic() - started < 4.0
        assert await pipe.execute("PING") == b"PONG"
        assert pipe.connections == 2
        pipe.close()

    asyncio.run(run())


def test_async_store_answers_as_the_blocking_store(redis_url: str, unique_id: str) -> None:
    """Both drivers of the store's operations, interleaved on one dataset, agree."""
    prefix = f"gstest:{unique_id}"
    blocking = ShardStore.from_url(redis_url, prefix=prefix)
    settings = DatasetSettings("j", size=25, shard_size=10, seed=4, num_epochs=2,
                               mode=Mode.DYNAMIC)  # fmt: skip

    def same(a: DatasetStatus, b: DatasetStatus) -> bool:
        return replace(a, at_ms=0) == replace(b, at_ms=0)

    async def run() -> None:
        store = AsyncShardStore.from_url(redis_url, prefix=prefix, connections=2)
        assert same(await store.create("ds", settings), blocking.describe("ds"))
        seen: list[tuple[int, int]] = []
        previous = None
        while True:
            result = await store.acquire("ds", "a", f"r{len(seen)}", previous)
            if result.status is AcquireStatus.END_OF_DATA:
                break
            assert result.shard is not None
            seen.append((result.shard.epoch, result.shard.shard_id))
            previous = seen[-1]
            assert same(await store.describe("ds"), blocking.describe("ds"))
        # Epoch 1 started in the second round trip of an acquire: its order came in.
        assert sorted(seen) == [(e, s) for e in range(2) for s in range(3)]
        assert (await store.describe("ds")).finished
        assert await store.delete_job("j") == ["ds"]
        broken = AsyncShardStore.from_url(f"redis://127.0.0.1:{free_port()}/0")
        with pytest.raises(UnavailableError, match="Redis is unavailable"):
            await broken.describe("ds")
        store.close()

    asyncio.run(run())
    blocking.close()
