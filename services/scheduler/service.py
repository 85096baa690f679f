"""The scheduler's domain: jobs, workers, tasks and rounds, behind a storage interface.

Job lifecycle (JobState, with the JobEventType that records each change):

    QUEUED --STARTED--> RUNNING --RESCALING--> RESCALING --RESCALED--> RUNNING
      ^                   |  |                                      (new placement)
      |   PREEMPTED,      |  +--SUCCEEDED / FAILED--> SUCCEEDED / FAILED
      +---WORKER_LOST-----+
    any non-final state --CANCELLED--> CANCELLED

SUBMITTED opens every log; PROGRESS (throttled) and CHECKPOINTED leave the state
unchanged. A job runs as one task per worker of its placement (its processes
there). A round (every `round_seconds`, and at once after an arrival,
completion or worker change when the policy is elastic or the cluster idle):

1. workers silent for `heartbeat_timeout` are declared lost: their tasks are
   dropped, the job's other tasks are stopped, and the job is queued again
   (WORKER_LOST) to be placed elsewhere;
2. the policy decides every job's devices - Gavel's round mechanism for the
   rigid policies (a job's scale factor is its max_devices), or the elastic
   EasyScale / YARN-CS allocator - and the EST split is asked of the Brain
   (PlanEsts) or computed locally;
3. a job whose placement is unchanged keeps running: its leases are renewed,
   nothing restarts. Otherwise its tasks are stopped with a checkpoint
   (StopTask(checkpoint=true); processes see stop_requested in
   ReportProgress) and started on the new placement (StartTask(resume=true)).

Worker daemons register, heartbeat with their tasks' states, renew leases and
report TaskFinished; training processes report progress. Everything a restart
needs is in the Store: jobs with their last state and placement, events,
workers, open tasks. A restarted scheduler reloads them, gives every worker a
fresh heartbeat timeout, and carries on.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from google.protobuf.message import Message

from gearshift.common.errors import NotFoundError, PreconditionError, rpc_code, rpc_details
from gearshift.common.estplan import plan_on
from gearshift.scheduler.brain import BrainAdvisor
from gearshift.scheduler.datasets import DatasetKeeper
from gearshift.scheduler.elastic import (
    ELASTIC_POLICIES,
    ElasticJob,
    ElasticPolicy,
    make_elastic_policy,
)
from gearshift.scheduler.mechanism import Device, JobView, RoundScheduler, consolidate
from gearshift.scheduler.placement import (
    assign_ests,
    build_placement,
    count_by_type,
    local_ranks,
    placement_devices,
    same_devices,
    workers_of,
)
from gearshift.scheduler.policies import make_policy
from gearshift.scheduler.policies.base import EntityPolicy
from gearshift.scheduler.store import EventRecord, JobRecord, Store, TaskRecord, WorkerRecord
from gearshift.scheduler.workers import WorkerAgents
from gearshift.v1 import brain_pb2, common_pb2, scheduler_pb2, worker_pb2

log = logging.getLogger("gearshift.scheduler")
T = TypeVar("T")
M = TypeVar("M", bound=Message)

S = common_pb2
E = scheduler_pb2
# Job events the Brain records (JobEventType -> brain JobEventKind).
BRAIN_EVENTS: dict[int, int] = {
    E.JOB_EVENT_TYPE_SUBMITTED: brain_pb2.JOB_EVENT_KIND_SUBMITTED,
    E.JOB_EVENT_TYPE_STARTED: brain_pb2.JOB_EVENT_KIND_STARTED,
    E.JOB_EVENT_TYPE_SUCCEEDED: brain_pb2.JOB_EVENT_KIND_SUCCEEDED,
    E.JOB_EVENT_TYPE_FAILED: brain_pb2.JOB_EVENT_KIND_FAILED,
    E.JOB_EVENT_TYPE_CANCELLED: brain_pb2.JOB_EVENT_KIND_CANCELLED,
}
ENDED_TASK_STATES = (S.TASK_STATE_CHECKPOINTED, S.TASK_STATE_COMPLETED, S.TASK_STATE_FAILED)
# Rendezvous ports handed out per worker, from --rendezvous-port-base on, in turn.
RENDEZVOUS_PORTS = 100
# A training process's exit code for bad input (the runtime's launcher): no restart can help.
EXIT_BAD_INPUT = 2
# StartTask errors that mean the worker is gone (or unreachable) rather than the request bad.
UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
RUNNING_STATES = (S.JOB_STATE_RUNNING, S.JOB_STATE_RESCALING)


@dataclass(frozen=True)
class SchedulerSettings:
    """How the scheduler behaves (daemon flags)."""

    policy: str = "easyscale"
    round_seconds: float = 360.0
    heartbeat_interval: float = 5.0
    heartbeat_timeout: float = 30.0
    min_recompute_seconds: float = 0.0
    checkpoint_root: str = ".gearshift/checkpoints"
    advertise_address: str = ""
    brain_address: str = ""
    shard_manager_address: str = ""
    stop_timeout_seconds: float = 60.0
    rendezvous_port_base: int = 29500
    seed: int = 0
    progress_event_seconds: float = 10.0
    max_restarts: int = 3
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    tenant_policies: Mapping[str, EntityPolicy] = field(default_factory=dict)

    @property
    def elastic(self) -> bool:
        return self.policy in ELASTIC_POLICIES

    @property
    def lease_seconds(self) -> float:
        return max(2 * self.round_seconds, 10.0)


@dataclass
class _Change:
    """What a round does to one job: stop its tasks, then maybe start a new placement."""

    job_id: str
    stop: list[TaskRecord]
    start: list[tuple[Device, int]] | None
    kind: str  # "start", "rescale" or "preempt"


@dataclass
class RoundReport:
    """What one round did (for logs and tests)."""

    round: int
    started: list[str] = field(default_factory=list)
    rescaled: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    renewed: list[str] = field(default_factory=list)
    lost_workers: list[str] = field(default_factory=list)


def total_steps(spec: common_pb2.JobSpec) -> int:
    """Global steps the job will run: total_steps, or epochs x steps per epoch."""
    if spec.HasField("total_steps"):
        return spec.total_steps
    per_epoch = math.ceil(spec.dataset.size / max(spec.global_batch_size, 1))
    return spec.epochs * max(per_epoch, 1)


def new_job_id() -> str:
    return "job-" + uuid.uuid4().hex[:12]


class Scheduler:
    """The scheduler's state and operations; the gRPC servicers are thin wrappers around it."""

    def __init__(
        self,
        store: Store,
        settings: SchedulerSettings,
        *,
        agents: WorkerAgents | None = None,
        brain: BrainAdvisor | None = None,
        datasets: DatasetKeeper | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.settings = settings
        self.agents = agents or WorkerAgents()
        self.brain = brain or BrainAdvisor()
        self.datasets = datasets or DatasetKeeper()
        self.clock = clock
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._round_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="sched-calls")
        self._jobs: dict[str, JobRecord] = {}
        self._workers: dict[str, WorkerRecord] = {}
        self._tasks: dict[str, TaskRecord] = {}
        self._stopping: set[str] = set()
        self._estimates: dict[str, dict[str, float]] = {}
        self._last_progress_event: dict[str, float] = {}
        self._last_port: dict[str, int] = {}  # worker -> last rendezvous port handed out
        self._round = 0
        self._last_round_at = 0.0
        self._elastic: ElasticPolicy | None = None
        self._mechanism: RoundScheduler | None = None
        if settings.elastic:
            self._elastic = make_elastic_policy(settings.policy)
        else:
            self._mechanism = RoundScheduler(
                make_policy(settings.policy, seed=settings.seed),
                round_seconds=settings.round_seconds,
                min_recompute_seconds=settings.min_recompute_seconds,
                seed=settings.seed,
                entity_weights=settings.tenant_weights,
                entity_policies=settings.tenant_policies,
            )

    # Lifecycle of the service --------------------------------------------------
    def recover(self) -> None:
        """Reload every unfinished job, the workers and open tasks from the store."""
        now = self.clock()
        with self._lock:
            for job in self.store.active_jobs():
                if job.state == S.JOB_STATE_RESCALING:
                    job.state = S.JOB_STATE_RUNNING  # the next round finishes the move
                self._jobs[job.job_id] = job
            for worker in self.store.workers():
                worker.last_heartbeat_at = max(worker.last_heartbeat_at, now)
                self._workers[worker.worker_id] = worker
            for task in self.store.open_tasks():
                if task.job_id in self._jobs:
                    self._tasks[task.task_id] = task
            self._round = int(self.store.get_state("round") or 0)
            if self._mechanism is not None:
                for job in self._jobs.values():
                    self._mechanism.add_job(self._job_view(job), self._types())
        log.info(
            "recovered",
            extra={"jobs": len(self._jobs), "workers": len(self._workers), "round": self._round},
        )

    def start(self) -> None:
        """Start the round loop in a background thread."""
        self._thread = threading.Thread(target=self._loop, name="sched-rounds", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._pool.shutdown(wait=True, cancel_futures=False)
        self.agents.close()
        self.brain.close()
        self.datasets.close()
        with self._changed:
            self._changed.notify_all()

    def wake(self) -> None:
        """Ask for a round soon (an arrival, completion or worker change)."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            due = self._last_round_at + self.settings.round_seconds
            timeout = max(0.0, due - self.clock())
            woken = self._wake.wait(timeout=min(timeout, self.settings.heartbeat_interval))
            if self._stop.is_set():
                return
            self._wake.clear()
            now = self.clock()
            if now >= due or (woken and self._early_round_allowed()):
                try:
                    self.run_round()
                except Exception:  # a round must never kill the loop
                    log.exception("round failed")
            else:
                with self._lock:
                    lost = self._detect_lost(now)
                if lost:
                    self.run_round()

    def _early_round_allowed(self) -> bool:
        """Elastic policies re-plan on events; Gavel's rounds wait for the boundary unless
        nothing runs (then a new job need not wait for the round to end)."""
        if self.settings.elastic:
            return True
        with self._lock:
            return not any(j.state in RUNNING_STATES for j in self._jobs.values())

    # Jobs API -------------------------------------------------------------------
    def submit(self, spec: common_pb2.JobSpec, key: str) -> tuple[JobRecord, bool]:
        """Create a job (spec already validated and defaulted); same key -> same job."""
        with self._lock:
            if key:
                existing = self.store.find_job_by_key(key)
                if existing is not None:
                    return existing, False
            now = self.clock()
            job = JobRecord(
                job_id=new_job_id(),
                spec=spec,
                state=S.JOB_STATE_QUEUED,
                submitted_at=now,
                idempotency_key=key or None,
                last_sequence=1,
            )
            job.progress.total_steps = total_steps(spec)
            event = EventRecord(job.job_id, 1, now, E.JOB_EVENT_TYPE_SUBMITTED, job.state, "")
            try:
                self.store.create_job(job, event)
            except Exception:
                if key:
                    existing = self.store.find_job_by_key(key)
                    if existing is not None:  # a concurrent call with the same key won
                        return existing, False
                raise
            self._jobs[job.job_id] = job
            if self._mechanism is not None:
                self._mechanism.add_job(self._job_view(job), self._types())
            self._changed.notify_all()
            self._tell_brain(event, job)
        log.info("job submitted", extra={"job_id": job.job_id, "job_name": spec.name})
        self.wake()
        return job, True

    def get(self, job_id: str) -> JobRecord:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                return job
        stored = self.store.get_job(job_id)
        if stored is None:
            raise NotFoundError("job", job_id)
        return stored

    def list_jobs(
        self,
        *,
        tenant: str,
        states: Sequence[int],
        name_prefix: str,
        limit: int,
        after: tuple[float, str] | None,
    ) -> list[JobRecord]:
        return self.store.list_jobs(
            tenant=tenant, states=states, name_prefix=name_prefix, limit=limit, after=after
        )

    def cancel(self, job_id: str, reason: str) -> JobRecord:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                stored = self.store.get_job(job_id)
                if stored is None:
                    raise NotFoundError("job", job_id)
                raise PreconditionError(
                    f"job {job_id!r} already ended ({S.JobState.Name(stored.state)})"  # type: ignore[arg-type]
                )
            message = reason or "cancelled by a user"
            tasks = self._open_tasks(job_id)
            self._finish(job, S.JOB_STATE_CANCELLED, E.JOB_EVENT_TYPE_CANCELLED, message)
        self._kill(tasks, "job cancelled")
        self.wake()
        return job

    def watch(self, job_id: str, after: int, active: Callable[[], bool]) -> Iterator[EventRecord]:
        """Events after `after` until the job ends (and its last event is sent)."""
        self.get(job_id)  # NotFoundError for an unknown job
        sequence = after
        while active() and not self._stop.is_set():
            events = self.store.events_after(job_id, sequence)
            for event in events:
                sequence = event.sequence
                yield event
            if events:
                continue
            with self._changed:
                job = self._jobs.get(job_id)
                if job is None:  # ended: everything was committed before it left memory
                    final = self.store.get_job(job_id)
                    if final is None or final.last_sequence <= sequence:
                        return
                    continue
                if job.last_sequence <= sequence:
                    self._changed.wait(timeout=1.0)

    def cluster_state(self) -> E.ClusterState:
        with self._lock:
            state = E.ClusterState(
                round=self._round,
                round_seconds=self.settings.round_seconds,
                policy=self.settings.policy,
            )
            for worker in sorted(self._workers.values(), key=lambda w: w.worker_id):
                state.workers.add(
                    worker_id=worker.worker_id,
                    address=worker.address,
                    hostname=worker.hostname,
                    devices=worker.devices,
                    alive=worker.alive,
                    last_heartbeat_at=worker.last_heartbeat_at,
                )
            for job in sorted(self._jobs.values(), key=lambda j: j.submitted_at):
                if job.state in RUNNING_STATES and job.placement.processes:
                    state.allocations.add(
                        job_id=job.job_id, job_name=job.spec.name, placement=job.placement
                    )
            return state

    # Workers API ------------------------------------------------------------------
    def register_worker(
        self,
        worker_id: str,
        address: str,
        hostname: str,
        devices: Sequence[common_pb2.DeviceGroup],
        tasks: Sequence[common_pb2.TaskStatus],
    ) -> WorkerRecord:
        now = self.clock()
        with self._lock:
            worker = WorkerRecord(
                worker_id=worker_id or "worker-" + uuid.uuid4().hex[:8],
                address=address,
                hostname=hostname,
                devices=list(devices),
                alive=True,
                registered_at=now,
                last_heartbeat_at=now,
            )
            previous = self._workers.get(worker.worker_id)
            if previous is not None:
                worker.registered_at = previous.registered_at
            self._workers[worker.worker_id] = worker
            self.store.save_worker(worker)
            if self._mechanism is not None:
                self._mechanism.workers_changed()
        log.info(
            "worker registered",
            extra={"worker_id": worker.worker_id, "address": address, "devices": len(devices)},
        )
        self._task_reports(worker.worker_id, tasks)
        self.wake()
        return worker

    def heartbeat(self, worker_id: str, tasks: Sequence[common_pb2.TaskStatus]) -> bool:
        """Record liveness; True when the worker must register again."""
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None or not worker.alive:
                return True
            worker.last_heartbeat_at = self.clock()
        self._task_reports(worker_id, tasks)
        return False

    def renew_lease(self, worker_id: str, task_id: str) -> tuple[bool, common_pb2.Lease]:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None or task.worker_id != worker_id:
                return False, common_pb2.Lease(task_id=task_id)
            job = self._jobs.get(task.job_id)
            renewed = (
                job is not None
                and job.state == S.JOB_STATE_RUNNING
                and task_id not in self._stopping
            )
            if renewed:
                task.lease_expires_at = self.clock() + self.settings.lease_seconds
            return renewed, common_pb2.Lease(task_id=task_id, expires_at=task.lease_expires_at)

    def report_progress(self, job_id: str, task_id: str, progress: common_pb2.JobProgress) -> bool:
        """Record progress; True when the job must checkpoint and stop (rescale/preemption)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                if self.store.get_job(job_id) is None:
                    raise NotFoundError("job", job_id)
                return True  # ended: stop
            job.progress.CopyFrom(progress)
            now = self.clock()
            last = self._last_progress_event.get(job_id, 0.0)
            if now - last >= self.settings.progress_event_seconds:
                self._last_progress_event[job_id] = now
                self._record(job, E.JOB_EVENT_TYPE_PROGRESS, "")
            return task_id in self._stopping

    def task_finished(self, worker_id: str, status: common_pb2.TaskStatus) -> None:
        self._task_reports(worker_id, [status])

    # Rounds ---------------------------------------------------------------------
    def run_round(self) -> RoundReport:
        """One round: detect lost workers, decide placements, apply the changes."""
        with self._round_lock:
            now = self.clock()
            with self._lock:
                self._round += 1
                report = RoundReport(self._round)
                report.lost_workers = self._detect_lost(now)
                desired = self._desired(now)
                changes = self._diff(desired, report)
                self.store.set_state("round", str(self._round))
                self._last_round_at = now
            # Every stop before any start: a job must not be started on devices that another
            # job's processes still hold (they leave only once they have checkpointed).
            stops = [self._pool.submit(self._apply_stop, change) for change in changes]
            going = [change for change, done in zip(changes, stops, strict=True) if done.result()]
            starts = [self._pool.submit(self._apply_start, change) for change in going]
            for future in starts:
                future.result()
            if report.started or report.rescaled or report.preempted:
                log.info(
                    "round",
                    extra={
                        "round": report.round,
                        "started": report.started,
                        "rescaled": report.rescaled,
                        "preempted": report.preempted,
                        "renewed": len(report.renewed),
                    },
                )
            return report

    def _types(self) -> list[str]:
        return sorted({g.accelerator_type for w in self._workers.values() for g in w.devices})

    def _devices(self) -> list[Device]:
        """Every device of every live worker; indexes count across a worker's groups."""
        out: list[Device] = []
        for worker in sorted(self._workers.values(), key=lambda w: w.worker_id):
            if not worker.alive:
                continue
            index = 0
            for group in worker.devices:
                for _ in range(group.count):
                    out.append(Device(worker.worker_id, index, group.accelerator_type))
                    index += 1
        return out

    def _allowed(self, job: JobRecord, kind: str) -> bool:
        return not job.spec.accelerator_types or kind in job.spec.accelerator_types

    def _estimate(self, job: JobRecord, types: Sequence[str]) -> dict[str, float]:
        cached = self._estimates.setdefault(job.job_id, {})
        count = max(job.spec.elastic.max_devices, 1)
        for kind in types:
            if kind not in cached:
                cached[kind] = self.brain.throughput(job.job_id, job.spec.model_type, kind, count)
        return {t: (cached[t] if self._allowed(job, t) else 0.0) for t in types}

    def _job_view(self, job: JobRecord) -> JobView:
        steps_left = max(job.progress.total_steps - job.progress.step, 1)
        deadline = (
            job.submitted_at + job.spec.slo.deadline_seconds
            if job.spec.HasField("slo")
            else math.inf
        )
        return JobView(
            job_id=job.job_id,
            scale_factor=max(job.spec.elastic.max_devices, 1),
            throughputs=self._estimate(job, self._types()),
            steps_remaining=steps_left,
            arrival_time=job.submitted_at,
            priority_weight=job.spec.priority_weight or 1.0,
            deadline=deadline,
            entity=job.spec.tenant,
        )

    def _desired(self, now: float) -> dict[str, list[tuple[Device, int]]]:
        devices = self._devices()
        capacity = count_by_type(devices)
        if not capacity:
            return {}
        jobs = [
            j
            for j in sorted(self._jobs.values(), key=lambda j: (j.submitted_at, j.job_id))
            if not j.terminal
        ]
        if self._elastic is not None:
            return self._desired_elastic(jobs, devices, capacity)
        return self._desired_rounds(jobs, devices, capacity, now)

    def _desired_rounds(
        self,
        jobs: Sequence[JobRecord],
        devices: Sequence[Device],
        capacity: dict[str, int],
        now: float,
    ) -> dict[str, list[tuple[Device, int]]]:
        mechanism = self._mechanism
        assert mechanism is not None
        for job in jobs:  # account the last round: Gavel's time received per type
            if job.state in RUNNING_STATES and job.placement.processes:
                kind = job.placement.processes[0].accelerator_type
                elapsed = min(now - self._last_round_at, self.settings.round_seconds)
                if self._last_round_at > 0 and elapsed > 0:
                    mechanism.record((job.job_id,), kind, elapsed)
            view = mechanism.jobs.get(job.job_id)
            if view is not None:
                view.steps_remaining = max(job.progress.total_steps - job.progress.step, 1)
        plan = mechanism.plan(capacity, devices, now)
        out: dict[str, list[tuple[Device, int]]] = {}
        by_id = {j.job_id: j for j in jobs}
        for combo, placed in plan.placements.items():
            chosen = by_id.get(combo[0])
            if chosen is None:
                continue
            current = {d: i for i, d in enumerate(placement_devices(chosen.placement))}
            ordered = sorted(placed, key=lambda d: (current.get(d, len(current)), d))
            kind = ordered[0].worker_type
            split = plan_on(chosen.spec.num_ests, {kind: len(ordered)}, {kind: 1.0})
            out[chosen.job_id] = assign_ests(
                ordered, {p.accelerator_type: list(p.ests_per_device) for p in split.placements}
            )
        return out

    def _capability(self, job: JobRecord, types: Sequence[str]) -> dict[str, float]:
        """One EST's mini-batches/s on one device of each type: N x steps/s on one device."""
        out: dict[str, float] = {}
        cached = self._estimates.setdefault(job.job_id + "#1", {})
        for kind in types:
            if not self._allowed(job, kind):
                out[kind] = 0.0
                continue
            if kind not in cached:
                cached[kind] = (
                    self.brain.throughput(job.job_id, job.spec.model_type, kind, 1)
                    * job.spec.num_ests
                )
            out[kind] = cached[kind]
        return out

    def _desired_elastic(
        self, jobs: Sequence[JobRecord], devices: Sequence[Device], capacity: dict[str, int]
    ) -> dict[str, list[tuple[Device, int]]]:
        policy = self._elastic
        assert policy is not None
        types = sorted(capacity)
        views = [
            ElasticJob(
                job_id=job.job_id,
                num_ests=job.spec.num_ests,
                min_devices=max(job.spec.elastic.min_devices, 1),
                max_devices=max(job.spec.elastic.max_devices, 1),
                capability=self._capability(job, types),
                arrival_time=job.submitted_at,
            )
            for job in jobs
        ]
        alive = set(devices)
        current = {
            job.job_id: count_by_type(d for d in placement_devices(job.placement) if d in alive)
            for job in jobs
            if job.state in RUNNING_STATES
        }
        decision = policy.allocate(views, capacity, current)
        pools: dict[str, dict[str, list[Device]]] = {}
        for device in sorted(devices):
            pools.setdefault(device.worker_type, {}).setdefault(device.worker_id, []).append(device)
        out: dict[str, list[tuple[Device, int]]] = {}
        by_id = {job.job_id: job for job in jobs}
        # Jobs that keep exactly their devices keep their placement (lease renewal).
        chosen: dict[str, list[Device]] = {}
        for job_id, counts in decision.items():
            job = by_id[job_id]
            held = placement_devices(job.placement) if job.state in RUNNING_STATES else []
            if held and all(d in alive for d in held) and count_by_type(held) == counts:
                chosen[job_id] = held
                for d in held:
                    pools[d.worker_type][d.worker_id].remove(d)
        for job_id, counts in decision.items():
            if job_id in chosen:
                continue
            job = by_id[job_id]
            held = [d for d in placement_devices(job.placement) if d in alive]
            picked: list[Device] = []
            for kind, count in sorted(counts.items()):
                pool = pools.get(kind, {})
                mine = [d for d in held if d.worker_type == kind and d in pool.get(d.worker_id, [])]
                take = mine[:count]
                for d in take:
                    pool[d.worker_id].remove(d)
                rest = consolidate({w: v for w, v in pool.items() if v}, count - len(take))
                if rest is None:
                    rest = ()
                for d in rest:
                    pool[d.worker_id].remove(d)
                picked.extend([*take, *rest])
            chosen[job_id] = picked
        for job_id, picked in chosen.items():
            job = by_id[job_id]
            if not picked:
                continue
            if job.state in RUNNING_STATES and picked == placement_devices(job.placement):
                out[job_id] = [
                    (d, len(p.est_ids))
                    for d, p in zip(
                        picked, sorted(job.placement.processes, key=lambda p: p.rank), strict=True
                    )
                ]
                continue
            split = self.brain.split(
                job_id,
                job.spec.num_ests,
                count_by_type(picked),
                self._capability(job, types),
            )
            out[job_id] = assign_ests(picked, split.ests_per_device)
        return out

    def _diff(
        self, desired: dict[str, list[tuple[Device, int]]], report: RoundReport
    ) -> list[_Change]:
        changes: list[_Change] = []
        now = self.clock()
        for job in list(self._jobs.values()):
            if job.terminal:
                continue
            want = desired.get(job.job_id)
            running = job.state in RUNNING_STATES
            if running and want and same_devices(build_placement(want), job.placement):
                report.renewed.append(job.job_id)
                for task in self._open_tasks(job.job_id):
                    task.lease_expires_at = now + self.settings.lease_seconds
                continue
            if running:
                stop = self._open_tasks(job.job_id)
                self._stopping.update(t.task_id for t in stop)
                if want:
                    job.state = S.JOB_STATE_RESCALING
                    self._record(job, E.JOB_EVENT_TYPE_RESCALING, "moving to a new placement")
                    changes.append(_Change(job.job_id, stop, want, "rescale"))
                    report.rescaled.append(job.job_id)
                else:
                    changes.append(_Change(job.job_id, stop, None, "preempt"))
                    report.preempted.append(job.job_id)
            elif want:
                changes.append(_Change(job.job_id, [], want, "start"))
                report.started.append(job.job_id)
        return changes

    # Applying a change (outside the lock; one thread per job) ----------------------
    def _apply_stop(self, change: _Change) -> bool:
        """Stop the job's tasks with a checkpoint; True when a start is to follow."""
        try:
            self._stop_tasks(change.stop, checkpoint=True, reason=change.kind)
            with self._lock:
                job = self._jobs.get(change.job_id)
                if job is None or job.terminal:
                    return False
                if change.stop:
                    paths = sorted({t.checkpoint_path for t in change.stop if t.checkpoint_path})
                    self._record(
                        job,
                        E.JOB_EVENT_TYPE_CHECKPOINTED,
                        f"checkpoint at step {job.progress.step}"
                        + (f" in {paths[0]}" if paths else ""),
                    )
                if change.start is None:
                    job.state = S.JOB_STATE_QUEUED
                    job.placement.Clear()
                    self._record(job, E.JOB_EVENT_TYPE_PREEMPTED, "devices given to other jobs")
                    return False
            return True
        except Exception:
            log.exception("stopping a job's tasks failed", extra={"job_id": change.job_id})
            self._abandon(change)
            return False

    def _apply_start(self, change: _Change) -> None:
        """Start the job's new placement."""
        assert change.start is not None
        try:
            with self._lock:
                job = self._jobs.get(change.job_id)
                if job is None or job.terminal:
                    return
                placement, tasks, requests = self._prepare_start(job, change.start)
            failures, unreachable = self._start_tasks(requests)
            with self._lock:
                job = self._jobs.get(change.job_id)
                if job is None or job.terminal:
                    self._kill(tasks, "job ended while starting")
                    return
                if failures:
                    for task in tasks:
                        task.state = S.TASK_STATE_FAILED
                        task.ended_at = self.clock()
                        self._tasks.pop(task.task_id, None)
                    self.store.save_tasks(tasks)
                    job.state = S.JOB_STATE_QUEUED
                    job.placement.Clear()
                    self._record(
                        job, E.JOB_EVENT_TYPE_PREEMPTED, "could not start: " + "; ".join(failures)
                    )
                    # A worker that cannot be reached is as good as lost: waiting for its
                    # heartbeats to time out would only retry the same placement. If it is
                    # alive after all, its next heartbeat makes it register again.
                    gone = [
                        w.worker_id
                        for w in self._workers.values()
                        if w.alive and w.address in unreachable
                    ]
                    if gone:
                        self._lose(gone, self.clock(), "unreachable")
                else:
                    rescaled = change.kind == "rescale"
                    job.placement.CopyFrom(placement)  # published once its tasks run
                    job.state = S.JOB_STATE_RUNNING
                    if not job.started_at:
                        job.started_at = self.clock()
                    if rescaled:
                        job.rescale_count += 1
                    self._record(
                        job,
                        E.JOB_EVENT_TYPE_RESCALED if rescaled else E.JOB_EVENT_TYPE_STARTED,
                        _processes(len(job.placement.processes))
                        + f" on {', '.join(workers_of(job.placement))}",
                        placement=True,
                    )
            if failures:
                self._kill(tasks, "start failed")
                self.wake()
        except Exception:
            log.exception("starting a job failed", extra={"job_id": change.job_id})
            self._abandon(change)

    def _abandon(self, change: _Change) -> None:
        """A change that broke half-way: a moving job goes back to the queue."""
        with self._lock:
            job = self._jobs.get(change.job_id)
            if job is not None and not job.terminal and job.state == S.JOB_STATE_RESCALING:
                job.state = S.JOB_STATE_QUEUED
                job.placement.Clear()
                self._record(job, E.JOB_EVENT_TYPE_PREEMPTED, "rescale failed")

    def _prepare_start(
        self, job: JobRecord, assignments: list[tuple[Device, int]]
    ) -> tuple[
        common_pb2.Placement, list[TaskRecord], list[tuple[str, worker_pb2.StartTaskRequest]]
    ]:
        """Tasks and StartTask requests of a new placement (saved before any is sent)."""
        resume = job.generation > 0
        job.generation += 1
        placement = build_placement(assignments)
        now = self.clock()
        rank0 = self._workers[placement.processes[0].worker_id]
        host = rank0.address.rpartition(":")[0] or "127.0.0.1"
        rendezvous = f"{host}:{self._free_port(rank0.worker_id)}"
        checkpoint_dir = os.path.join(self.settings.checkpoint_root, job.job_id)
        tasks: list[TaskRecord] = []
        requests: list[tuple[str, worker_pb2.StartTaskRequest]] = []
        for worker_id in workers_of(placement):
            task_id = f"{job.job_id}.g{job.generation}.{worker_id}"
            ranks = local_ranks(placement, worker_id)
            task = TaskRecord(
                task_id=task_id,
                job_id=job.job_id,
                worker_id=worker_id,
                generation=job.generation,
                state=S.TASK_STATE_STARTING,
                local_ranks=tuple(ranks),
                rendezvous_address=rendezvous,
                lease_expires_at=now + self.settings.lease_seconds,
                created_at=now,
                checkpoint_path=checkpoint_dir,
            )
            tasks.append(task)
            self._tasks[task_id] = task
            request = worker_pb2.StartTaskRequest(
                task_id=task_id,
                job_id=job.job_id,
                spec=job.spec,
                placement=placement,
                local_ranks=ranks,
                rendezvous_address=rendezvous,
                checkpoint_dir=checkpoint_dir,
                resume=resume,
                lease=common_pb2.Lease(task_id=task_id, expires_at=task.lease_expires_at),
                endpoints=worker_pb2.ServiceEndpoints(
                    scheduler=self.settings.advertise_address,
                    brain=self.settings.brain_address,
                    shard_manager=self.settings.shard_manager_address,
                ),
                dataset_id=job.job_id,
            )
            requests.append((self._workers[worker_id].address, request))
        self.store.save_tasks(tasks)
        self.store.save_job(job)
        return placement, tasks, requests

    def _free_port(self, worker_id: str) -> int:
        """A rendezvous port on the worker: not held by an open task there, and not the one
        handed out last (a port some other program holds fails the start; the restart then
        tries the next one instead of failing again)."""
        used = {
            int(t.rendezvous_address.rpartition(":")[2])
            for t in self._tasks.values()
            if t.rendezvous_address
            and t.local_ranks
            and 0 in t.local_ranks
            and t.worker_id == worker_id
        }
        base = self.settings.rendezvous_port_base
        span = RENDEZVOUS_PORTS
        start = self._last_port.get(worker_id, base - 1) + 1 - base
        for offset in range(span):
            port = base + (start + offset) % span
            if port not in used:
                self._last_port[worker_id] = port
                return port
        raise RuntimeError(f"no free rendezvous port on {worker_id} in {base}-{base + span - 1}")

    def _start_tasks(
        self, requests: list[tuple[str, worker_pb2.StartTaskRequest]]
    ) -> tuple[list[str], set[str]]:
        """(failures, addresses of workers that could not be reached)."""
        unreachable: set[str] = set()

        def call(item: tuple[str, worker_pb2.StartTaskRequest]) -> str:
            address, request = item
            try:
                self.agents.start(address, request)
            except grpc.RpcError as exc:
                if rpc_code(exc) in UNREACHABLE:
                    unreachable.add(address)
                return f"{request.task_id} on {address}: {rpc_details(exc)}"
            return ""

        return [r for r in self._pool_map(call, requests) if r], unreachable

    def _pool_map(self, fn: Callable[[T], str], items: Sequence[T]) -> list[str]:
        if len(items) <= 1:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(max_workers=min(8, len(items))) as pool:
            return list(pool.map(fn, items))

    def _stop_tasks(self, tasks: Sequence[TaskRecord], *, checkpoint: bool, reason: str) -> None:
        def call(task: TaskRecord) -> str:
            with self._lock:
                worker = self._workers.get(task.worker_id)
            status: common_pb2.TaskStatus | None = None
            if worker is not None and worker.alive:
                try:
                    status = self.agents.stop(
                        worker.address,
                        task.task_id,
                        checkpoint=checkpoint,
                        reason=reason,
                        timeout=self.settings.stop_timeout_seconds,
                    )
                except grpc.RpcError as exc:
                    log.warning(
                        "StopTask failed",
                        extra={"task_id": task.task_id, "error": rpc_details(exc)},
                    )
            with self._lock:
                task.state = (
                    status.state
                    if status is not None and status.state in ENDED_TASK_STATES
                    else S.TASK_STATE_CHECKPOINTED
                    if checkpoint
                    else S.TASK_STATE_FAILED
                )
                if status is not None and status.checkpoint_path:
                    task.checkpoint_path = status.checkpoint_path
                task.ended_at = self.clock()
                self._tasks.pop(task.task_id, None)
                self._stopping.discard(task.task_id)
                self.store.save_tasks([task])
            return ""

        self._pool_map(call, list(tasks))

    def _kill(self, tasks: Sequence[TaskRecord], reason: str) -> None:
        """Stop tasks without a checkpoint, in the background."""
        if not tasks:
            return
        with self._lock:
            self._stopping.update(t.task_id for t in tasks)
        with contextlib.suppress(RuntimeError):  # the pool is shut down: the process is leaving
            self._pool.submit(self._stop_tasks, list(tasks), checkpoint=False, reason=reason)

    # Bookkeeping under the lock --------------------------------------------------
    def _open_tasks(self, job_id: str) -> list[TaskRecord]:
        return [t for t in self._tasks.values() if t.job_id == job_id]

    def _record(
        self,
        job: JobRecord,
        kind: int,
        message: str,
        *,
        placement: bool = False,
    ) -> None:
        """Append an event and save the job with it (one transaction); wake watchers."""
        job.last_sequence += 1
        event = EventRecord(
            job_id=job.job_id,
            sequence=job.last_sequence,
            time=self.clock(),
            type=kind,
            state=job.state,
            message=message,
            progress=_copy(job.progress),
            placement=_copy(job.placement) if placement else None,
        )
        if kind != E.JOB_EVENT_TYPE_PROGRESS:
            job.message = message
        self.store.save_job(job, [event])
        self._changed.notify_all()
        self._tell_brain(event, job)

    def _tell_brain(self, event: EventRecord, job: JobRecord) -> None:
        kind = BRAIN_EVENTS.get(event.type)
        if kind is None or not self.brain.address:
            return
        if kind == brain_pb2.JOB_EVENT_KIND_STARTED and job.generation > 1:
            return  # a restart after a move, not the job's start
        with contextlib.suppress(RuntimeError):  # shutting down
            self._pool.submit(
                self.brain.report_event,
                f"{job.job_id}:{event.sequence}",
                job.job_id,
                kind,
                event.time,
                spec=job.spec if kind == brain_pb2.JOB_EVENT_KIND_SUBMITTED else None,
                exit_reason=event.message
                if event.type != E.JOB_EVENT_TYPE_SUCCEEDED
                else "completed",
            )

    def _finish(self, job: JobRecord, state: int, kind: int, message: str) -> None:
        job.state = state
        job.finished_at = self.clock()
        job.placement.Clear()
        self._record(job, kind, message)
        self._jobs.pop(job.job_id, None)
        self._estimates.pop(job.job_id, None)
        if self.datasets.address:
            with contextlib.suppress(RuntimeError):  # shutting down
                self._pool.submit(self.datasets.delete_job, job.job_id)
        self._estimates.pop(job.job_id + "#1", None)
        if self._mechanism is not None:
            self._mechanism.remove_job(job.job_id)

    def _release_holders(self, job: JobRecord, reason: str) -> None:
        """Dynamic-mode jobs: give the ESTs' held shards back now (their processes are gone)."""
        if job.spec.dataset.mode != S.DATA_MODE_DYNAMIC or not self.datasets.address:
            return
        with contextlib.suppress(RuntimeError):  # shutting down
            self._pool.submit(
                self.datasets.release, job.job_id, job.job_id, range(job.spec.num_ests), reason
            )

    def _detect_lost(self, now: float) -> list[str]:
        timeout = self.settings.heartbeat_timeout
        lost = [
            w.worker_id
            for w in self._workers.values()
            if w.alive and now - w.last_heartbeat_at > timeout
        ]
        if lost:
            self._lose(lost, now, "missed heartbeats")
        return lost

    def _lose(self, lost: Sequence[str], now: float, why: str) -> None:
        """Declare workers lost: their tasks fail, their jobs go back to the queue."""
        for worker_id in lost:
            worker = self._workers[worker_id]
            worker.alive = False
            self.store.save_worker(worker)
            log.warning("worker lost", extra={"worker_id": worker_id, "why": why})
        if self._mechanism is not None:
            self._mechanism.workers_changed()
        for job in list(self._jobs.values()):
            tasks = self._open_tasks(job.job_id)
            dead = [t for t in tasks if t.worker_id in lost]
            if not dead:
                continue
            for task in dead:
                task.state = S.TASK_STATE_FAILED
                task.ended_at = now
                task.message = "worker lost"
                self._tasks.pop(task.task_id, None)
            self.store.save_tasks(dead)
            survivors = [t for t in tasks if t.worker_id not in lost]
            self._release_holders(job, "a worker of the job was lost")
            job.state = S.JOB_STATE_QUEUED
            job.placement.Clear()
            self._record(
                job,
                E.JOB_EVENT_TYPE_WORKER_LOST,
                f"worker {', '.join(sorted({t.worker_id for t in dead}))} lost ({why}); "
                "rescheduling",
            )
            self._kill(survivors, "a worker of the job was lost")

    def _task_reports(self, worker_id: str, statuses: Sequence[common_pb2.TaskStatus]) -> None:
        """Apply what a worker says of its tasks; an ended task frees devices (wake a round)."""
        kill: list[TaskRecord] = []
        ended = False
        with self._lock:
            for status in statuses:
                task = self._tasks.get(status.task_id)
                if task is None or task.worker_id != worker_id:
                    continue
                job = self._jobs.get(task.job_id)
                if (
                    job is not None
                    and status.HasField("progress")
                    and status.progress.step >= max(job.progress.step, 1)
                ):
                    job.progress.CopyFrom(status.progress)
                if status.state in (S.TASK_STATE_STARTING, S.TASK_STATE_RUNNING):
                    task.state = status.state
                    continue
                if status.state not in ENDED_TASK_STATES or task.task_id in self._stopping:
                    continue  # a stop we asked for is finished by the stopping thread
                ended = True
                task.state = status.state
                task.ended_at = self.clock()
                task.message = status.message
                if status.checkpoint_path:
                    task.checkpoint_path = status.checkpoint_path
                self._tasks.pop(task.task_id, None)
                self.store.save_tasks([task])
                if job is None:
                    continue
                others = self._open_tasks(job.job_id)
                if status.state == S.TASK_STATE_COMPLETED:
                    job.final_digest = status.digest
                    if job.progress.total_steps:
                        job.progress.step = max(job.progress.step, job.progress.total_steps)
                    for other in others:  # its peers finish the same step; close them
                        other.state = S.TASK_STATE_COMPLETED
                        other.ended_at = self.clock()
                        self._tasks.pop(other.task_id, None)
                    self.store.save_tasks(others)
                    self._finish(job, S.JOB_STATE_SUCCEEDED, E.JOB_EVENT_TYPE_SUCCEEDED, "done")
                elif status.state == S.TASK_STATE_FAILED:
                    detail = status.message or f"exit code {status.exit_code}"
                    kill.extend(others)
                    self._release_holders(job, f"task {task.task_id} failed")
                    restarts = job.restart_count
                    what = f"task {task.task_id} on {worker_id} failed: {detail}"
                    if status.exit_code == EXIT_BAD_INPUT or restarts >= self.settings.max_restarts:
                        self._finish(job, S.JOB_STATE_FAILED, E.JOB_EVENT_TYPE_FAILED, what)
                    else:
                        # A peer that died (a lost node) fails the others' collectives
                        # before its worker is declared lost; and a crash may be transient.
                        # Resume from the last checkpoint, a bounded number of times.
                        job.restart_count = restarts + 1  # saved with the event below
                        job.state = S.JOB_STATE_QUEUED
                        job.placement.Clear()
                        self._record(
                            job,
                            E.JOB_EVENT_TYPE_PREEMPTED,
                            f"{what}; restarting from the last checkpoint "
                            f"(restart {restarts + 1} of {self.settings.max_restarts})",
                        )
                elif not others and job.state in RUNNING_STATES:
                    job.state = S.JOB_STATE_QUEUED  # checkpointed on its own: queue again
                    job.placement.Clear()
                    self._record(job, E.JOB_EVENT_TYPE_CHECKPOINTED, "stopped after a checkpoint")
        self._kill(kill, "a task of the job failed")
        if ended:
            self.wake()


def _processes(count: int) -> str:
    return f"{count} process" + ("" if count == 1 else "es")


def _copy(message: M) -> M:
    out = type(message)()
    out.CopyFrom(message)
    return out
