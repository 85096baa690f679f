"""The Brain daemon: flags, servicers, serving."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from gearshift.brain.servicer import BrainServicer
from gearshift.common.daemon import Daemon, run_daemon, server_options
from gearshift.common.server import register
from gearshift.v1 import brain_pb2, brain_pb2_grpc

DEFAULT_PORT = 50052
OPTIONS = [*server_options(DEFAULT_PORT)]


def build(config: argparse.Namespace) -> Daemon:
    service = brain_pb2.DESCRIPTOR.services_by_name["Brain"].full_name
    return Daemon([register(brain_pb2_grpc.add_BrainServicer_to_server, BrainServicer(), service)])  # type: ignore[abstract]


def main(argv: Sequence[str] | None = None) -> int:
    return run_daemon(
        "gearshift-brain",
        "Gearshift Brain: job histories, throughput estimates and resource plans over gRPC.",
        OPTIONS,
        build,
        argv,
    )
