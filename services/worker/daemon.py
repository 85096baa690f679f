"""The worker daemon: flags, servicers, serving."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from gearshift.common.daemon import Daemon, run_daemon, server_options
from gearshift.common.server import register
from gearshift.v1 import worker_pb2, worker_pb2_grpc
from gearshift.worker.servicer import WorkerAgentServicer

DEFAULT_PORT = 50054
OPTIONS = [*server_options(DEFAULT_PORT)]


def build(config: argparse.Namespace) -> Daemon:
    service = worker_pb2.DESCRIPTOR.services_by_name["WorkerAgent"].full_name
    servicer = WorkerAgentServicer()  # type: ignore[abstract]
    return Daemon([register(worker_pb2_grpc.add_WorkerAgentServicer_to_server, servicer, service)])


def main(argv: Sequence[str] | None = None) -> int:
    return run_daemon(
        "gearshift-worker",
        "Gearshift worker daemon: runs training processes on this machine's devices.",
        OPTIONS,
        build,
        argv,
    )
