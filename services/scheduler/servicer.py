"""gRPC servicers of the scheduler. Submissions are validated; the scheduling logic itself is
still UNIMPLEMENTED (the scheduler issue builds it)."""

from __future__ import annotations

import grpc

from gearshift.common.jobspec import validate_job_spec
from gearshift.common.validation import require
from gearshift.v1 import scheduler_pb2, scheduler_pb2_grpc


class JobServicer(scheduler_pb2_grpc.JobServiceServicer):
    """Jobs API."""

    def SubmitJob(
        self, request: scheduler_pb2.SubmitJobRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.SubmitJobResponse:
        require(len(request.idempotency_key) <= 128, "idempotency_key", "at most 128 characters")
        require(request.HasField("spec"), "spec", "is required")
        validate_job_spec(request.spec)
        raise NotImplementedError


class WorkerRegistryServicer(scheduler_pb2_grpc.WorkerRegistryServicer):
    """Workers API."""
