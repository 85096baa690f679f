"""The daemon's scheduling round: the pipeline of gearshift.scheduler.round.pipeline, wired to the
live
cluster. Read this file to know what a round does.

    with the lock:     lost workers  ->  snapshot (jobs, live devices, estimates)
    without the lock:  Brain estimates and resource plans refreshed  ->  allocate ->
                       collocate -> place
    with the lock:     reconcile: diff desired against actual, record RESCALING (also for a
                       job on the same devices whose new resource plan is worth a
                       restart); each job's collocation (alone, shared, foreground,
                       background)
    without the lock:  stop every moving job's tasks (checkpoint), then start the new ones

A round runs every `round_seconds`, and at once after an arrival, a completion
or a worker change when the allocator re-plans on events (elastic policies) or
when nothing runs. No RPC is made under the lock, so a slow Brain or worker
never stalls the jobs API; a round never kills the loop (an error is logged and
the next round tries again).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from gearshift.common import execplan
from gearshift.common.errors import ResourceExhaustedError
from gearshift.scheduler.api.registry import WorkerRegistry
from gearshift.scheduler.round import inplace
from gearshift.scheduler.round.decider import Decider, InProcess
from gearshift.scheduler.round.estimates import EstimateRequest, Estimates
from gearshift.scheduler.round.hooks import (
    CapView,
    ChoosesPlans,
    Explains,
    LearnsModels,
    PlansResources,
    Ranks,
    execution_plan,
)
from gearshift.scheduler.round.inplace import refusal, resizes_in_place
from gearshift.scheduler.round.placement import count_by_type, most_devices, workers_of
from gearshift.scheduler.round.reasons import JobReasons
from gearshift.scheduler.round.reconcile import Change, diff, hold_back, starts_past
from gearshift.scheduler.round.task_control import StartRequests, TaskControl
from gearshift.scheduler.round.views import HeldAssignments, LiveDevices
from gearshift.scheduler.round.why import Outcome
from gearshift.scheduler.state.records import JobRecord, TaskRecord
from gearshift.scheduler.state.state import (
    ONE_TYPE_LEVELS,
    RUNNING_STATES,
    SchedulerState,
    copy_message,
)
from gearshift.scheduler.types import (
    Allocator,
    Assignment,
    Collocator,
    Device,
    JobSnapshot,
    Ran,
    Snapshot,
    Target,
    config_of,
)
from gearshift.v1 import common_pb2, scheduler_pb2

log = logging.getLogger("gearshift.scheduler")
T = TypeVar("T")
R = TypeVar("R")
C = common_pb2
# Jobs whose records one hold of the lock writes, in one transaction (Rounds._in_holds).
RECORDS_PER_HOLD = 32
SLOW_ROUND_SECONDS = 1.0  # a round longer than this is logged with its phases (issue 16's target)
S = scheduler_pb2
# A round's phases, in order (RoundReport.phases; the round phase histogram's `phase` label)
ROUND_PHASES = (
    "asks",
    "estimates",
    "gather",
    "snapshot",
    "decide",
    "reconcile",
    "stop",
    "in place",
    "start",
)
ROLES = {
    "shared": C.COLLOCATION_ROLE_SHARED,
    "foreground": C.COLLOCATION_ROLE_FOREGROUND,
    "background": C.COLLOCATION_ROLE_BACKGROUND,
}


@dataclass
class RoundReport:
    """What one round did (for logs and tests)."""

    round: int
    started: list[str] = field(default_factory=list)
    rescaled: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    renewed: list[str] = field(default_factory=list)
    lost_workers: list[str] = field(default_factory=list)
    desired: dict[str, Assignment] = field(default_factory=dict)
    deferred: int = 0  # starts over --max-starts-per-round, left to the next round
    held_back: list[str] = field(default_factory=list)  # those jobs
    restarts: dict[str, str] = field(default_factory=dict)  # job -> why it restarts in place
    pending: Counter[str] = field(default_factory=Counter)  # waiting jobs by reason (why.py)
    # what the round decided from: the estimated starts run forward from it (sim/forward.py)
    snapshot: Snapshot | None = None
    current: dict[str, Assignment] = field(default_factory=dict)
    # seconds each of ROUND_PHASES took (the metrics' round phase histogram)
    phases: dict[str, float] = field(default_factory=dict)

    def lap(self, phase: str, since: float, now: float) -> float:
        """`phase` took from `since` to `now`; returns `now` (the next phase's start)."""
        self.phases[phase] = now - since
        return now


def log_round(report: RoundReport) -> None:
    """A round that changed placements, and one slower than SLOW_ROUND_SECONDS with its
    phases (the duration histogram's buckets are too coarse to say which phase)."""
    took = sum(report.phases.values())
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
    if took > SLOW_ROUND_SECONDS:
        fields = {"round": report.round, "seconds": round(took, 3)}
        log.info("slow round", extra=fields | {k: round(v, 3) for k, v in report.phases.items()})


@dataclass
class _Move:
    """A change being applied: the tasks to stop, then maybe a new placement."""

    change: Change
    stop: list[TaskRecord]
    in_place: bool = False  # a rescale to try in place (inplace.py): nothing to stop first

    @property
    def checkpoints(self) -> bool:
        """Whether its tasks stop with a checkpoint: a start's are an earlier placement's
        strays, stopped without one (the job resumes from its last checkpoint, which they
        must not overwrite)."""
        return self.change.kind != "start"

    @property
    def stop_reason(self) -> str:
        return self.change.kind if self.checkpoints else "an earlier placement's task"


@dataclass(frozen=True)
class _Start:
    """A move's new placement, prepared under the lock and sent outside it."""

    move: _Move
    job: JobRecord
    placement: common_pb2.Placement
    tasks: list[TaskRecord]
    requests: StartRequests


class _JobView(NamedTuple):
    """A job as the round read it: its mutable fields copied (a tuple: thousands a round)."""

    job: JobRecord  # its spec, id and arrival do not change
    locked_type: str
    steps_left: int
    held: Assignment


@dataclass(frozen=True)
class _Gathered:
    devices: tuple[Device, ...]
    jobs: list[_JobView]
    ran: tuple[Ran, ...]
    current: dict[str, Assignment]
    avoid: frozenset[str] = frozenset()  # degraded workers


class Rounds:
    """The round loop and one round; see the module docstring."""

    def __init__(
        self,
        state: SchedulerState,
        control: TaskControl,
        registry: WorkerRegistry,
        estimates: Estimates,
        allocator: Allocator,
        *,
        observers: list[Callable[[RoundReport, float], None]] | None = None,
        collocator: Collocator | None = None,
        plans: PlansResources | None = None,
        decider: Decider | None = None,
        execution_plans: ChoosesPlans | None = None,
    ) -> None:
        self.state = state
        self.plans = plans  # the resource plans (hooks.py; None: every job on the defaults)
        self.collocator = collocator
        self.execution_plans = execution_plans  # profile.executionPlans, after the decision
        self.control = control
        self.registry = registry
        self.estimates = estimates
        self.allocator = allocator
        # plan_round here or in a process of its own (--decision-process)
        self.decider = decider or InProcess(allocator, collocator)
        self.observers = list(observers or [])
        self.round = 0
        self.last_round_at = 0.0
        self.last_round_ended_at = 0.0
        self._checked_at = 0.0  # when the loop last looked for lost workers and tasks
        self._early_refused_at = 0.0  # when an event last asked for an early round in vain
        self._deferred_starts = False  # the last round left starts (--max-starts-per-round)
        self._cpus: dict[str, int] = {}  # job -> the round's cpus_per_device (0: default)
        self._plans: dict[str, common_pb2.ExecutionPlan] = {}  # job -> the round's plan (Rubick)
        self._collocated: set[str] = set()  # jobs the last round gave a collocation role
        self._snapshots: dict[str, tuple[Hashable, JobSnapshot]] = {}  # see _job
        self._asks: dict[str, EstimateRequest] = {}  # see _asks_of
        self._round_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._attained: dict[str, float] = {}
        self._placed_at: dict[str, float] = {}  # job -> when its current placement started
        self._devices = LiveDevices()
        self._held = HeldAssignments()
        self.reasons = JobReasons(state)

    # The loop -----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="sched-rounds", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.decider.close()

    def wake(self) -> None:
        """Ask for a round soon (an arrival, completion or worker change)."""
        self._wake.set()

    def stopped(self) -> bool:
        return self._stop.is_set()

    def _loop(self) -> None:
        settings = self.state.settings
        early = False  # an event asked for a round before the boundary
        while not self._stop.is_set():
            timeout = max(0.0, self._next_round_at(early) - self.state.clock())
            woken = self._wake.wait(timeout=min(timeout, settings.heartbeat_interval))
            if self._stop.is_set():
                return
            self._wake.clear()
            try:
                early = early or woken
                now = self.state.clock()
                due = now >= self._next_round_at(False)
                if not due and early and now >= self._next_round_at(True):
                    early = False  # answered: the next event asks again, a gap later
                    due = self._early_round_allowed()
                    if not due:
                        self._early_refused_at = now
                if due:
                    early = False
                    self.run_round()
                elif now - self._checked_at >= settings.heartbeat_interval:
                    # Not on every wake: a hundred submissions a second would each walk
                    # every worker, task and job under the lock.
                    self._checked_at = now
                    with self.state.lock:  # lost workers, jobs requeued: devices changed
                        changed = self.registry.detect_lost(now)
                        changed += self.registry.detect_forgotten(now)
                    if changed:
                        self.run_round()
            except Exception:  # a round must never kill the loop
                log.exception("round failed")

    def _next_round_at(self, early: bool) -> float:
        """The round boundary, or sooner for an event: `event_round_gap` after the last round
        ended, so that a burst of submissions or registrations makes one round, not one each."""
        boundary = self.last_round_at + self.state.settings.round_seconds
        if not early:
            return boundary
        since = max(self.last_round_ended_at, self._early_refused_at)
        return min(boundary, since + self.state.settings.event_round_gap)

    def _early_round_allowed(self) -> bool:
        """Allocators that re-plan on events run at once (with --event-rounds free-devices,
        only while a device is free: at a full cluster every arrival would move running
        jobs); Gavel's rounds wait for the boundary unless nothing runs (then a new job need
        not wait for the round to end). Asked at most once an event gap: it walks every
        job."""
        state = self.state
        replans = self.allocator.replans_on_events
        if (replans and state.settings.event_rounds == "always") or self._deferred_starts:
            return True
        with state.lock:  # references; read outside (placements are replaced, not changed)
            jobs = list(state.jobs.values())
            devices = self._devices.of(state.workers.values())
        running = [j.placement for j in jobs if j.state in RUNNING_STATES]
        if not replans:
            return not running
        held = {(p.worker_id, p.device_index) for placement in running for p in placement.processes}
        return any((d.worker_id, d.index) not in held for d in devices)

    # One round ------------------------------------------------------------------------------
    def run_round(self) -> RoundReport:
        """Lost workers, snapshot, pipeline, reconcile, apply; see the module docstring."""
        state = self.state
        with self._round_lock:
            started, lap = state.clock(), time.perf_counter()
            with state.lock:
                now = state.clock()
                self.round += 1
                report = RoundReport(self.round)
                report.lost_workers = self.registry.detect_lost(now)
                self.registry.detect_forgotten(now)
                self._checked_at = now  # the loop need not look again before the interval
                jobs = [j for j in state.jobs.values() if not j.terminal]
                types = state.types()
                asks = self._asks_of(jobs)
                plans = self.plans
                refresh_plans = (
                    plans.prepare(state, jobs, self.estimates.restart_seconds)
                    if plans is not None
                    else None
                )
                learners = self._learners()
                learn = [x.prepare(jobs, list(state.workers.values())) for x in learners]
            lap = report.lap("asks", lap, time.perf_counter())
            self.estimates.refresh(self.estimates.due(asks, types, now), types, now)
            if refresh_plans is not None:  # the resource plans asked, outside the lock
                refresh_plans()
            for refresh in learn:  # the Brain's fitted models, outside the lock
                refresh(now)
            lap = report.lap("estimates", lap, time.perf_counter())
            gathered = self.gather(now)
            self._lift_caps(gathered)
            lap = report.lap("gather", lap, time.perf_counter())
            snapshot, current = self._snapshot(now, gathered)  # estimates: outside the lock
            lap = report.lap("snapshot", lap, time.perf_counter())
            targets, desired = self.decider.decide(snapshot, current)
            if self.execution_plans is not None:
                targets = self.execution_plans.choose(targets, desired, current)
            lap = report.lap("decide", lap, time.perf_counter())
            with state.store.locked_batch(state.lock):
                report.desired = desired
                self._plans = self._new_plans(targets)
                for learns in learners:  # which model each job's plans come from, when it changes
                    self._model_notes(learns, [j.job_id for j in jobs])
                moves = self._reconcile(desired, current, report)
                self._collocations(targets, desired)
                self._cpus = {j: t.cpus_per_device for j, t in targets.items()}
                self.last_round_at = now
            state.store.set_state("round", str(self.round))  # its own commit: not under the lock
            self._explain(snapshot, targets, desired, current, report)
            report.snapshot, report.current = snapshot, current
            lap = report.lap("reconcile", lap, time.perf_counter())
            proceed = self._stop_all([m for m in moves if not m.in_place])
            lap = report.lap("stop", lap, time.perf_counter())
            # after the stops: a joiner may take a device another job's stop freed
            restarts = self._in_place([m for m in moves if m.in_place])
            proceed += self._stop_all(restarts)
            lap = report.lap("in place", lap, time.perf_counter())
            self._start_all(proceed)
            report.lap("start", lap, time.perf_counter())
            self._deferred_starts = report.deferred > 0  # the next round comes early for them
            log_round(report)
            self.last_round_ended_at = state.clock()
            for observer in self.observers:
                observer(report, self.last_round_ended_at - started)
            return report

    def _explain(
        self,
        snapshot: Snapshot,
        targets: Mapping[str, Target],
        desired: Mapping[str, Assignment],
        current: Mapping[str, Assignment],
        report: RoundReport,
    ) -> None:
        """Why each job waits, moved or was preempted (round/why.py, round/reasons.py)."""
        allocator = self.allocator
        ranked = getattr(self.decider, "priorities", None)  # where the allocator ran
        ranks = ranked() if callable(ranked) else {}
        if not ranks and isinstance(allocator, Ranks):
            ranks = allocator.priorities()
        offered = allocator.reasons(snapshot, targets) if isinstance(allocator, Explains) else {}
        outcome = Outcome(
            report.started, report.rescaled, report.preempted, report.held_back, report.restarts
        )
        context = self.reasons.context(snapshot, allocator.name, ranks)
        report.pending = self.reasons.update(
            snapshot, targets, desired, current, outcome=outcome, context=context, offered=offered
        )

    def _asks_of(self, jobs: list[JobRecord]) -> list[EstimateRequest]:
        """What to ask the Brain of each job (under the lock), kept per job: what it is
        made of, the job's spec, does not change (built afresh, the asks took the lock
        34 ms a round at 7,000 jobs, 11 ms kept)."""
        asks = self._asks
        out = []
        for job in jobs:
            ask = asks.get(job.job_id)
            if ask is None:
                ask = asks[job.job_id] = _ask(job)
            out.append(ask)
        return out

    def gather(self, now: float) -> _Gathered:
        """What the snapshot needs of the jobs and devices. Under the lock only the records
        are taken, and what the round keeps of them is updated (_after_gather)."""
        state = self.state
        with state.lock:  # references: what _gather reads of them needs no lock
            jobs = list(state.jobs.values())
            devices = self._devices.of(state.workers.values())
            avoid = self.registry.degraded_workers(now)
        gathered = self._gather(now, jobs, devices, avoid)
        with state.lock:
            self._after_gather(gathered)
        return gathered

    def _gather(
        self, now: float, jobs: list[JobRecord], devices: tuple[Device, ...], avoid: frozenset[str]
    ) -> _Gathered:
        """What the snapshot needs of the jobs, read outside the lock: each field read is
        whole (a placement is replaced, never changed: records.JobRecord.placement), and a
        job that ends or is requeued meanwhile is one that did so just after the round
        looked, as it could before. Held assignments are kept per placement (views.py)."""
        alive = set(devices)
        elapsed = min(now - self.last_round_at, self.state.settings.round_seconds)
        ran: list[Ran] = []
        views: list[_JobView] = []
        current: dict[str, Assignment] = {}
        for job in sorted(jobs, key=lambda j: (j.submitted_at, j.job_id)):
            if job.terminal:
                continue
            held = self._held.of(job) if job.state in RUNNING_STATES else []
            if held and all(d in alive for d, _ in held):
                current[job.job_id] = held
                config = config_of(count_by_type(d for d, _ in held))
                if self.last_round_at > 0 and elapsed > 0:
                    ran.append(Ran(job.job_id, config, elapsed))
            left = max(job.progress.total_steps - job.progress.step, 1)
            views.append(_JobView(job, job.locked_type, left, current.get(job.job_id, [])))
        return _Gathered(devices, views, tuple(ran), current, avoid)

    def _after_gather(self, gathered: _Gathered) -> None:
        """Under the lock: the service the jobs that ran attained, and nothing kept of a
        job that ended while _gather read it (`forget` has dropped it already)."""
        jobs = self.state.jobs
        for r in gathered.ran:
            if r.job_id in jobs:
                self._attained[r.job_id] = self._attained.get(r.job_id, 0.0) + r.seconds
        for view in gathered.jobs:
            if view.job.job_id not in jobs:
                self._held.forget(view.job.job_id)

    def _snapshot(self, now: float, gathered: _Gathered) -> tuple[Snapshot, dict[str, Assignment]]:
        """What the allocator sees."""
        types = sorted({d.worker_type for d in gathered.devices})
        marks = self.estimates.marks(view.job.job_id for view in gathered.jobs)
        jobs = tuple(self._job(view, types, marks[view.job.job_id]) for view in gathered.jobs)
        if getattr(self.allocator, "space_sharing", False):
            jobs = self._with_pairs(jobs, gathered.jobs)
        snapshot = Snapshot(now, gathered.devices, jobs, gathered.ran, gathered.avoid)
        return snapshot, gathered.current

    def _job(self, view: _JobView, types: list[str], marks: tuple[int, float]) -> JobSnapshot:
        """The job as the allocator sees it; the same object as last round while nothing
        it is made of changed (a queued job's, round after round), so that the allocator
        can keep what it worked out for it."""
        job = view.job
        key = (
            tuple(types),
            view.locked_type,
            view.steps_left,
            tuple(view.held),
            self._placed_at.get(job.job_id) if view.held else None,
            marks,  # the Brain's estimates' version, the restart time
            self._plan_devices(job.job_id),
            resizes_in_place(self.state, job),  # a job's collocation role may change
            job.collocation.partner_job_id,
        )
        attained = self._attained.get(job.job_id, 0.0)
        cached = self._snapshots.get(job.job_id)
        if cached is not None and cached[0] == key:
            snapshot = cached[1]
            if snapshot.attained_seconds != attained:
                # A running job's service moved on, nothing else: a copy with it, not a
                # rebuild (every running job's, each round: most of the snapshot's time)
                snapshot = snapshot.with_attained(attained)
                self._snapshots[job.job_id] = (key, snapshot)
            return snapshot
        snapshot = self._build_job(view, types)
        self._snapshots[job.job_id] = (key, snapshot)
        return snapshot

    def _lift_caps(self, gathered: _Gathered) -> None:
        """Device caps (a history plan's) that leave devices idle while no job waits for
        them give way before the snapshot (the plans provider's rule): the allocator may
        grow those jobs this round."""
        if self.plans is None:
            return
        held = {d for assignment in gathered.current.values() for d, _ in assignment}
        idle = Counter(
            d.worker_type
            for d in gathered.devices
            if d not in held and d.worker_id not in gathered.avoid
        )
        caps = self.plans.caps() if idle else {}  # a busy cluster: nothing to read
        if not caps:
            return
        views = [
            CapView(
                v.job.job_id,
                caps.get(v.job.job_id, 0),
                len({d for d, _ in v.held}),
                most_devices(v.job.spec),
                frozenset((v.locked_type,) if v.locked_type else v.job.spec.accelerator_types),
            )
            for v in gathered.jobs
            if not v.held or v.job.job_id in caps
        ]
        for job_id in self.plans.lift_caps(views, idle):
            log.info(
                "history cap lifted: devices idle and no job waits for them",
                extra={"job_id": job_id, "cap": caps[job_id], "idle": dict(idle)},
            )

    def _plan_devices(self, job_id: str) -> int:
        return self.plans.device_cap(job_id) if self.plans is not None else 0

    def _with_pairs(
        self, jobs: tuple[JobSnapshot, ...], views: list[_JobView]
    ) -> tuple[JobSnapshot, ...]:
        """Space sharing: each job's rate beside every other of its scale (Gavel pairs jobs
        of one scale factor), measured or estimated; not cached, it depends on the others."""
        records = {v.job.job_id: v.job for v in views}
        out = []
        for job in jobs:
            scale = job.max_devices
            partners = [o.job_id for o in jobs if o.job_id != job.job_id and o.max_devices == scale]
            pairs = self.estimates.pair_rates(records[job.job_id], partners, job.throughputs)
            out.append(dataclasses.replace(job, colocated=pairs))
        return tuple(out)

    def _build_job(self, view: _JobView, types: list[str]) -> JobSnapshot:
        job, held = view.job, view.held
        spec = job.spec
        n = spec.num_ests
        most = most_devices(spec)
        burst = self.estimates.burst(job.job_id)
        if burst is not None and spec.elastic.max_devices:  # DeepPool: as many as help
            most = max(min(most, burst.elastic_devices), min(spec.elastic.min_devices, most), 1)
        planned = self._plan_devices(job.job_id)
        if planned and spec.service_class != common_pb2.SERVICE_CLASS_GUARANTEED:
            # DLRover: start on the devices similar jobs ran on, within the elastic bounds
            # (a guaranteed job is owed its requested devices whatever history says)
            most = max(min(most, planned), min(spec.elastic.min_devices, most), 1)
        allowed = [t for t in types if not spec.accelerator_types or t in spec.accelerator_types]
        if view.locked_type:
            allowed = [t for t in allowed if t == view.locked_type]
        return JobSnapshot(
            job_id=job.job_id,
            num_ests=n,
            min_devices=min(max(spec.elastic.min_devices, 1), most),
            max_devices=most,
            types=tuple(allowed),
            capability=self.estimates.capability(job, types),
            throughputs=self.estimates.throughputs(job, types, most),
            steps_remaining=float(view.steps_left * n),
            arrival_time=job.submitted_at,
            mixing=spec.determinism not in ONE_TYPE_LEVELS,
            priority_weight=spec.priority_weight or 1.0,
            deadline=job.submitted_at + spec.slo.deadline_seconds
            if spec.HasField("slo")
            else float("inf"),
            entity=spec.tenant,
            current=config_of(count_by_type(d for d, _ in held)),
            attained_seconds=self._attained.get(job.job_id, 0.0),
            placed_at=self._placed_at.get(job.job_id, -math.inf) if held else -math.inf,
            restart_seconds=self.estimates.restart_seconds(job.job_id),
            resize_seconds=self.estimates.in_place_seconds(job.job_id)
            if resizes_in_place(self.state, job)
            else None,
            background=most == 1 and spec.service_class != C.SERVICE_CLASS_GUARANTEED,
            guaranteed=spec.service_class == C.SERVICE_CLASS_GUARANTEED,
            idle_fraction=burst.idle_fraction if burst is not None else 0.0,
            collocated_slowdown=self.estimates.collocated_slowdown(job.job_id),
            partners=(job.collocation.partner_job_id,)
            if held and job.collocation.partner_job_id
            else (),
        )

    def _collocations(
        self, targets: Mapping[str, Target], desired: Mapping[str, Assignment]
    ) -> None:
        """Each job's collocation as the round decided it (under the lock): what a start
        sends its worker, and what `gearshift job` shows. Only the jobs with a role now or
        in the last round are looked at (a walk over every job, most with nothing to clear,
        took 5-8 ms of the reconcile's hold at 8,000 jobs, bench/load.py); a worker's
        heartbeats say whether a job is paused (registry.py)."""
        bound = self.state.settings.max_foreground_slowdown
        jobs = self.state.jobs
        roles = {j: t for j, t in targets.items() if t.role and j in desired}
        for job_id in self._collocated | roles.keys():
            job = jobs.get(job_id)
            if job is None:
                continue
            target = roles.get(job_id)
            if job.terminal or target is None:
                if job.collocation.role or job.paused:
                    job.collocation.Clear()
                    job.paused = False
                continue
            job.collocation.CopyFrom(
                C.Collocation(
                    role=ROLES[target.role],
                    partner_job_id=target.partners[0] if target.partners else "",
                    max_foreground_slowdown=bound if target.role == "background" else 0.0,
                )
            )
        self._collocated = set(roles)

    def _new_plans(self, targets: Mapping[str, Target]) -> dict[str, common_pb2.ExecutionPlan]:
        """The execution plans the allocator or the execution-plans stage chose (Rubick) that
        differ from the jobs' own (under the lock): a start runs them, and a running job whose
        plan alone changed is restarted on the same devices (the chooser weighed the restart:
        the policy's 0.97 rule, the stage's minGain)."""
        out: dict[str, common_pb2.ExecutionPlan] = {}
        for job_id, target in targets.items():
            job = self.state.jobs.get(job_id)
            if target.plan is None or job is None or job.terminal:
                continue
            plan = execution_plan(target.plan, job.plan)
            if plan != job.plan:
                out[job_id] = plan
        return out

    def _learners(self) -> list[LearnsModels]:
        """The plugins that fit their jobs' models as they run (round/hooks.py)."""
        found = [self.allocator, self.execution_plans]
        return [x for x in found if isinstance(x, LearnsModels)]

    def _model_notes(self, learns: LearnsModels, job_ids: list[str]) -> None:
        """Record, as a PLAN event, the Rubick model a job's plans now come from (under
        the lock)."""
        for job_id, note in learns.new_notes(job_ids).items():
            job = self.state.jobs.get(job_id)
            if job is not None and not job.terminal:
                self.state.record(job, S.JOB_EVENT_TYPE_PLAN, note)

    def _restart_reason(self, job_id: str) -> str | None:
        """Why a job keeping its devices is restarted on them anyway (None: it is not):
        it starts with other arguments - a new execution plan (Rubick: the policy
        weighed the restart) or a new resource plan worth the restart (the plans provider)."""
        if job_id in self._plans:
            return "restarting with a new execution plan"
        return self.plans.restart_reason(job_id) if self.plans is not None else None

    def _reconcile(
        self,
        desired: Mapping[str, Assignment],
        current: Mapping[str, Assignment],
        report: RoundReport,
    ) -> list[_Move]:
        """Diff desired against actual, the starts over --max-starts-per-round held back
        (reconcile.hold_back); renew leases, mark moves (under the lock)."""
        state = self.state
        now = state.clock()
        expires = now + state.settings.lease_seconds
        moves: list[_Move] = []
        running = {  # a running state is not a terminal one
            job_id: current.get(job_id, [])
            for job_id, job in state.jobs.items()
            if job.state in RUNNING_STATES
        }
        tasks: dict[str, list[TaskRecord]] = {}  # open tasks by job, grouped once
        for task in state.tasks.values():
            tasks.setdefault(task.job_id, []).append(task)
        bound = state.settings.max_starts_per_round or len(desired)
        found_changes = diff(desired, running)
        changes, deferred = hold_back(found_changes, running, bound)
        report.held_back = starts_past(found_changes, bound) if deferred else []
        for found in changes:
            job = state.jobs.get(found.job_id)
            if job is None or job.terminal:
                continue
            # the same devices, other start arguments: the rescale path restarts it (not a
            # job that runs on only because its preemption was held back: the decision
            # gave it no devices, by diff's own rule)
            placed = found.kind == "renew" and bool(desired.get(found.job_id))
            replan = self._restart_reason(job.job_id) if placed else None
            change = Change(job.job_id, "rescale", found.assignment) if replan else found
            if replan:
                report.restarts[job.job_id] = replan
            if change.kind == "renew":
                report.renewed.append(job.job_id)
                for task in tasks.get(job.job_id, ()):
                    task.lease_expires_at = expires
                continue
            # A start's are strays of an earlier placement (a crash between requeuing the
            # job and stopping them): ended before the start, or two placements would run.
            stop = tasks.get(job.job_id, [])
            in_place = change.kind == "rescale" and not replan and not refusal(state, job, stop)
            if not in_place:
                state.stopping.update(t.task_id for t in stop)
            if stop and change.kind == "start":
                log.warning(
                    "stopping an earlier placement's tasks before starting the job",
                    extra={"job_id": job.job_id, "tasks": [t.task_id for t in stop]},
                )
            elif stop and not in_place:
                self.estimates.stopping(job.job_id, now)
            if change.kind == "rescale":
                job.state = C.JOB_STATE_RESCALING
                state.rescale_costs.decided(job.job_id, state.clock())
                state.record(
                    job,
                    S.JOB_EVENT_TYPE_RESCALING,
                    replan or _moving(state, change),
                )
                report.rescaled.append(job.job_id)
            elif change.kind == "preempt":
                report.preempted.append(job.job_id)
            else:
                report.started.append(job.job_id)
            moves.append(_Move(change, stop, in_place))
        report.deferred = deferred
        if deferred:  # the next round starts them, asked for at once
            log.info("starts left to the next round", extra={"deferred": deferred})
            self.wake()
        return moves

    # Applying changes: the calls outside the lock, all in flight at once; the records under
    # the lock, RECORDS_PER_HOLD jobs a hold, each hold one transaction (write_batch.py).
    def _stop_all(self, moves: list[_Move]) -> list[_Move]:
        """Every stop before any start: a job must not be started on devices that another
        job's processes still hold (they leave only once they have checkpointed). The
        moves whose start is to follow."""
        stopped = self._stop_tasks(moves)
        proceed = self._in_holds(
            list(zip(moves, stopped, strict=True)),
            lambda x: x[1] is not None and self._after_stop(x[0], x[1]),
        )
        return [move for move, ok in zip(moves, proceed, strict=True) if ok]

    def _in_place(self, moves: list[_Move]) -> list[_Move]:
        """Apply rescales in place (inplace.py); the moves that must restart instead, their
        tasks marked stopping (any joiners already started are killed)."""
        if not moves:
            return []
        with self.control.ports_indexed():
            prepared = self._in_holds(moves, self._prepare_in_place)
        ready = [p for p in prepared if p is not None]
        sent = inplace.send(self.control, ready)
        failures = dict(zip([p.job_id for p in ready], sent, strict=True))
        restarts = self._in_holds(
            list(zip(moves, prepared, strict=True)),
            lambda x: self._after_in_place(x[0], x[1], failures),
        )
        for p in ready:
            if failures[p.job_id]:
                self.control.kill(p.joins, "the in-place change failed")
        return [m for m, again in zip(moves, restarts, strict=True) if again]

    def _prepare_in_place(self, move: _Move) -> inplace.Prepared | None:
        """Under the lock: the move's change (None: it restarts instead)."""
        job = self.state.jobs.get(move.change.job_id)
        if job is None or job.terminal or refusal(self.state, job, move.stop):
            return None
        try:
            return inplace.prepare(
                self.control,
                job,
                move.stop,
                move.change.assignment,
                self._cpus.get(job.job_id, 0),
            )
        except Exception:
            log.exception("preparing an in-place change failed", extra={"job_id": job.job_id})
            return None

    def _after_in_place(
        self, move: _Move, prepared: inplace.Prepared | None, failures: Mapping[str, str]
    ) -> bool:
        """Under the lock: a change that went out is the job's placement; True when the
        job is to restart instead (its tasks marked stopping)."""
        state = self.state
        job = state.jobs.get(move.change.job_id)
        if job is None or job.terminal:
            return False
        why = "no device is kept" if prepared is None else failures[prepared.job_id]
        if why:
            log.info("rescale restarts instead", extra={"job_id": job.job_id, "why": why})
            state.stopping.update(t.task_id for t in move.stop)
            self.estimates.stopping(job.job_id, state.clock())
            return True
        assert prepared is not None
        state.rescale_costs.in_place(job.job_id)
        how = inplace.describe(prepared)
        inplace.settle(state, prepared)
        self._started(job, prepared.placement, job.plan, rescaled=True, how=how)
        return False

    def _in_holds(self, items: list[T], fn: Callable[[T], R]) -> list[R]:
        """fn over items under the lock, RECORDS_PER_HOLD items per hold, each hold's writes
        in one transaction: a round of a thousand moves commits tens of times, not
        thousands, and a heartbeat waits for one hold at most."""
        out: list[R] = []
        for first in range(0, len(items), RECORDS_PER_HOLD):
            with self.state.store.locked_batch(self.state.lock):
                out.extend(fn(item) for item in items[first : first + RECORDS_PER_HOLD])
        return out

    def _stop_tasks(self, moves: list[_Move]) -> list[list[common_pb2.TaskStatus | None] | None]:
        """StopTask every move's tasks at once (TaskControl.stop_many), with a checkpoint
        unless they are strays (_Move.checkpoints): each move's statuses; None when it
        broke (the jobs are abandoned)."""
        groups = [(m.stop, m.checkpoints, m.stop_reason) for m in moves]
        try:
            return list(self.control.stop_many(groups))
        except Exception:
            log.exception("stopping the round's tasks failed", extra={"moves": len(moves)})
            for move in moves:
                self._abandon(move.change.job_id)
            return [None] * len(moves)

    def _after_stop(self, move: _Move, statuses: list[common_pb2.TaskStatus | None]) -> bool:
        """Under the lock: the stopped tasks' records, the stop's checkpoint event, a
        preempted job back in the queue; True when a start is to follow."""
        state = self.state
        change = move.change
        self.control.close_stopped(move.stop, statuses, checkpoint=move.checkpoints)
        job = state.jobs.get(change.job_id)
        if job is None or job.terminal:
            return False
        if move.stop and move.checkpoints:
            paths = sorted({t.checkpoint_path for t in move.stop if t.checkpoint_path})
            state.record(
                job,
                S.JOB_EVENT_TYPE_CHECKPOINTED,
                f"checkpoint at step {job.progress.step}" + (f" in {paths[0]}" if paths else ""),
            )
        if change.kind == "preempt":
            state.requeue(job, S.JOB_EVENT_TYPE_PREEMPTED, "devices given to other jobs")
            return False
        return True

    def _start_all(self, moves: list[_Move]) -> None:
        """Start the jobs' new placements: tasks saved (one transaction) before any
        StartTask is sent, the calls, then every start or failure recorded."""
        with self.control.ports_indexed():
            prepared = self._in_holds(moves, self._prepare_start)
        starts = [s for s in prepared if s is not None]
        results = self._send(starts)
        reasons = self._in_holds(
            list(zip(starts, results, strict=True)), lambda x: self._after_start(*x)
        )
        for start, reason in zip(starts, reasons, strict=True):
            if reason:
                self.control.kill(start.tasks, reason)
        if "start failed" in reasons:
            self.wake()

    def _prepare_start(self, move: _Move) -> _Start | None:
        """Under the lock: the job's tasks and StartTask requests (None: not started)."""
        state = self.state
        change = move.change
        try:
            job = state.jobs.get(change.job_id)
            if job is None or job.terminal:
                return None
            profile = (  # DeepPool: its rank 0 measures the profile its plans need
                state.settings.collocates
                and job.generation == 0
                and self.estimates.burst(job.job_id) is None
            )
            profile_rubick = job.generation == 0 and any(  # its rank 0 measures its model's runs
                x.wants_profile(job.job_id) for x in self._learners()
            )
            placement, tasks, requests = self.control.prepare_start(
                job,
                change.assignment,
                profile_first=profile,
                profile_rubick=profile_rubick,
                plan=self._plans.get(job.job_id),
                cpus_per_device=self._cpus.get(job.job_id, 0),
            )
            return _Start(move, job, placement, tasks, requests)
        except ResourceExhaustedError as exc:  # nothing was sent: the job stays queued
            log.warning("job not started", extra={"job_id": change.job_id, "why": str(exc)})
        except Exception:
            log.exception("starting a job failed", extra={"job_id": change.job_id})
        self._abandon(change.job_id)
        return None

    def _send(self, starts: list[_Start]) -> list[tuple[list[str], set[str]] | None]:
        """Outside the lock: the dynamic-mode jobs' holders fenced (in parallel), then
        every StartTask of the round at once (TaskControl.start_jobs); for each start its
        failures and the workers that could not be reached (None: it broke)."""
        fencing = [s for s in starts if self.state.has_holders(s.job)]
        fenced = self.state.pool.map(self._fence, fencing)
        broke = {s.job.job_id for s, ok in zip(fencing, fenced, strict=True) if not ok}
        ready = [s.requests for s in starts if s.job.job_id not in broke]
        sent = iter(self.control.start_jobs(ready))
        return [None if s.job.job_id in broke else next(sent) for s in starts]

    def _fence(self, start: _Start) -> bool:
        try:
            self.state.fence_holders(start.job, start.tasks[0].generation)
            return True
        except Exception:
            log.exception("starting a job failed", extra={"job_id": start.job.job_id})
            return False

    def _after_start(self, start: _Start, result: tuple[list[str], set[str]] | None) -> str:
        """Under the lock: the job runs, or goes back to the queue; why its tasks are to be
        killed ("" if they are not)."""
        job = self.state.jobs.get(start.job.job_id)
        if job is None or job.terminal:
            return "job ended while starting"
        if result is None:
            self._abandon(job.job_id)
            return ""
        failures, unreachable = result
        if failures:
            self._start_failed(job, start.tasks, failures, unreachable)
            return "start failed"
        plan = start.requests[0][1].plan
        self._started(job, start.placement, plan, rescaled=start.move.change.kind == "rescale")
        return ""

    def _started(
        self,
        job: JobRecord,
        placement: common_pb2.Placement,
        plan: common_pb2.ExecutionPlan,
        *,
        rescaled: bool,
        how: str = "",
    ) -> None:
        state = self.state
        self._placed_at[job.job_id] = state.clock()
        job.placement = copy_message(placement)  # published once its tasks run; replaced
        new_plan = plan != job.plan
        job.plan.CopyFrom(plan)
        job.state = C.JOB_STATE_RUNNING
        if not job.started_at:
            job.started_at = state.clock()
        if job.spec.determinism in ONE_TYPE_LEVELS and not job.locked_type:
            job.locked_type = placement.processes[0].accelerator_type  # saved with the event
        if rescaled:
            job.rescale_count += 1
        count = len(job.placement.processes)
        state.record(
            job,
            S.JOB_EVENT_TYPE_RESCALED if rescaled else S.JOB_EVENT_TYPE_STARTED,
            f"{count} process{'' if count == 1 else 'es'} on {', '.join(workers_of(placement))}"
            + _sharing(job.collocation)
            + (f", {how}" if how else "")
            + (f"; plan: {execplan.describe(plan)}" if new_plan else ""),
            placement=True,
        )
        applied = self.plans.started(job.job_id) if self.plans is not None else ()
        for text in applied:  # what it started with, after the start itself
            state.ps_metrics.pop(job.job_id, None)  # measured under the previous plan
            job.resource_plan = text
            state.record(job, S.JOB_EVENT_TYPE_PLAN, text)

    def _start_failed(
        self, job: JobRecord, tasks: list[TaskRecord], failures: list[str], unreachable: set[str]
    ) -> None:
        state = self.state
        for task in tasks:
            task.state = C.TASK_STATE_FAILED
            task.ended_at = state.clock()
            state.tasks.pop(task.task_id, None)
        state.store.save_tasks(tasks)
        state.requeue(job, S.JOB_EVENT_TYPE_PREEMPTED, "could not start: " + "; ".join(failures))
        # A worker that cannot be reached is as good as lost: waiting for its heartbeats to
        # time out would only retry the same placement. If it is alive after all, its next
        # heartbeat makes it register again.
        gone = [w.worker_id for w in state.workers.values() if w.alive and w.address in unreachable]
        if gone:
            self.registry.lose(gone, state.clock(), "unreachable")

    def _abandon(self, job_id: str) -> None:
        """A change that broke half-way: a moving job goes back to the queue."""
        with self.state.lock:
            job = self.state.jobs.get(job_id)
            if job is not None and not job.terminal and job.state == C.JOB_STATE_RESCALING:
                self.state.requeue(job, S.JOB_EVENT_TYPE_PREEMPTED, "rescale failed")

    def forget(self, job_id: str) -> None:
        self._attained.pop(job_id, None)
        self._placed_at.pop(job_id, None)
        self._held.forget(job_id)
        self._snapshots.pop(job_id, None)
        self._asks.pop(job_id, None)
        if self.plans is not None:
            self.plans.forget(job_id)
        self.state.ps_metrics.pop(job_id, None)


def _sharing(collocation: common_pb2.Collocation) -> str:
    """How a started job shares its devices, for its event."""
    partner = collocation.partner_job_id
    return {
        C.COLLOCATION_ROLE_SHARED: f", sharing its devices with {partner}",
        C.COLLOCATION_ROLE_FOREGROUND: f", lending idle device time to {partner}",
        C.COLLOCATION_ROLE_BACKGROUND: f", in the background on {partner}'s device",
    }.get(collocation.role, "")


def _ask(job: JobRecord) -> EstimateRequest:
    """What to ask the Brain of a job (its layer profile's keys are derived only where the
    round asks for burst-parallel plans, outside the lock)."""
    spec = job.spec
    return EstimateRequest(job.job_id, spec.model_type, most_devices(spec), spec)


def _moving(state: SchedulerState, change: Change) -> str:
    """The RESCALING event's message: which degraded workers the move leaves, if any (under
    the lock)."""
    job = state.jobs[change.job_id]
    before = {p.worker_id for p in job.placement.processes}
    after = {d.worker_id for d, _ in change.assignment}
    off = sorted(
        w
        for w in before - after
        if (worker := state.workers.get(w)) is not None and worker.degraded_reason
    )
    if not off:
        return "moving to a new placement"
    return f"moving to a new placement, off degraded worker {', '.join(off)}"
