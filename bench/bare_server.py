"""A gRPC server that answers the load test's RPCs at once and does nothing else.

bench/load.py measures the scheduler against it (`--baseline`): the same load from the
same processes on the same machine in the same run, so that what the scheduler adds
(its interceptors, its lock, its rounds, PostgreSQL) shows as a ratio, apart from what
Python's gRPC alone costs there. It is the plain `grpc.server` with the thread pool
the scheduler's server has (gearshift.common.server.ServerSettings.max_workers).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc

from gearshift.common.server import ServerSettings
from gearshift.v1 import scheduler_pb2

S = scheduler_pb2


def _unary(fn: Callable[[Any, Any], Any], request: Any, reply: Any) -> Any:
    return grpc.unary_unary_rpc_method_handler(
        fn,
        request_deserializer=request.FromString,
        response_serializer=reply.SerializeToString,
    )


def handlers() -> list[grpc.GenericRpcHandler[Any, Any]]:
    """The load test's RPCs of the WorkerRegistry and the JobService, each answered at once."""
    ids = itertools.count(1)

    def submit(request: S.SubmitJobRequest, context: Any) -> S.SubmitJobResponse:
        job = S.Job(job_id=f"job-{next(ids):012x}", spec=request.spec)
        return S.SubmitJobResponse(job=job, created=True)

    def watch(request: S.WatchJobRequest, context: Any) -> Iterator[S.JobEvent]:
        yield S.JobEvent(job_id=request.job_id, sequence=1)

    registry = {
        "RegisterWorker": _unary(
            lambda r, c: S.RegisterWorkerResponse(worker_id=r.worker_id),
            S.RegisterWorkerRequest,
            S.RegisterWorkerResponse,
        ),
        "Heartbeat": _unary(
            lambda r, c: S.HeartbeatResponse(), S.HeartbeatRequest, S.HeartbeatResponse
        ),
    }
    jobs = {
        "SubmitJob": _unary(submit, S.SubmitJobRequest, S.SubmitJobResponse),
        "ListJobs": _unary(
            lambda r, c: S.ListJobsResponse(), S.ListJobsRequest, S.ListJobsResponse
        ),
        "GetClusterState": _unary(
            lambda r, c: S.ClusterState(), S.GetClusterStateRequest, S.ClusterState
        ),
        "WatchJob": grpc.unary_stream_rpc_method_handler(
            watch,
            request_deserializer=S.WatchJobRequest.FromString,
            response_serializer=S.JobEvent.SerializeToString,
        ),
    }
    return [
        grpc.method_handlers_generic_handler("gearshift.v1.WorkerRegistry", registry),
        grpc.method_handlers_generic_handler("gearshift.v1.JobService", jobs),
    ]


def serve(ready: Any, stop: Any) -> None:
    """Serve on a loopback port until `stop` (an Event) is set; the port goes to `ready`
    (a queue), as ("ready", port)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=ServerSettings().max_workers))
    server.add_generic_rpc_handlers(handlers())
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ready.put(("ready", port))
    stop.wait()
    done: threading.Event = server.stop(grace=None)
    done.wait(10)
