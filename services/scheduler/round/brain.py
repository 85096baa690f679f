"""What the scheduler asks and tells the Brain, with a local fallback.

Throughputs come from Brain.EstimateThroughput when a Brain address is
configured; when none is, or the Brain answers UNIMPLEMENTED or UNAVAILABLE (not
deployed yet, restarting), they default to 1.0 step/s and the scheduler logs
that it did (once per reason, not per call) - measured throughputs replace both
(gearshift.scheduler.round.estimates). EST splits are the scheduler's own: one
planner (gearshift.common.estplan, the function the Brain's PlanEsts runs too)
fed by those estimates. Lifecycle events (submitted, started, ended) are
reported to the Brain, best effort, so that its job histories begin. Resource plans
(PlanResources, gearshift.scheduler.plugins.dlrover.resource_plans) are None when the Brain cannot
be
asked: the job then runs on the defaults.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import grpc

from gearshift.common.auth import ClientTls
from gearshift.common.channel import OptionalClient
from gearshift.common.errors import rpc_code, rpc_details
from gearshift.v1 import brain_pb2, brain_pb2_grpc, common_pb2

log = logging.getLogger("gearshift.scheduler.brain")

DEFAULT_THROUGHPUT = 1.0
_FALLBACK_CODES = {grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE}
_NO_FIT_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
}


class BrainAdvisor:
    """Throughput estimates and lifecycle events: the scheduler's calls to the Brain."""

    def __init__(
        self,
        address: str = "",
        *,
        token: str | None = None,
        tls: ClientTls | None = None,
        timeout: float = 5.0,
    ) -> None:
        self.address = address
        self._timeout = timeout
        self._client = OptionalClient(
            address, brain_pb2_grpc.BrainStub, token=token, tls=tls, timeout=timeout
        )
        self._stub = self._client.stub
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def _fallback(self, what: str, reason: str) -> None:
        with self._lock:
            if reason in self._warned:
                return
            self._warned.add(reason)
        log.warning(
            "using the local planner",
            extra={"call": what, "reason": reason, "brain": self.address or "(none)"},
        )

    def throughput(self, job_id: str, model_type: str, worker_type: str, count: int) -> float:
        """Estimated global steps/s of the job on `count` devices of a type (default 1.0)."""
        if self._stub is None:
            return DEFAULT_THROUGHPUT
        try:
            reply = self._stub.EstimateThroughput(
                brain_pb2.EstimateThroughputRequest(
                    job_id=job_id,
                    model_type=model_type,
                    accelerator_type=worker_type,
                    device_count=count,
                ),
                timeout=self._timeout,
            )
        except grpc.RpcError as exc:
            code = rpc_code(exc)
            self._fallback("EstimateThroughput", code.name if code else rpc_details(exc))
            return DEFAULT_THROUGHPUT
        return reply.steps_per_second if reply.steps_per_second > 0 else DEFAULT_THROUGHPUT

    def burst_plan(
        self, keys: Sequence[str], *, global_batch: int, max_devices: int, amp_limit: float
    ) -> brain_pb2.BurstParallelPlan | None:
        """DeepPool's plan over the first of these layer-profile keys the Brain holds; None
        when it holds none of them (the job was never profiled) or cannot be asked."""
        if self._stub is None:
            return None
        for key in keys:
            request = brain_pb2.PlanBurstParallelRequest(
                profile_key=key,
                global_batch=global_batch,
                max_devices=max_devices,
                amp_limit=amp_limit,
            )
            try:
                return self._stub.PlanBurstParallel(request, timeout=self._timeout)
            except grpc.RpcError as exc:
                code = rpc_code(exc)
                if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                    continue  # not profiled on this device, or not at this batch
                self._fallback("PlanBurstParallel", code.name if code else rpc_details(exc))
                return None
        return None

    def fit_model(self, *, job_id: str = "", model_key: str = "") -> brain_pb2.FittedModel | None:
        """Rubick's model fitted (FitModel) on the runs the Brain holds for the job, or for the
        model key; None when it holds too few (or none), or cannot be asked."""
        if self._stub is None:
            return None
        request = (
            brain_pb2.FitModelRequest(job_id=job_id)
            if job_id
            else brain_pb2.FitModelRequest(model_key=model_key)
        )
        try:
            return self._stub.FitModel(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            code = rpc_code(exc)
            if code in _NO_FIT_CODES:
                return None  # nothing (enough) stored for it yet
            self._fallback("FitModel", code.name if code else rpc_details(exc))
            return None

    def report_event(
        self,
        event_id: str,
        job_id: str,
        kind: int,
        time: float,
        *,
        spec: common_pb2.JobSpec | None = None,
        exit_reason: str = "",
    ) -> None:
        """Tell the Brain of a lifecycle event (its job histories start here); best effort."""
        if self._stub is None:
            return
        request = brain_pb2.ReportJobEventRequest(
            event_id=event_id,
            job_id=job_id,
            kind=kind,  # type: ignore[arg-type]
            time=time,
            exit_reason=exit_reason,
        )
        if spec is not None:
            request.spec.CopyFrom(spec)
        try:
            self._stub.ReportJobEvent(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            code = rpc_code(exc)
            self._fallback("ReportJobEvent", code.name if code else rpc_details(exc))

    def plan_resources(
        self,
        request: brain_pb2.PlanResourcesRequest,
        spec: common_pb2.JobSpec,
        submitted_at: float,
    ) -> brain_pb2.ResourcePlan | None:
        """The Brain's resource plan for a job; None (logged) when it cannot be had. A job
        the Brain does not know yet (its SUBMITTED event is reported in the background) is
        reported first, under that event's id, so the Brain stores it once."""
        if self._stub is None:
            return None
        for attempt in (1, 2):
            try:
                return self._stub.PlanResources(request, timeout=self._timeout)
            except grpc.RpcError as exc:
                code = rpc_code(exc)
                if code == grpc.StatusCode.NOT_FOUND and attempt == 1:
                    self.report_event(
                        f"{request.job_id}:1",
                        request.job_id,
                        brain_pb2.JOB_EVENT_KIND_SUBMITTED,
                        submitted_at,
                        spec=spec,
                    )
                    continue
                if code in _FALLBACK_CODES:  # down or not deployed: once, not per job
                    self._fallback("PlanResources", code.name if code else rpc_details(exc))
                else:
                    log.warning(
                        "no resource plan from the Brain; the job keeps its plan or the defaults",
                        extra={"job_id": request.job_id, "error": rpc_details(exc)},
                    )
                return None
        return None

    def close(self) -> None:
        self._client.close()
