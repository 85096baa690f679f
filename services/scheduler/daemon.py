"""The scheduler daemon: flags, servicers, serving."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from gearshift.common.daemon import Daemon, run_daemon, server_options
from gearshift.common.server import register
from gearshift.scheduler.servicer import JobServicer, WorkerRegistryServicer
from gearshift.v1 import scheduler_pb2, scheduler_pb2_grpc

DEFAULT_PORT = 50051
OPTIONS = [*server_options(DEFAULT_PORT)]


def build(config: argparse.Namespace) -> Daemon:
    services = scheduler_pb2.DESCRIPTOR.services_by_name
    return Daemon(
        [
            register(
                scheduler_pb2_grpc.add_JobServiceServicer_to_server,
                JobServicer(),  # type: ignore[abstract]
                services["JobService"].full_name,
            ),
            register(
                scheduler_pb2_grpc.add_WorkerRegistryServicer_to_server,
                WorkerRegistryServicer(),  # type: ignore[abstract]
                services["WorkerRegistry"].full_name,
            ),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_daemon(
        "gearshift-scheduler",
        "Gearshift scheduler: jobs API, worker registry and round-based scheduling over gRPC.",
        OPTIONS,
        build,
        argv,
    )
