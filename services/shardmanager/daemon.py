"""The shard-manager daemon: flags, servicers, serving.

The daemon keeps no state of its own: every dataset lives in Redis, so any
number of replicas may serve one Redis, and a replica may be killed and
restarted at any time. It starts even when Redis is down (calls then answer
UNAVAILABLE until Redis is back), so an orchestrator may start them in any order.

It serves on grpc.aio (one event loop; see gearshift.common.server.AioGrpcServer):
a consumer's StreamShards stream holds no thread, so the number of consumers
is not bounded by a thread pool, and Redis is reached over a few pipelined
connections shared by every call (`--redis-pool-size`).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from typing import Any

import redis

from gearshift.common.config import Option
from gearshift.common.daemon import Daemon, run_daemon, server_options
from gearshift.common.errors import UnavailableError
from gearshift.common.server import register
from gearshift.shardmanager.servicer import ShardManagerServicer
from gearshift.shardmanager.store import (
    DEFAULT_DELETED_TTL_SECONDS,
    DEFAULT_MAX_SHARDS,
    DEFAULT_PREFIX,
    AsyncShardStore,
    ShardStore,
)
from gearshift.v1 import shardmanager_pb2, shardmanager_pb2_grpc

log = logging.getLogger("gearshift.shardmanager")

PROG = "gearshift-shardmanager"
DESCRIPTION = "Gearshift shard manager: dynamic and deterministic data sharding over gRPC."
DEFAULT_PORT = 50053
OPTIONS = [
    *server_options(DEFAULT_PORT),
    Option(
        "redis_url",
        "Redis URL holding every dataset's state, redis://[:password@]host:port/db "
        "(default redis://127.0.0.1:6379/0; not echoed, it may hold a password)",
        "redis://127.0.0.1:6379/0",
        secret=True,
    ),
    Option(
        "redis_pool_size",
        "connections to Redis; the commands of concurrent calls are pipelined over them",
        1,
        int,
    ),
    Option("key_prefix", "prefix of every Redis key this service writes", DEFAULT_PREFIX),
    Option(
        "deleted_ttl_seconds",
        "seconds a deleted dataset's keys stay before they expire (0: removed at once)",
        DEFAULT_DELETED_TTL_SECONDS,
        int,
    ),
    Option("max_shards", "most shards per dataset epoch", DEFAULT_MAX_SHARDS, int),
]


def build(config: argparse.Namespace) -> Daemon:
    if config.redis_pool_size < 1:
        raise ValueError("--redis-pool-size must be >= 1")
    if config.deleted_ttl_seconds < 0:
        raise ValueError("--deleted-ttl-seconds must be >= 0")
    if config.max_shards < 1:
        raise ValueError("--max-shards must be >= 1")
    if not config.key_prefix:
        raise ValueError("--key-prefix must not be empty")
    settings: dict[str, Any] = {
        "prefix": config.key_prefix,
        "deleted_ttl_seconds": config.deleted_ttl_seconds,
        "max_shards": config.max_shards,
    }
    # Scripts go into Redis's cache now, so that each transition is one EVALSHA
    # from the first call on (a blocking client, for this one step at start).
    loader = ShardStore.from_url(config.redis_url, pool_size=1, **settings)
    try:
        loader.load_scripts()
    except (redis.RedisError, UnavailableError) as exc:
        log.warning("Redis unreachable at start; calls answer UNAVAILABLE until it is back",
                    extra={"error": str(exc)})  # fmt: skip
    finally:
        loader.close()
    store = AsyncShardStore.from_url(
        config.redis_url, connections=config.redis_pool_size, **settings
    )
    service = shardmanager_pb2.DESCRIPTOR.services_by_name["ShardManager"].full_name
    return Daemon(
        [
            register(
                shardmanager_pb2_grpc.add_ShardManagerServicer_to_server,
                ShardManagerServicer(store),
                service,
            )
        ],
        on_stop=[store.close],
        aio=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_daemon(PROG, DESCRIPTION, OPTIONS, build, argv)
