"""The scheduler's live records and the bookkeeping every part of it shares.

Jobs not yet ended, workers and open tasks live in memory (the Store has them
all, so a restarted scheduler reloads them); every change of a job is one
event, saved with the job in one transaction (`record`). Everything here runs
under `lock`; nothing here calls another process except through the thread
pool (the Brain's histories and the shard manager are told best effort).
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from google.protobuf.message import Message

from gearshift.scheduler.round.brain import BrainAdvisor
from gearshift.scheduler.round.datasets import DatasetKeeper
from gearshift.scheduler.round.restart_cost import RestartCost
from gearshift.scheduler.state.records import EventRecord, JobRecord, TaskRecord, WorkerRecord
from gearshift.scheduler.state.rescale_costs import RescaleCosts
from gearshift.scheduler.state.store import Store
from gearshift.scheduler.types import EntityPolicy, LasShares, StragglerPolicy
from gearshift.v1 import brain_pb2, common_pb2, scheduler_pb2

M = TypeVar("M", bound=Message)
C = common_pb2
S = scheduler_pb2
# Job events the Brain records (JobEventType -> brain JobEventKind).
BRAIN_EVENTS: dict[int, int] = {
    S.JOB_EVENT_TYPE_SUBMITTED: brain_pb2.JOB_EVENT_KIND_SUBMITTED,
    S.JOB_EVENT_TYPE_STARTED: brain_pb2.JOB_EVENT_KIND_STARTED,
    S.JOB_EVENT_TYPE_SUCCEEDED: brain_pb2.JOB_EVENT_KIND_SUCCEEDED,
    S.JOB_EVENT_TYPE_FAILED: brain_pb2.JOB_EVENT_KIND_FAILED,
    S.JOB_EVENT_TYPE_CANCELLED: brain_pb2.JOB_EVENT_KIND_CANCELLED,
}
RUNNING_STATES = (C.JOB_STATE_RUNNING, C.JOB_STATE_RESCALING)
# Determinism levels that keep bits on one kind of device only: such a job keeps the
# accelerator type of its first placement for its whole life.
ONE_TYPE_LEVELS = (
    C.DETERMINISM_LEVEL_UNSPECIFIED,
    C.DETERMINISM_LEVEL_D0,
    C.DETERMINISM_LEVEL_D1,
)


# When an event (a submission, a worker joining, a job ending) asks an allocator that re-plans
# on events for a round before the boundary: always, or only while a live device is free.
EVENT_ROUNDS = ("always", "free-devices")


@dataclass(frozen=True)
class SchedulerSettings:
    """How the scheduler behaves: the flat record its parts share, made from the
    configuration file by gearshift.scheduler.config.settings."""

    policy: str = "easyscale"
    elastic: bool = False  # a Gavel objective over elastic configurations
    round_seconds: float = 360.0
    heartbeat_interval: float = 5.0
    heartbeat_timeout: float = 30.0
    min_recompute_seconds: float = 0.0
    recompute_in_background: bool = False  # elastic: solves beside the rounds (elastic_rounds)
    event_round_gap: float = 1.0  # least time between the end of a round and one an event asks
    event_rounds: str = "always"  # when an event asks for a round early: always or free-devices
    decision_process: bool = False  # the round's decision in a child process (decider.py)
    checkpoint_root: str = ".gearshift/checkpoints"
    brain_address: str = ""
    shard_manager_address: str = ""
    stop_timeout_seconds: float = 60.0
    rendezvous_port_base: int = 29500
    seed: int = 0
    progress_event_seconds: float = 10.0
    max_restarts: int = 3
    max_queued_jobs: int = 1000  # per tenant
    hysteresis: float = 0.1
    preempt_exempt_seconds: float = 0.0  # elastic Gavel rounds: a new placement is kept this long
    max_moves_per_round: int = 0  # elastic Gavel rounds: running jobs moved a round (0: any)
    max_starts_per_round: int = 0  # queued jobs started a round, the others next (0: any)
    rescale_in_place: bool = False  # rescales that keep a device change membership in place
    estimate_starts_seconds: float = 0.0  # estimated starts at most this often (0: never)
    estimate_refresh_seconds: float = 60.0
    restart_seconds: float = 10.0  # a rescale's cost until one is measured
    in_place_seconds: float = 1.0  # a resize in place's cost until one is measured
    # How the allocator weighs moves against restarts (None: moves are free).
    restart_cost: RestartCost | None = None
    # How elastic LAS divides the devices (its fair floor and what the rest goes to).
    las: LasShares = field(default_factory=LasShares)
    prices: dict[str, float] = field(default_factory=dict)
    tenant_weights: dict[str, float] = field(default_factory=dict)
    tenant_policies: dict[str, EntityPolicy] = field(default_factory=dict)
    collocation: str = "none"  # the collocate stage: none or deeppool
    amp_limit: float = 2.0  # deeppool: the burst-parallel plans' amplification limit
    min_idle: float = 0.1  # deeppool: least idle share of a lending job's devices
    max_foreground_slowdown: float = 0.2  # deeppool: the worker's pause bound
    tenants_file: str = ""  # tenants' quotas for guaranteed jobs (empty: none)
    execution_plans: str = "none"  # the execution-plans stage: none or rubick
    plan_min_gain: float = 0.05  # rubick plans: least predicted gain that restarts a kept job
    plan_profile: bool = True  # rubick plans: profile a job without a fit at its first start
    plans: str = "dlrover"  # the plans point: dlrover (resource plans from the Brain) or none
    plan_interval: float = 60.0  # seconds between a running job's resource-plan adjustments
    stragglers: StragglerPolicy = field(default_factory=StragglerPolicy)

    @property
    def collocates(self) -> bool:
        """A collocate plugin runs (DeepPool's): jobs' burst-parallel plans are wanted."""
        return self.collocation != "none"

    @property
    def lease_seconds(self) -> float:
        return max(2 * self.round_seconds, 10.0)


def new_job_id() -> str:
    return "job-" + uuid.uuid4().hex[:12]


def copy_message(message: M) -> M:
    out = type(message)()
    out.CopyFrom(message)
    return out


class SchedulerState:
    """Jobs, workers and tasks in memory, and the changes that every part makes to them."""

    def __init__(
        self,
        store: Store,
        settings: SchedulerSettings,
        *,
        brain: BrainAdvisor,
        datasets: DatasetKeeper,
        clock: Callable[[], float],
        pool: ThreadPoolExecutor,
    ) -> None:
        self.store = store
        self.settings = settings
        self.brain = brain
        self.datasets = datasets
        self.clock = clock
        self.pool = pool
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.jobs: dict[str, JobRecord] = {}
        self.workers: dict[str, WorkerRecord] = {}
        self.tasks: dict[str, TaskRecord] = {}
        self.stopping: set[str] = set()
        self.last_progress_event: dict[str, float] = {}
        self.started_fresh: dict[str, int] = {}  # job -> the generation that said so
        # job -> multiple of its default memory share, doubled at each out-of-memory failure
        # (in memory only: a restarted scheduler starts again from the share).
        self.memory_factor: dict[str, int] = {}
        # job -> its PS task's latest measured use (heartbeats; in memory only): ps_jobs.py
        self.ps_metrics: dict[str, common_pb2.ParameterServerMetrics] = {}
        # Each rescale's measured cost, per job and per model type (in memory only).
        self.rescale_costs = RescaleCosts()
        self.ended_listeners: list[Callable[[str], None]] = [self.rescale_costs.forget]
        # Each tenant's queued jobs, kept by `track` on every change of a job (every change
        # passes through `record`), so that a submission's --max-queued-jobs check does not
        # walk thousands of jobs under the lock.
        self.queued: dict[str, set[str]] = {}
        # The leader epoch this scheduler was elected with (leader.py; 0: it runs alone),
        # sent with every StartTask, StopTask and lease renewal: workers refuse a lower one.
        self.epoch = 0

    def add(self, job: JobRecord) -> None:
        """A job enters memory (submitted, or reloaded by a restarted scheduler)."""
        self.jobs[job.job_id] = job
        self.track(job)

    def track(self, job: JobRecord) -> None:
        """Keep `queued` in step with the job's state."""
        tenant = job.spec.tenant
        if job.state == C.JOB_STATE_QUEUED and job.job_id in self.jobs:
            self.queued.setdefault(tenant, set()).add(job.job_id)
        elif (ids := self.queued.get(tenant)) is not None:
            ids.discard(job.job_id)
            if not ids:
                del self.queued[tenant]

    def open_tasks(self, job_id: str) -> list[TaskRecord]:
        return [t for t in self.tasks.values() if t.job_id == job_id]

    def record(
        self,
        job: JobRecord,
        kind: int,
        message: str,
        *,
        placement: bool = False,
        keep_message: bool = False,
    ) -> None:
        """Append an event and save the job with it (one transaction); wake watchers. The
        event's message becomes the job's, unless `keep_message` (a progress or reason
        event: the job's message says why it is in its state)."""
        job.last_sequence += 1
        event = EventRecord(
            job_id=job.job_id,
            sequence=job.last_sequence,
            time=self.clock(),
            type=kind,
            state=job.state,
            message=message,
            progress=copy_message(job.progress),
            placement=copy_message(job.placement) if placement else None,
        )
        if kind != S.JOB_EVENT_TYPE_PROGRESS and not keep_message:
            job.message = message
        self.store.save_job(job, [event])
        self.track(job)
        self.changed.notify_all()
        self.tell_brain(event, job)

    def tell_brain(self, event: EventRecord, job: JobRecord) -> None:
        kind = BRAIN_EVENTS.get(event.type)
        if kind is None or not self.brain.address:
            return
        if kind == brain_pb2.JOB_EVENT_KIND_STARTED and job.generation > 1:
            return  # a restart after a move, not the job's start
        with contextlib.suppress(RuntimeError):  # shutting down
            self.pool.submit(
                self.brain.report_event,
                f"{job.job_id}:{event.sequence}",
                job.job_id,
                kind,
                event.time,
                spec=job.spec if kind == brain_pb2.JOB_EVENT_KIND_SUBMITTED else None,
                exit_reason=event.message
                if event.type != S.JOB_EVENT_TYPE_SUCCEEDED
                else "completed",
            )

    def finish(self, job: JobRecord, state: int, kind: int, message: str) -> None:
        """The job ended: its last event, it leaves memory, its datasets are dropped."""
        job.state = state
        job.finished_at = self.clock()
        job.placement = C.Placement()  # replaced, not cleared (records.JobRecord.placement)
        self.record(job, kind, message)
        self.jobs.pop(job.job_id, None)
        self.last_progress_event.pop(job.job_id, None)
        self.started_fresh.pop(job.job_id, None)
        self.memory_factor.pop(job.job_id, None)
        if self.datasets.address:
            with contextlib.suppress(RuntimeError):  # shutting down
                self.pool.submit(self.datasets.delete_job, job.job_id)
        for listener in self.ended_listeners:
            listener(job.job_id)

    def requeue(self, job: JobRecord, kind: int, message: str) -> None:
        """Back to the queue (its processes are gone or going): no placement."""
        job.state = C.JOB_STATE_QUEUED
        job.placement = C.Placement()
        self.rescale_costs.fell_back(job.job_id)  # an open in-place change did not happen
        self.record(job, kind, message)

    def release_holders(self, job: JobRecord, reason: str, generation: int) -> None:
        """Dynamic-mode jobs: give the ESTs' held shards back now (their processes are gone).

        `generation` is that of the placement whose processes are gone, not necessarily the
        job's current one: the release is sent from the pool and may reach the shard manager
        after a newer placement started; fenced by that one's own releases, it is refused
        there instead of taking back the newer placement's shards (0: unfenced)."""
        if not self.has_holders(job):
            return
        with contextlib.suppress(RuntimeError):  # shutting down
            self.pool.submit(
                self.datasets.release,
                job.job_id,
                job.job_id,
                range(job.spec.num_ests),
                reason,
                generation,
            )

    def fence_holders(self, job: JobRecord, generation: int) -> None:
        """Dynamic-mode jobs, before a placement of `generation` is sent out (outside the
        lock): its holders are fenced at once, not only when its processes first release
        them, so no process of an older placement can cover a read from then on."""
        if self.has_holders(job):
            self.datasets.fence(job.job_id, job.job_id, range(job.spec.num_ests), generation)

    def has_holders(self, job: JobRecord) -> bool:
        """A dynamic-mode job on a cluster with a shard manager: its ESTs hold shards."""
        return job.spec.dataset.mode == C.DATA_MODE_DYNAMIC and bool(self.datasets.address)

    def types(self) -> list[str]:
        """Accelerator types of the live workers."""
        return sorted(
            {g.accelerator_type for w in self.workers.values() if w.alive for g in w.devices}
        )
