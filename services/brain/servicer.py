"""gRPC servicer of the Brain. Every RPC is still UNIMPLEMENTED (the Brain issue builds them)."""

from __future__ import annotations

from gearshift.v1 import brain_pb2_grpc


class BrainServicer(brain_pb2_grpc.BrainServicer):
    """Answers UNIMPLEMENTED for every RPC until the Brain's logic lands."""
