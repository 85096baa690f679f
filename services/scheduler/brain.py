"""What the scheduler asks and tells the Brain, with a local fallback.

EST splits come from Brain.PlanEsts and throughputs from
Brain.EstimateThroughput when a Brain address is configured. When none is, or
the Brain answers UNIMPLEMENTED or UNAVAILABLE (not deployed yet, restarting),
the scheduler plans with gearshift.common.estplan - the same Eq. 1 function the
Brain runs - and uses default throughputs, and logs that it did (once per
reason, not per call). Lifecycle events (submitted, started, ended) are
reported to the Brain, best effort, so that its job histories begin.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from gearshift.common.auth import ClientTls
from gearshift.common.channel import OptionalClient
from gearshift.common.errors import rpc_code, rpc_details
from gearshift.common.estplan import plan_on
from gearshift.v1 import brain_pb2, brain_pb2_grpc, common_pb2

log = logging.getLogger("gearshift.scheduler.brain")

DEFAULT_THROUGHPUT = 1.0
_FALLBACK_CODES = {grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE}


@dataclass(frozen=True)
class EstSplit:
    """ESTs per device for each type, as the planner decided (devices in order)."""

    ests_per_device: dict[str, list[int]]
    source: str  # "brain" or "local"


class BrainAdvisor:
    """EST splits and throughput estimates, from the Brain or locally."""

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

    def split(
        self,
        job_id: str,
        num_ests: int,
        devices: Mapping[str, int],
        capability: Mapping[str, float],
    ) -> EstSplit:
        """ESTs per device over `devices` (the Brain may use fewer of them than offered)."""
        used = {t: n for t, n in devices.items() if n > 0}
        if self._stub is not None:
            request = brain_pb2.PlanEstsRequest(
                job_id=job_id,
                num_ests=num_ests,
                devices=[
                    brain_pb2.DeviceCapability(
                        accelerator_type=t,
                        available=n,
                        minibatches_per_second=capability.get(t, 0.0),
                    )
                    for t, n in sorted(used.items())
                ],
                top_k=0,
            )
            try:
                reply = self._stub.PlanEsts(request, timeout=self._timeout)
                split = {
                    a.accelerator_type: list(a.ests_per_device)
                    for a in reply.assignments
                    if a.device_count > 0
                }
                if split and sum(sum(v) for v in split.values()) == num_ests:
                    return EstSplit(split, "brain")
                self._fallback("PlanEsts", "the Brain's plan does not cover every EST")
            except grpc.RpcError as exc:
                code = rpc_code(exc)
                reason = code.name if code in _FALLBACK_CODES and code else rpc_details(exc)
                self._fallback("PlanEsts", reason)
        else:
            self._fallback("PlanEsts", "no Brain address configured")
        rates = {t: capability.get(t, 0.0) or DEFAULT_THROUGHPUT for t in used}
        plan = plan_on(num_ests, used, rates)
        return EstSplit(
            {p.accelerator_type: list(p.ests_per_device) for p in plan.placements}, "local"
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

    def close(self) -> None:
        self._client.close()
