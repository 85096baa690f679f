"""The scheduler: its parts wired together behind the calls the gRPC servicers make.

Job lifecycle (JobState, with the JobEventType that records each change):

    QUEUED --STARTED--> RUNNING --RESCALING--> RESCALING --RESCALED--> RUNNING
      ^                   |  |                                      (new placement)
      |   PREEMPTED,      |  +--SUCCEEDED / FAILED--> SUCCEEDED / FAILED
      +---WORKER_LOST-----+
    any non-final state --CANCELLED--> CANCELLED

SUBMITTED opens every log; PROGRESS (throttled) and CHECKPOINTED leave the state
unchanged. A job runs as one task per worker of its placement (its processes
there). Where each part lives:

- gearshift.scheduler.round.rounds     - the round: snapshot -> allocate -> place -> reconcile,
                                   and applying it (stops, then starts);
- gearshift.scheduler.api.jobs_api   - submit, get, list, cancel, watch, cluster state;
- gearshift.scheduler.api.registry   - workers register, heartbeat (with progress), tasks end;
- gearshift.scheduler.round.estimates  - measured and the Brain's throughputs, restart costs;
- gearshift.scheduler.round.task_control - StartTask / StopTask on the workers;
- gearshift.scheduler.state.state      - the live records and the bookkeeping they share;
- gearshift.scheduler.state.write_batch - the writes of one hold of the lock, in one transaction;
- gearshift.scheduler.plugins.allocators - the policies (the allocate stage's plugins).

Everything a restart needs is in the Store: jobs with their last state,
placement and locked type, events, workers, open tasks. A restarted scheduler
reloads them, gives every worker a fresh heartbeat timeout, and carries on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gearshift.common.errors import NotFoundError
from gearshift.common.facts import TERMINAL_STATES
from gearshift.common.identity import JobTokens
from gearshift.scheduler import metrics
from gearshift.scheduler.api.jobs_api import JobsApi
from gearshift.scheduler.api.registry import WorkerRegistry
from gearshift.scheduler.plugins.dlrover.ps_jobs import PsPlans
from gearshift.scheduler.plugins.dlrover.resource_plans import ResourcePlans
from gearshift.scheduler.plugins.registry import Can, Point, capabilities
from gearshift.scheduler.plugins.rubick.guarantees import Admission, Guarantees
from gearshift.scheduler.plugins.rubick.rubick_live import LiveRubick
from gearshift.scheduler.plugins.rubick.tenants import Quotas, TenantsFile
from gearshift.scheduler.plugins.stages import (
    allocator_for,
    collocator_for,
    decider_for,
    execution_plans_for,
    plans_for,
)
from gearshift.scheduler.round.brain import BrainAdvisor
from gearshift.scheduler.round.datasets import DatasetKeeper
from gearshift.scheduler.round.estimates import Estimates
from gearshift.scheduler.round.rounds import RoundReport, Rounds
from gearshift.scheduler.round.task_control import TaskControl
from gearshift.scheduler.round.workers import WorkerAgents
from gearshift.scheduler.sim.forward import Bounds, LiveEstimates, standalone
from gearshift.scheduler.state.job_logs import LogSources, TaskSource, job_log_lines
from gearshift.scheduler.state.job_steps import job_steps
from gearshift.scheduler.state.records import EventRecord, JobRecord, WorkerRecord
from gearshift.scheduler.state.state import SchedulerSettings, SchedulerState
from gearshift.scheduler.state.store import Store
from gearshift.scheduler.types import Allocator
from gearshift.v1 import common_pb2, scheduler_pb2

log = logging.getLogger("gearshift.scheduler")
C = common_pb2

__all__ = ["RoundReport", "Scheduler", "SchedulerSettings"]


class Scheduler:
    """The scheduler's parts, wired; the gRPC servicers are thin wrappers around it."""

    def __init__(
        self,
        store: Store,
        settings: SchedulerSettings,
        *,
        agents: WorkerAgents | None = None,
        brain: BrainAdvisor | None = None,
        datasets: DatasetKeeper | None = None,
        clock: Callable[[], float] = time.time,
        allocator: Allocator | None = None,
        job_tokens: JobTokens | None = None,
    ) -> None:
        self.agents = agents or WorkerAgents()
        self.brain = brain or BrainAdvisor()
        self.datasets = datasets or DatasetKeeper()
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="sched-calls")
        self.tenants = TenantsFile(Path(settings.tenants_file)) if settings.tenants_file else None
        self.state = SchedulerState(
            store, settings, brain=self.brain, datasets=self.datasets, clock=clock, pool=self._pool
        )
        self.estimates = Estimates(
            self.brain,
            refresh_seconds=settings.estimate_refresh_seconds,
            default_restart_seconds=settings.restart_seconds,
            default_in_place_seconds=settings.in_place_seconds,
            burst_amp_limit=settings.amp_limit if settings.collocates else 0.0,
        )
        # The plans point's stage (DLRover's): the round's resource plans and the task
        # control's process plans (round/hooks.py).
        self.plans = plans_for(settings, self.brain, clock, self._pool)
        self.control = TaskControl(self.state, self.agents, job_tokens, processes=self.plans)
        self.registry = WorkerRegistry(self.state, self.control, self.estimates, self.wake)
        allocator = allocator or allocator_for(settings, self.tenants, self.brain)
        self.rounds = Rounds(
            self.state,
            self.control,
            self.registry,
            self.estimates,
            allocator,
            observers=[metrics.round_finished],
            collocator=collocator_for(settings),
            decider=decider_for(settings, allocator),
            execution_plans=execution_plans_for(settings, self.brain),
            plans=self.plans,
        )
        self.starts = self._start_estimates(settings)
        self.jobs = JobsApi(
            self.state,
            self.control,
            self.wake,
            lambda: self.rounds.round,
            self.rounds.stopped,
            tenancy=self._tenancy,
            ps_plans=self.plans.ps,
        )
        self.state.ended_listeners.extend([self.estimates.forget, self.rounds.forget])
        # A standby (takeover.py sets it while it waits for the lock) has recovered
        # nothing: its reads come from the store until recover().
        self.standby = False

    @property
    def resource_plans(self) -> ResourcePlans | None:
        """The data-parallel jobs' resource plans (None: off)."""
        return self.plans.resources

    @property
    def ps_plans(self) -> PsPlans:
        """The parameter-server jobs' plans."""
        return self.plans.ps

    def _start_estimates(self, settings: SchedulerSettings) -> LiveEstimates | None:
        """The waiting jobs' estimated starts after a round, at most every
        round.estimateStartsSeconds, by a fresh allocator of the configured kind; none for
        one that asks the Brain (its decisions need RPCs)."""
        if settings.estimate_starts_seconds <= 0:
            return None
        if Can.DECISION_PROCESS not in capabilities(Point.ALLOCATE, settings.policy):
            return None
        estimates = LiveEstimates(
            self.state,
            lambda: self._forward_allocator(settings),
            self._pool,
            lambda: collocator_for(settings),
            bounds=Bounds(round_seconds=max(settings.round_seconds, 10.0), max_rounds=1000),
            every_seconds=settings.estimate_starts_seconds,
        )
        self.rounds.observers.append(
            lambda report, _: estimates.round_done(report.snapshot, report.current)
        )
        return estimates

    def _forward_allocator(self, settings: SchedulerSettings) -> Allocator:
        """A copy of the allocator that decides, in this process or in the decision process
        (its memory of past rounds makes the estimate the round's), else a fresh one."""
        lent = self.rounds.decider.lend_allocator()
        return standalone(lent) if lent is not None else allocator_for(settings)

    def _tenancy(self) -> tuple[Quotas, Mapping[str, Admission]]:
        """The quotas and the last round's admission of guaranteed jobs."""
        if self.tenants is None:
            return Quotas(), {}
        allocator = self.rounds.allocator
        if isinstance(allocator, LiveRubick):
            return self.tenants.quotas, allocator.admissions()
        admitted = allocator.admitted if isinstance(allocator, Guarantees) else {}
        return self.tenants.quotas, dict(admitted)

    def reload_tenants(self) -> int:
        """Re-read the tenants file (SIGHUP): ValidationError keeps the old quotas. The
        next round admits guaranteed jobs against the new ones; returns the tenants count."""
        if self.tenants is None:
            return 0
        quotas = self.tenants.reload()
        self.wake()
        return len(quotas.by_tenant)

    @property
    def store(self) -> Store:
        return self.state.store

    @property
    def settings(self) -> SchedulerSettings:
        return self.state.settings

    @settings.setter
    def settings(self, value: SchedulerSettings) -> None:
        self.state.settings = value

    # Lifecycle of the service --------------------------------------------------------------
    def recover(self) -> None:
        """Reload every unfinished job, the workers and open tasks from the store."""
        state = self.state
        now = state.clock()
        with state.lock:
            for job in state.store.active_jobs():
                if job.state == C.JOB_STATE_RESCALING:
                    job.state = C.JOB_STATE_RUNNING  # the next round finishes the move
                state.add(job)
                self.plans.recover(job)
            for worker in state.store.workers():
                worker.last_heartbeat_at = max(worker.last_heartbeat_at, now)
                state.workers[worker.worker_id] = worker
            for task in state.store.open_tasks():
                if task.job_id in state.jobs:
                    task.last_listed_at = now  # its worker gets a heartbeat's time to list it
                    state.tasks[task.task_id] = task
            self.rounds.round = int(state.store.get_state("round") or 0)
            self.standby = False
        log.info(
            "recovered",
            extra={
                "jobs": len(state.jobs),
                "workers": len(state.workers),
                "round": self.rounds.round,
            },
        )

    def start(self) -> None:
        """Start the round loop in a background thread."""
        self.rounds.start()

    def stop(self) -> None:
        self.rounds.stop()
        self._pool.shutdown(wait=True, cancel_futures=False)
        self.agents.close()
        self.brain.close()
        self.datasets.close()
        with self.state.changed:
            self.state.changed.notify_all()

    def wake(self) -> None:
        """Ask for a round soon (an arrival, completion or worker change)."""
        self.rounds.wake()

    def run_round(self) -> RoundReport:
        return self.rounds.run_round()

    # Jobs API ---------------------------------------------------------------------------------
    def submit(self, spec: common_pb2.JobSpec, key: str) -> tuple[JobRecord, bool]:
        return self.jobs.submit(spec, key)

    def get(self, job_id: str) -> JobRecord:
        return self.jobs.get(job_id)

    def list_jobs(
        self,
        *,
        tenant: str,
        states: Sequence[int],
        name_prefix: str,
        limit: int,
        after: tuple[float, str] | None,
    ) -> list[JobRecord]:
        return self.jobs.list_jobs(
            tenant=tenant, states=states, name_prefix=name_prefix, limit=limit, after=after
        )

    def cancel(self, job_id: str, reason: str) -> JobRecord:
        return self.jobs.cancel(job_id, reason)

    def scale(
        self,
        job_id: str,
        *,
        ps: int,
        workers: int,
        ps_cores: float,
        worker_cores: float,
        auto: bool,
        who: str,
    ) -> JobRecord:
        return self.jobs.scale(
            job_id,
            ps=ps,
            workers=workers,
            ps_cores=ps_cores,
            worker_cores=worker_cores,
            auto=auto,
            who=who,
        )

    def watch(self, job_id: str, after: int, active: Callable[[], bool]) -> Iterator[EventRecord]:
        return self.jobs.watch(job_id, after, active)

    def cluster_state(self) -> scheduler_pb2.ClusterState:
        if self.standby:
            return self.jobs.stored_cluster_state()
        return self.jobs.cluster_state()

    # Owners, for the authorization checks (gearshift.common.rpc_roles.Scopes) ------------
    def job_tenant(self, job_id: str) -> str | None:
        try:
            return self.jobs.get(job_id).spec.tenant
        except NotFoundError:
            return None

    def has_code(self, sha256: str) -> bool:
        return self.jobs.has_code(sha256)

    def upload_code(self, chunks: Iterable[common_pb2.CodeChunk]) -> tuple[str, bool]:
        return self.jobs.upload_code(chunks)

    def code(self, sha256: str) -> bytes:
        return self.jobs.code(sha256)

    def job_logs(
        self, job_id: str, rank: int, tail_lines: int, follow: bool, active: Callable[[], bool]
    ) -> Iterator[common_pb2.LogLine]:
        """The job's training-process output, from the workers (see job_logs)."""
        self.jobs.get(job_id)  # NOT_FOUND before any stream opens

        def ended() -> bool:
            return self.jobs.get(job_id).state in TERMINAL_STATES

        sources = LogSources(lambda: self._task_sources(job_id), ended, self.agents.logs, active)
        return job_log_lines(job_id, rank, tail_lines, follow, sources)

    def job_steps(self, job_id: str, after_step: int) -> list[common_pb2.StepLoss]:
        """The job's step log from `after_step` on, from a worker (see job_steps)."""
        self.jobs.get(job_id)  # NOT_FOUND for an unknown job
        return job_steps(job_id, after_step, self._task_sources(job_id), self.agents.step_log)

    def _task_sources(self, job_id: str) -> list[TaskSource]:
        """The job's tasks, ended ones too, oldest first, with their workers' addresses."""
        state = self.state
        known = {t.task_id: t for t in state.store.job_tasks(job_id)}
        with state.lock:
            known.update({t.task_id: t for t in state.open_tasks(job_id)})
            addresses = {w: r.address for w, r in state.workers.items()}
        if self.standby:
            addresses = {w.worker_id: w.address for w in state.store.workers()}
        ordered = sorted(known.values(), key=lambda t: (t.created_at, t.task_id))
        return [
            TaskSource(t.task_id, addresses.get(t.worker_id, ""), t.local_ranks, t.ended)
            for t in ordered
        ]

    # Workers API -------------------------------------------------------------------------------
    def register_worker(
        self,
        worker_id: str,
        address: str,
        hostname: str,
        devices: Sequence[common_pb2.DeviceGroup],
        tasks: Sequence[common_pb2.TaskStatus],
        *,
        cpu_cores: int = 0,
        memory_bytes: int = 0,
    ) -> WorkerRecord:
        return self.registry.register_worker(
            worker_id,
            address,
            hostname,
            devices,
            tasks,
            cpu_cores=cpu_cores,
            memory_bytes=memory_bytes,
        )

    def heartbeat(self, worker_id: str, tasks: Sequence[common_pb2.TaskStatus]) -> bool:
        return self.registry.heartbeat(worker_id, tasks)

    def heartbeats(
        self, beats: Sequence[tuple[str, Sequence[common_pb2.TaskStatus]]]
    ) -> list[bool]:
        return self.registry.heartbeats(beats)

    def renew_lease(self, worker_id: str, task_id: str) -> tuple[bool, common_pb2.Lease]:
        return self.registry.renew_lease(worker_id, task_id)

    def task_finished(self, worker_id: str, status: common_pb2.TaskStatus) -> None:
        self.registry.task_finished(worker_id, status)
