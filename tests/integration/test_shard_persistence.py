"""What survives a Redis crash (SIGKILL, then a restart on the same files), per Redis setting.

- appendonly yes, appendfsync always: every transition is on disk before its
  reply; nothing acknowledged is lost, even on power loss.
- appendonly yes, appendfsync everysec: Redis usually write()s the AOF before
  it replies, but while a background fsync is slow it postpones that write up
  to 2 s and replies anyway: a crash may lose the last ~2 s of transitions
  (acknowledged shards come back and are read again). Not tested here: whether
  it loses anything depends on the disk at that instant.
- no persistence: a restart starts empty; the dataset is gone (NOT_FOUND).
(RDB snapshots alone lose every write since the last snapshot: shards acked
since then come back and are read again.)

The mid-run test restarts an AOF Redis while 8 consumers read: the epochs
still end with every sample acknowledged exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gearshift.common.errors import NotFoundError
from gearshift.worker.shard_client import ShardClient
from tests.conftest import DaemonFactory
from tests.integration.test_shard_consumers import KillRun, RedisServer, redis_servers


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    yield from redis_servers(tmp_path)


@pytest.mark.parametrize(
    ("appendonly", "appendfsync", "survives"),
    [(True, "always", True), (False, "no", False)],
)
def test_a_redis_crash_keeps_progress_with_an_append_only_file(
    daemons: DaemonFactory,
    private_redis: Callable[..., RedisServer],
    appendonly: bool,
    appendfsync: str,
    survives: bool,
) -> None:
    server = private_redis(appendonly=appendonly, appendfsync=appendfsync)
    daemon = daemons("shardmanager", ["--redis-url", server.url])
    with ShardClient(daemon.address, retry_seconds=60) as client:
        client.create_dataset("ds", job_id="j", size=100, shard_size=10, num_epochs=2)
        with client.consumer("ds", "a") as consumer:
            shards = iter(consumer)
            for _ in range(6):
                held = next(shards)  # five acknowledged, the sixth held
            before = client.describe("ds")
            server.kill()
            server.start()  # same port, same folder: reads its AOF back
            if not survives:
                with pytest.raises(NotFoundError):
                    client.describe("ds")
                return
            after = client.describe("ds")
            assert after == before
            assert after.epochs[0].shards_done == 5 and after.epochs[0].samples_in_flight == 10
            # The same daemon goes on (its scripts reloaded on demand): the held shard is acked.
            rest = [held, *shards]
        assert len(rest) == 20 - 5
        final = client.describe("ds")
        assert [p.shards_done for p in final.epochs] == [10, 10]
        assert sum(p.shards_redelivered for p in final.epochs) == 0


@pytest.mark.slow
def test_redis_restarted_mid_run_loses_no_sample(
    daemons: DaemonFactory, private_redis: Callable[..., RedisServer], tmp_path: Path
) -> None:
    server = private_redis(appendonly=True, appendfsync="always")
    address = daemons("shardmanager", ["--redis-url", server.url]).address
    restarts: list[int] = []

    def crash_redis(shards_done: int) -> None:
        if not restarts:
            server.kill()
            server.start()
            restarts.append(shards_done)

    (tmp_path / "consumers").mkdir()
    run = KillRun([address], tmp_path / "consumers", kills=3, work_seconds=0.03,
                  on_progress=crash_redis)  # fmt: skip
    run.run("aof")
    assert restarts
