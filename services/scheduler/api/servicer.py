"""gRPC servicers of the scheduler: validate the request, call the domain layer, build the reply.

The logic lives in gearshift.scheduler.service; errors are
gearshift.common.errors exceptions that the server's interceptor maps to status
codes, with messages that name the field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import grpc

from gearshift.common.authz import current_identity
from gearshift.common.codepkg import check_sha256, chunks
from gearshift.common.config import host_port
from gearshift.common.errors import UnimplementedError
from gearshift.common.facts import ENDED_TASK_STATES
from gearshift.common.jobspec import validate_job_spec, with_defaults
from gearshift.common.validation import (
    check_accelerator_type,
    check_enum,
    check_name,
    decode_page_token,
    encode_page_token,
    page_size,
    require,
    tail_lines,
)
from gearshift.scheduler.api.worker_reports import check_batch, check_heartbeat, check_task_status
from gearshift.scheduler.service import Scheduler
from gearshift.scheduler.state.records import EventRecord, JobRecord
from gearshift.scheduler.types import RescaleCost
from gearshift.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc


def job_message(job: JobRecord) -> scheduler_pb2.Job:
    return scheduler_pb2.Job(
        job_id=job.job_id,
        spec=job.spec,
        state=job.state,  # type: ignore[arg-type]
        submitted_at=job.submitted_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        progress=job.progress,
        placement=job.placement,
        rescale_count=job.rescale_count,
        message=job.message,
        final_digest=job.final_digest,
        last_sequence=job.last_sequence,
        collocation=job.collocation if job.collocation.role else None,
        paused=job.paused,
        plan=job.plan,
        resource_plan=job.resource_plan,
        reason=reason_message(job),
        queue_position=job.queue_position,
        rescale_cost=_cost(job.rescale_cost),
        in_place_rescale_cost=_cost(job.in_place_rescale_cost),
    )


def _cost(cost: RescaleCost | None) -> scheduler_pb2.RescaleCost | None:
    if cost is None:
        return None
    return scheduler_pb2.RescaleCost(
        count=cost.count, last_seconds=cost.last_s, mean_seconds=cost.mean_s
    )


def reason_message(job: JobRecord) -> scheduler_pb2.JobReason | None:
    """The contract's form of the job's reason (None: it has none)."""
    reason = job.reason
    if reason is None:
        return None
    return scheduler_pb2.JobReason(
        code=reason.code,
        message=reason.message,
        facts=dict(reason.facts),
        since=job.reason_since,
        estimated_start=job.estimated_start,
    )


def event_message(event: EventRecord) -> scheduler_pb2.JobEvent:
    out = scheduler_pb2.JobEvent(
        job_id=event.job_id,
        sequence=event.sequence,
        time=event.time,
        type=event.type,  # type: ignore[arg-type]
        state=event.state,  # type: ignore[arg-type]
        message=event.message,
    )
    if event.progress is not None:
        out.progress.CopyFrom(event.progress)
    if event.placement is not None:
        out.placement.CopyFrom(event.placement)
    return out


def check_job_id(value: str, field: str = "job_id") -> None:
    check_name(value, field, max_length=64)


def check_devices(groups: Sequence[common_pb2.DeviceGroup], field: str = "devices") -> None:
    require(len(groups) > 0, field, "at least one device group is required")
    for i, group in enumerate(groups):
        where = f"{field}[{i}]"
        check_accelerator_type(group.accelerator_type, f"{where}.accelerator_type")
        require(group.count >= 1, f"{where}.count", f"must be >= 1 (got {group.count})")
        require(group.memory_bytes >= 0, f"{where}.memory_bytes", "must be >= 0")


class JobServicer(scheduler_pb2_grpc.JobServiceServicer):
    """Jobs API over a Scheduler."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def SubmitJob(
        self, request: scheduler_pb2.SubmitJobRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.SubmitJobResponse:
        require(len(request.idempotency_key) <= 128, "idempotency_key", "at most 128 characters")
        require(request.HasField("spec"), "spec", "is required")
        validate_job_spec(request.spec)
        job, created = self.scheduler.submit(with_defaults(request.spec), request.idempotency_key)
        return scheduler_pb2.SubmitJobResponse(job=job_message(job), created=created)

    def GetJob(
        self, request: scheduler_pb2.GetJobRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.Job:
        check_job_id(request.job_id)
        return job_message(self.scheduler.get(request.job_id))

    def ListJobs(
        self, request: scheduler_pb2.ListJobsRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.ListJobsResponse:
        check_name(request.tenant, "tenant", max_length=64, required=False)
        require(len(request.name_prefix) <= 128, "name_prefix", "at most 128 characters")
        for i, state in enumerate(request.states):
            check_enum(state, common_pb2.JobState.values(), f"states[{i}]", allow_unspecified=False)
        size = page_size(request.page.page_size)
        cursor = decode_page_token(request.page.page_token)
        after: tuple[float, str] | None = None
        if cursor:
            when, job_id = cursor.get("t"), cursor.get("id")
            require(
                isinstance(when, (int, float)) and isinstance(job_id, str),
                "page.page_token",
                "is not a token returned by this server",
            )
            assert isinstance(when, (int, float)) and isinstance(job_id, str)
            after = (float(when), job_id)
        jobs = self.scheduler.list_jobs(
            tenant=request.tenant,
            states=list(request.states),
            name_prefix=request.name_prefix,
            limit=size + 1,
            after=after,
        )
        token = ""
        if len(jobs) > size:
            jobs = jobs[:size]
            token = encode_page_token({"t": jobs[-1].submitted_at, "id": jobs[-1].job_id})
        return scheduler_pb2.ListJobsResponse(
            jobs=[job_message(j) for j in jobs], next_page_token=token
        )

    def CancelJob(
        self, request: scheduler_pb2.CancelJobRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.Job:
        check_job_id(request.job_id)
        require(len(request.reason) <= 1024, "reason", "at most 1024 characters")
        return job_message(self.scheduler.cancel(request.job_id, request.reason))

    def ScaleJob(
        self, request: scheduler_pb2.ScaleJobRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.Job:
        check_job_id(request.job_id)
        if not request.auto:
            require(request.ps >= 1, "ps", f"must be >= 1 (got {request.ps})")
            require(request.workers >= 1, "workers", f"must be >= 1 (got {request.workers})")
        require(request.ps_cores >= 0, "ps_cores", "must be >= 0 (0: the current plan's)")
        require(request.worker_cores >= 0, "worker_cores", "must be >= 0 (0: the current plan's)")
        caller = current_identity()
        job = self.scheduler.scale(
            request.job_id,
            ps=request.ps,
            workers=request.workers,
            ps_cores=request.ps_cores,
            worker_cores=request.worker_cores,
            auto=request.auto,
            who=str(caller) if caller is not None else "a user",
        )
        return job_message(job)

    def WatchJob(
        self, request: scheduler_pb2.WatchJobRequest, context: grpc.ServicerContext
    ) -> Iterator[scheduler_pb2.JobEvent]:
        check_job_id(request.job_id)
        require(request.after_sequence >= 0, "after_sequence", "must be >= 0")
        for event in self.scheduler.watch(
            request.job_id, request.after_sequence, context.is_active
        ):
            yield event_message(event)

    def GetClusterState(
        self, request: scheduler_pb2.GetClusterStateRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.ClusterState:
        return self.scheduler.cluster_state()

    def StreamJobLogs(
        self, request: scheduler_pb2.StreamJobLogsRequest, context: grpc.ServicerContext
    ) -> Iterator[common_pb2.LogLine]:
        check_job_id(request.job_id)
        tail = tail_lines(request.rank, request.tail_lines)
        yield from self.scheduler.job_logs(
            request.job_id,
            request.rank,
            tail,
            request.follow,
            context.is_active,
        )

    def StreamJobSteps(
        self, request: scheduler_pb2.StreamJobStepsRequest, context: grpc.ServicerContext
    ) -> Iterator[common_pb2.StepLoss]:
        check_job_id(request.job_id)
        require(request.after_step >= 0, "after_step", f"must be >= 0 (got {request.after_step})")
        yield from self.scheduler.job_steps(request.job_id, request.after_step)

    def HasCode(
        self, request: scheduler_pb2.HasCodeRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.HasCodeResponse:
        check_sha256(request.sha256, "sha256")
        return scheduler_pb2.HasCodeResponse(present=self.scheduler.has_code(request.sha256))

    def UploadCode(
        self, request_iterator: Iterator[common_pb2.CodeChunk], context: grpc.ServicerContext
    ) -> scheduler_pb2.UploadCodeResponse:
        sha256, stored = self.scheduler.upload_code(request_iterator)
        return scheduler_pb2.UploadCodeResponse(sha256=sha256, stored=stored)


class WorkerRegistryServicer(scheduler_pb2_grpc.WorkerRegistryServicer):
    """Workers API over a Scheduler."""

    def __init__(
        self, scheduler: Scheduler, relay_port: Callable[[str], int] = lambda _worker: 0
    ) -> None:
        self.scheduler = scheduler
        self.relay_port = relay_port  # the heartbeat relay that serves a worker (0: none)

    def RegisterWorker(
        self, request: scheduler_pb2.RegisterWorkerRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.RegisterWorkerResponse:
        check_name(request.worker_id, "worker_id", required=False)
        require(bool(request.address), "address", "is required")
        try:
            host_port(request.address)
        except ValueError as exc:
            require(False, "address", str(exc))
        require(len(request.hostname) <= 256, "hostname", "at most 256 characters")
        check_devices(request.devices)
        require(request.cpu_cores >= 0, "cpu_cores", "must be >= 0 (0: unknown)")
        require(request.memory_bytes >= 0, "memory_bytes", "must be >= 0 (0: unknown)")
        for i, task in enumerate(request.tasks):
            check_task_status(task, f"tasks[{i}]")
        worker = self.scheduler.register_worker(
            request.worker_id,
            request.address,
            request.hostname,
            request.devices,
            request.tasks,
            cpu_cores=request.cpu_cores,
            memory_bytes=request.memory_bytes,
        )
        settings = self.scheduler.settings
        return scheduler_pb2.RegisterWorkerResponse(
            worker_id=worker.worker_id,
            heartbeat_interval_seconds=settings.heartbeat_interval,
            heartbeat_timeout_seconds=settings.heartbeat_timeout,
            heartbeat_port=self.relay_port(worker.worker_id),
        )

    def Heartbeat(
        self, request: scheduler_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.HeartbeatResponse:
        check_heartbeat(request)
        reregister = self.scheduler.heartbeat(request.worker_id, request.tasks)
        return scheduler_pb2.HeartbeatResponse(reregister=reregister)

    def HeartbeatBatch(
        self, request: scheduler_pb2.HeartbeatBatchRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.HeartbeatBatchResponse:
        check_batch(request)
        reregister = self.scheduler.heartbeats([(h.worker_id, h.tasks) for h in request.heartbeats])
        return scheduler_pb2.HeartbeatBatchResponse(
            replies=[scheduler_pb2.HeartbeatResponse(reregister=r) for r in reregister]
        )

    def HeartbeatStream(
        self,
        request_iterator: Iterator[scheduler_pb2.HeartbeatRequest],
        context: grpc.ServicerContext,
    ) -> Iterator[scheduler_pb2.HeartbeatResponse]:
        raise UnimplementedError(
            "HeartbeatStream is served by the heartbeat relays (RegisterWorkerResponse."
            "heartbeat_port, --heartbeat-relays); heartbeat the scheduler with Heartbeat"
        )

    def RenewLease(
        self, request: scheduler_pb2.RenewLeaseRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.RenewLeaseResponse:
        check_name(request.worker_id, "worker_id")
        require(bool(request.task_id), "task_id", "is required")
        renewed, lease = self.scheduler.renew_lease(request.worker_id, request.task_id)
        return scheduler_pb2.RenewLeaseResponse(
            renewed=renewed, lease=lease, epoch=self.scheduler.state.epoch
        )

    def TaskFinished(
        self, request: scheduler_pb2.TaskFinishedRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.TaskFinishedResponse:
        check_name(request.worker_id, "worker_id")
        require(request.HasField("status"), "status", "is required")
        check_task_status(request.status, "status")
        require(
            request.status.state in ENDED_TASK_STATES,
            "status.state",
            "must be TASK_STATE_COMPLETED, TASK_STATE_CHECKPOINTED, TASK_STATE_FAILED or "
            "TASK_STATE_LEFT",
        )
        self.scheduler.task_finished(request.worker_id, request.status)
        return scheduler_pb2.TaskFinishedResponse()

    def FetchCode(
        self, request: scheduler_pb2.FetchCodeRequest, context: grpc.ServicerContext
    ) -> Iterator[common_pb2.CodeChunk]:
        check_sha256(request.sha256, "sha256")
        yield from chunks(request.sha256, self.scheduler.code(request.sha256))
