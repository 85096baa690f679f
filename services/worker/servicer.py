"""gRPC servicer of the worker daemon. Every RPC is still UNIMPLEMENTED (the end-to-end issue
builds them)."""

from __future__ import annotations

from gearshift.v1 import worker_pb2_grpc


class WorkerAgentServicer(worker_pb2_grpc.WorkerAgentServicer):
    """Answers UNIMPLEMENTED for every RPC until the worker daemon's logic lands."""
