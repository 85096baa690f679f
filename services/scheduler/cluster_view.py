"""GetClusterState's message: every worker, every running job's placement, each tenant's
quota and use. Built outside the scheduler's lock from the records taken under it (a
record's fields are read whole one at a time, and a placement is replaced, never changed:
store.JobRecord.placement)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import chain, compress
from operator import attrgetter

from gearshift.scheduler.guarantees import Admission
from gearshift.scheduler.rubick_policy import RubickAdmission
from gearshift.scheduler.state import RUNNING_STATES
from gearshift.scheduler.store import JobRecord, WorkerRecord
from gearshift.scheduler.tenants import Quotas
from gearshift.v1 import common_pb2, scheduler_pb2

S = scheduler_pb2
_RUNNING = frozenset(RUNNING_STATES)
_state = attrgetter("state")
_submitted_at = attrgetter("submitted_at")
_tenant = attrgetter("tenant")
_devices = attrgetter("devices")


@dataclass(frozen=True)
class _Placed:
    """What the view keeps of one placement while it stands."""

    placement: common_pb2.Placement  # the object: a new placement is a new one
    tenant: str
    allocation: bytes  # a ClusterState holding only this job's Allocation, serialized
    devices: tuple[tuple[str, str], ...]  # (tenant, accelerator type), one per process


class ClusterView:
    """Builds the message; keeps each running placement's part from call to call. A
    placement read afresh each call (its processes walked, its message copied) cost
    16 of 28 ms at 1,000 workers and 2,600 running jobs of 8,000."""

    def __init__(self) -> None:
        self._placed: dict[str, _Placed] = {}

    def build(
        self,
        workers: list[WorkerRecord],
        jobs: list[JobRecord],
        out: S.ClusterState,
        *,
        queued: Mapping[str, int],
        quotas: Quotas,
        admitted: Mapping[str, Admission],
    ) -> S.ClusterState:
        """`queued`: each tenant's queued jobs (SchedulerState.queued's counts), so that
        the tenants' counts walk the running jobs only, not every job kept (a walk over
        8,000 jobs was 4 of GetClusterState's 7 ms)."""
        for worker in sorted(workers, key=lambda w: w.worker_id):
            out.workers.add(
                worker_id=worker.worker_id,
                address=worker.address,
                hostname=worker.hostname,
                devices=worker.devices,
                alive=worker.alive,
                last_heartbeat_at=worker.last_heartbeat_at,
                cpu_cores=worker.cpu_cores,
                memory_bytes=worker.memory_bytes,
                degraded=bool(worker.degraded_reason),
                degraded_reason=worker.degraded_reason,
            )
        # The running jobs picked in C (compress over the jobs' states): a Python step per
        # job was 0.9 ms of 6 at 8,000 jobs. A running state is not a terminal one.
        running = sorted(
            compress(jobs, map(_RUNNING.__contains__, map(_state, jobs))), key=_submitted_at
        )
        every = self._placements(running)
        parts = [part for part in every if part.devices]  # placed ones
        # Serialized messages concatenated are one message with their repeated fields joined
        out.MergeFromString(b"".join(part.allocation for part in parts))
        guaranteed = (
            [job for job in jobs if job.job_id in admitted and not job.terminal] if admitted else []
        )
        _tenants(out, queued, every, parts, guaranteed, quotas=quotas, admitted=admitted)
        return out

    def _placements(self, running: list[JobRecord]) -> list[_Placed]:
        """Each running job's part in their order, built when its placement is new; what
        the last call kept of jobs no longer running is dropped."""
        kept = self._placed
        placed: dict[str, _Placed] = {}
        for job in running:
            placement = job.placement
            part = kept.get(job.job_id)
            if part is None or part.placement is not placement:
                part = _placed(job, placement)
            placed[job.job_id] = part
        self._placed = placed
        return list(placed.values())


def _placed(job: JobRecord, placement: common_pb2.Placement) -> _Placed:
    allocation = S.Allocation(job_id=job.job_id, job_name=job.spec.name, placement=placement)
    tenant = job.spec.tenant
    return _Placed(
        placement,
        tenant,
        S.ClusterState(allocations=[allocation]).SerializeToString(),
        tuple((tenant, p.accelerator_type) for p in placement.processes),
    )


def _tenants(
    out: S.ClusterState,
    queued: Mapping[str, int],
    running: list[_Placed],
    placed: list[_Placed],
    guaranteed: list[JobRecord],
    *,
    quotas: Quotas,
    admitted: Mapping[str, Admission],
) -> None:
    """Each tenant's quota and use: counted in C (Counter over iterables), a message per
    tenant at the end. A message per job, then a Python step per job, cost GetClusterState
    most of its time (bench/load.py: 10 of 18 ms at 8,000 jobs). A job in a running state
    without devices counts as queued. `running`: every running job's part, `placed`: those
    with devices."""
    rows: dict[str, S.TenantState] = {
        name: S.TenantState(tenant=name, quota=quota) for name, quota in quotas.by_tenant.items()
    }
    open_jobs = Counter(map(_tenant, running))
    open_jobs.update(queued)
    running_jobs = Counter(map(_tenant, placed))
    devices = Counter(chain.from_iterable(map(_devices, placed)))
    for job in guaranteed:
        row = _row(rows, job.spec.tenant)
        a = admitted[job.job_id]
        row.guaranteed_jobs += 1
        row.guaranteed_devices[a.accelerator_type] += a.devices
        if a.rubick is not None:
            row.rubick_admissions.append(rubick_admission(a.rubick))
    for tenant, count in open_jobs.items():
        row = _row(rows, tenant)
        row.running_jobs = running_jobs[tenant]
        row.queued_jobs = count - running_jobs[tenant]
    for (tenant, kind), count in devices.items():
        rows[tenant].devices[kind] = count
    out.tenants.extend(rows[name] for name in sorted(rows))


def _row(rows: dict[str, S.TenantState], tenant: str) -> S.TenantState:
    if tenant not in rows:
        rows[tenant] = S.TenantState(tenant=tenant)
    return rows[tenant]


def rubick_admission(a: RubickAdmission) -> S.RubickAdmission:
    """The message of a Rubick admission."""
    return S.RubickAdmission(
        job_id=a.job_id,
        accelerator_type=a.accelerator_type,
        requested_devices=a.requested_gpus,
        devices=a.gpus,
        requested_plan=a.requested_plan,
        plan=a.plan,
        requested_iterations_per_second=a.requested_rate,
        predicted_iterations_per_second=a.predicted_rate,
        shrunk_jobs=a.shrunk,
        preempted_jobs=a.preempted,
    )
