"""The shard-manager daemon: flags, servicers, serving."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from gearshift.common.daemon import Daemon, run_daemon, server_options
from gearshift.common.server import register
from gearshift.shardmanager.servicer import ShardManagerServicer
from gearshift.v1 import shardmanager_pb2, shardmanager_pb2_grpc

DEFAULT_PORT = 50053
OPTIONS = [*server_options(DEFAULT_PORT)]


def build(config: argparse.Namespace) -> Daemon:
    service = shardmanager_pb2.DESCRIPTOR.services_by_name["ShardManager"].full_name
    return Daemon(
        [
            register(
                shardmanager_pb2_grpc.add_ShardManagerServicer_to_server,
                ShardManagerServicer(),  # type: ignore[abstract]
                service,
            )
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_daemon(
        "gearshift-shardmanager",
        "Gearshift shard manager: dynamic and deterministic data sharding over gRPC.",
        OPTIONS,
        build,
        argv,
    )
