"""GetClusterState's message: every worker, every running job's placement, each tenant's
quota and use. Built outside the scheduler's lock from the records taken under it (a
record's fields are read whole one at a time, and a placement is replaced, never changed:
records.JobRecord.placement)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import chain, compress
from operator import attrgetter

from gearshift.scheduler.plugins.rubick.guarantees import Admission
from gearshift.scheduler.plugins.rubick.rubick_policy import RubickAdmission
from gearshift.scheduler.plugins.rubick.tenants import Quotas
from gearshift.scheduler.state.records import JobRecord, WorkerRecord
from gearshift.scheduler.state.state import RUNNING_STATES
from gearshift.v1 import common_pb2, scheduler_pb2

S = scheduler_pb2
_RUNNING = frozenset(RUNNING_STATES)
_state = attrgetter("state")
_submitted_at = attrgetter("submitted_at")
_tenant = attrgetter("tenant")
_devices = attrgetter("devices")
_placement = attrgetter("placement")
_job_id = attrgetter("job_id")
_allocation = attrgetter("allocation")
_worker_id = attrgetter("worker_id")
_heartbeat_at = attrgetter("last_heartbeat_at")
# What a worker's message shows but its heartbeat time (`devices`: a new list on registering)
_worker_row = attrgetter(
    "worker_id",
    "address",
    "hostname",
    "devices",
    "alive",
    "cpu_cores",
    "memory_bytes",
    "degraded_reason",
)


@dataclass(frozen=True)
class _Placed:
    """What the view keeps of one placement while it stands."""

    placement: common_pb2.Placement  # the object: a new placement is a new one
    tenant: str
    allocation: bytes  # a ClusterState holding only this job's Allocation, serialized
    devices: tuple[tuple[str, str], ...]  # (tenant, accelerator type), one per process


class ClusterView:
    """Builds the message from a template kept from call to call: the workers' and the
    running placements' parts, changed where their records did, then copied whole in one
    C call. Built afresh each call (a message per worker, the placements' parts joined and
    parsed, the tenants counted over every running job) it took 5.5 ms of the interpreter
    at 1,000 workers and 1,700 running jobs of 8,000, most of it in small slices that each
    waited for the interpreter again under load (bench/load.py: p99 90-116 ms)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the template is changed in place
        self._template = S.ClusterState()  # the workers and allocations of the last call
        self._worker_rows: list[tuple[object, ...]] = []  # what each worker's message shows
        self._worker_messages: list[S.WorkerInfo] = []  # the template's, in its order
        self._placed: dict[str, _Placed] = {}  # each running job's part, by job id
        self._ids: dict[str, int] = {}  # each running job's placement's id, by job id
        self._counts: tuple[Counter[str], Counter[str], Counter[tuple[str, str]]] = (
            Counter(),
            Counter(),
            Counter(),
        )

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
        # The running jobs picked in C (compress over the jobs' states): a Python step per
        # job was 0.9 ms of 6 at 8,000 jobs. A running state is not a terminal one.
        running = sorted(
            compress(jobs, map(_RUNNING.__contains__, map(_state, jobs))), key=_submitted_at
        )
        header, out = out, S.ClusterState()
        with self._lock:
            self._update_workers(sorted(workers, key=_worker_id))
            self._update_allocations(running)
            out.CopyFrom(self._template)  # one C call (a merge into `header` took twice as long)
            open_jobs, running_jobs, devices = self._counts
        out.MergeFrom(header)
        guaranteed = (
            [job for job in jobs if job.job_id in admitted and not job.terminal] if admitted else []
        )
        _tenants(
            out,
            open_jobs + Counter(queued),
            running_jobs,
            devices,
            guaranteed,
            quotas=quotas,
            admitted=admitted,
        )
        return out

    def _update_workers(self, workers: list[WorkerRecord]) -> None:
        """The template's workers: built again when any worker's row changed (a worker
        registered, lost or degraded), else only their heartbeat times set."""
        rows = list(map(_worker_row, workers))
        if rows != self._worker_rows:
            template = self._template
            del template.workers[:]
            for worker in workers:
                template.workers.add(
                    worker_id=worker.worker_id,
                    address=worker.address,
                    hostname=worker.hostname,
                    devices=worker.devices,
                    alive=worker.alive,
                    cpu_cores=worker.cpu_cores,
                    memory_bytes=worker.memory_bytes,
                    degraded=bool(worker.degraded_reason),
                    degraded_reason=worker.degraded_reason,
                )
            self._worker_rows = rows
            self._worker_messages = list(template.workers)
        for message, at in zip(self._worker_messages, map(_heartbeat_at, workers), strict=True):
            message.last_heartbeat_at = at

    def _update_allocations(self, running: list[JobRecord]) -> None:
        """The template's allocations and the tenants' counts of running jobs: the parts
        and counts of the jobs whose placement changed (a placement is replaced, never
        changed: the same object is the same allocation), the allocations joined again
        when one did (the join, then the parse, in C). A round changes a few placements
        of thousands: worked out afresh, the call after it took 4.4 ms (0.7 with this)."""
        keys = list(map(_job_id, running))
        placements = list(map(_placement, running))
        ids = dict(zip(keys, map(id, placements), strict=True))
        if ids == self._ids:
            return
        kept = self._placed
        gone = [kept.pop(job_id) for job_id in self._ids.keys() - ids.keys()]
        came = []
        jobs = dict(zip(keys, zip(running, placements, strict=True), strict=True))
        for job_id, _ in ids.items() - self._ids.items():  # new or replaced placements
            if job_id in kept:
                gone.append(kept[job_id])
            # built from the placement whose id was taken: the part holds it, so that its
            # id cannot be another object's while it is compared
            kept[job_id] = part = _placed(*jobs[job_id])
            came.append(part)
        self._ids = ids
        open_jobs, running_jobs, devices = self._counts
        open_jobs.update(map(_tenant, came))
        open_jobs.subtract(map(_tenant, gone))
        running_jobs.update(map(_tenant, filter(_devices, came)))
        running_jobs.subtract(map(_tenant, filter(_devices, gone)))
        devices.update(chain.from_iterable(map(_devices, came)))
        devices.subtract(chain.from_iterable(map(_devices, gone)))
        self._counts = (+open_jobs, +running_jobs, +devices)  # without the zeros
        parts = list(map(kept.__getitem__, keys))
        template = self._template
        del template.allocations[:]
        # Serialized messages concatenated are one message with their repeated fields joined
        template.MergeFromString(b"".join(map(_allocation, filter(_devices, parts))))


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
    open_jobs: Counter[str],
    running_jobs: Counter[str],
    devices: Counter[tuple[str, str]],
    guaranteed: list[JobRecord],
    *,
    quotas: Quotas,
    admitted: Mapping[str, Admission],
) -> None:
    """Each tenant's quota and use, a message per tenant from counts made in C (a message
    per job, then a Python step per job, cost GetClusterState most of its time: 10 of
    18 ms at 8,000 jobs). `open_jobs`: queued or running; `running_jobs`: those with
    devices (a job in a running state without devices counts as queued); `devices`:
    per (tenant, accelerator type)."""
    rows: dict[str, S.TenantState] = {
        name: S.TenantState(tenant=name, quota=quota) for name, quota in quotas.by_tenant.items()
    }
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
