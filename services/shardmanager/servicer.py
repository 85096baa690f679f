"""gRPC servicer of the shard manager. Every RPC is still UNIMPLEMENTED (its issue builds them)."""

from __future__ import annotations

from gearshift.v1 import shardmanager_pb2_grpc


class ShardManagerServicer(shardmanager_pb2_grpc.ShardManagerServicer):
    """Answers UNIMPLEMENTED for every RPC until the shard manager's logic lands."""
