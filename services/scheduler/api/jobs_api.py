"""The jobs API's domain: submit, get, list, cancel and watch jobs; the cluster's state."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from gearshift.common.codepkg import assemble
from gearshift.common.errors import (
    NotFoundError,
    PreconditionError,
    ResourceExhaustedError,
    ValidationError,
)
from gearshift.common.facts import total_steps
from gearshift.common.jobspec import is_ps_job
from gearshift.scheduler.api.cluster_view import ClusterView
from gearshift.scheduler.plugins.dlrover import plan_book, ps_jobs
from gearshift.scheduler.plugins.rubick.guarantees import Admission
from gearshift.scheduler.plugins.rubick.tenants import Quotas
from gearshift.scheduler.round.task_control import TaskControl
from gearshift.scheduler.state.records import EventRecord, JobRecord
from gearshift.scheduler.state.state import SchedulerState, new_job_id
from gearshift.v1 import common_pb2, scheduler_pb2

log = logging.getLogger("gearshift.scheduler")
C = common_pb2
STORE_POLL_SECONDS = 1.0  # a standby's watch: how often it reads the leader's events
S = scheduler_pb2


class JobsApi:
    """Jobs as users see them."""

    def __init__(
        self,
        state: SchedulerState,
        control: TaskControl,
        wake: Callable[[], None],
        round_number: Callable[[], int],
        stopped: Callable[[], bool],
        *,
        tenancy: Callable[[], tuple[Quotas, Mapping[str, Admission]]] | None = None,
        ps_plans: ps_jobs.PsPlans | None = None,
    ) -> None:
        self.state = state
        self.ps_plans = ps_plans
        self.tenancy = tenancy or (lambda: (Quotas(), {}))
        self.control = control
        self.wake = wake
        self.round_number = round_number
        self.stopped = stopped
        self._view = ClusterView()

    def submit(self, spec: common_pb2.JobSpec, key: str) -> tuple[JobRecord, bool]:
        """Create a job (spec already validated and defaulted); same key -> same job."""
        state = self.state
        code = spec.entrypoint.code_sha256
        if code and not state.store.has_code(code):
            raise PreconditionError(
                f"spec.entrypoint.code_sha256: no code package {code[:12]}... on this scheduler; "
                "upload it first (UploadCode; the SDK and CLI do it for you)"
            )
        # A key is looked up only when the insert or the queue's limit refuses the job: the
        # SDK sends one with every submission, and a lookup first cost each a round trip.
        try:
            self._check_queue(spec.tenant)
        except ResourceExhaustedError:
            existing = state.store.find_job_by_key(key) if key else None
            if existing is not None:  # a retry of a job that was taken
                return existing, False
            raise
        # Written outside the lock (a database round trip would hold up every heartbeat); the
        # idempotency key is unique in the database, which decides between concurrent calls.
        now = state.clock()
        job = JobRecord(
            job_id=new_job_id(),
            spec=spec,
            state=C.JOB_STATE_QUEUED,
            submitted_at=now,
            idempotency_key=key or None,
            last_sequence=1,
        )
        job.progress.total_steps = total_steps(spec)
        event = EventRecord(job.job_id, 1, now, S.JOB_EVENT_TYPE_SUBMITTED, job.state, "")
        try:
            state.store.create_job(job, event)
        except Exception:
            existing = state.store.find_job_by_key(key) if key else None
            if existing is not None:  # taken before, or by a concurrent call with the key
                return existing, False
            raise
        with state.lock:
            state.add(job)
            state.changed.notify_all()
            state.tell_brain(event, job)
        log.info("job submitted", extra={"job_id": job.job_id, "job_name": spec.name})
        self.wake()
        return job, True

    def _check_queue(self, tenant: str) -> None:
        """A tenant's queued jobs stay under limits.maxQueuedJobs. Read without the lock (a
        set's length is read whole): the job is added in a later hold, after its insert,
        so concurrent submissions could pass the check together with the lock too; taken,
        it made each submission wait for the rounds' holds twice (bench/load.py)."""
        limit = self.state.settings.max_queued_jobs
        queued = len(self.state.queued.get(tenant, ()))
        if queued >= limit:
            raise ResourceExhaustedError(
                f"tenant {tenant!r} has {queued} queued jobs, the limit (limits.maxQueuedJobs); "
                "wait for some to start or cancel some"
            )

    # Code packages ------------------------------------------------------------------------
    def has_code(self, sha256: str) -> bool:
        return self.state.store.has_code(sha256)

    def upload_code(self, chunks: Iterable[common_pb2.CodeChunk]) -> tuple[str, bool]:
        """Store a package once: (its hash, whether it was stored now)."""
        sha256, data = assemble(chunks)
        stored = self.state.store.put_code(sha256, data)
        log.info("code package", extra={"sha256": sha256, "size": len(data), "stored": stored})
        return sha256, stored

    def code(self, sha256: str) -> bytes:
        data = self.state.store.get_code(sha256)
        if data is None:
            raise NotFoundError("code package", sha256)
        return data

    def get(self, job_id: str) -> JobRecord:
        """The job as memory has it, once what memory says of it is committed: the holds
        that changed it commit after letting the lock go (locked_batch), and a state a
        client was shown must not be taken back by a crash (a job shown RUNNING, then a
        kill: it came back QUEUED and its task's failure no longer counted)."""
        with self.state.lock:
            job = self.state.jobs.get(job_id)
        if job is not None:
            self.state.store.settle()
            return job
        stored = self._stored(job_id)
        if stored is None:
            raise NotFoundError("job", job_id)
        return stored

    def _stored(self, job_id: str) -> JobRecord | None:
        """A job no longer in memory, as the database has it once the commits of the holds
        let go are in (the hold that ended it may still be committing: locked_batch)."""
        self.state.store.settle()
        return self.state.store.get_job(job_id)

    def list_jobs(
        self,
        *,
        tenant: str,
        states: Sequence[int],
        name_prefix: str,
        limit: int,
        after: tuple[float, str] | None,
    ) -> list[JobRecord]:
        """The stored jobs, with what only memory holds of a live one (its reason, queue
        position and estimated start: round/reasons.py)."""
        jobs = self.state.store.list_jobs(
            tenant=tenant, states=states, name_prefix=name_prefix, limit=limit, after=after
        )
        with self.state.lock:
            live = [self.state.jobs.get(job.job_id) for job in jobs]
        for job, held in zip(jobs, live, strict=True):
            if held is not None:
                job.reason, job.reason_since = held.reason, held.reason_since
                job.queue_position, job.estimated_start = held.queue_position, held.estimated_start
        return jobs

    def cancel(self, job_id: str, reason: str) -> JobRecord:
        state = self.state
        with state.lock:
            job = state.jobs.get(job_id)
            if job is None:
                stored = self._stored(job_id)
                if stored is None:
                    raise NotFoundError("job", job_id)
                raise PreconditionError(
                    f"job {job_id!r} already ended ({C.JobState.Name(stored.state)})"  # type: ignore[arg-type]
                )
            tasks = state.open_tasks(job_id)
            message = reason or "cancelled by a user"
            state.finish(job, C.JOB_STATE_CANCELLED, S.JOB_EVENT_TYPE_CANCELLED, message)
        self.control.kill(tasks, "job cancelled")
        self.wake()
        return job

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
        """Pin a PS job's counts (or, with `auto`, hand it back to the Brain's plans). A
        change of shape is applied by the next round (stop -> restart, PLAN event then);
        the running shape is announced at once. Bad input changes nothing."""
        state = self.state
        with state.lock:
            job = state.jobs.get(job_id)
            if job is None:
                stored = self._stored(job_id)
                if stored is None:
                    raise NotFoundError("job", job_id)
                raise PreconditionError(
                    f"job {job_id!r} already ended ({C.JobState.Name(stored.state)})"  # type: ignore[arg-type]
                )
            if not is_ps_job(job.spec) or self.ps_plans is None:
                raise PreconditionError(
                    f"job {job_id!r} is not a parameter-server job (spec.parameter_server is "
                    "unset): only a PS job's process counts can be set"
                )
            if auto:
                if ps or workers or ps_cores or worker_cores:
                    raise ValidationError(
                        "auto", "clears the pinned counts: leave ps, workers and cores unset"
                    )
                if self.ps_plans.unpin(job_id):
                    job.ps_pin = ""  # saved with the event
                    state.record(
                        job, S.JOB_EVENT_TYPE_PLAN, f"sized by the Brain's plans again (by {who})"
                    )
                return job
            budget = ps_jobs.slot_cores(
                [
                    (w.cpu_cores, sum(g.count for g in w.devices))
                    for w in state.workers.values()
                    if w.alive
                ]
            )
            plan = ps_jobs.pinned(
                job.spec,
                self.ps_plans.plan(job_id),
                ps=ps,
                workers=workers,
                ps_cores=ps_cores,
                worker_cores=worker_cores,
                budget=budget,
                who=who,
            )
            running = job.state == C.JOB_STATE_RUNNING
            restart = self.ps_plans.pin(job_id, plan, running=running)
            job.ps_pin = plan_book.dump(plan)  # a restarted scheduler keeps the pin
            log.info(
                "PS counts set",
                extra={"job_id": job_id, "plan": ps_jobs.describe(plan), "restart": restart},
            )
            if not restart:
                job.resource_plan = ps_jobs.describe(plan)
                job.ps_plan = job.ps_pin
                state.record(job, S.JOB_EVENT_TYPE_PLAN, job.resource_plan + " (already running)")
            else:
                state.store.save_job(job)
        self.wake()
        return job

    def watch(self, job_id: str, after: int, active: Callable[[], bool]) -> Iterator[EventRecord]:
        """Events after `after` until the job ends (and its last event is sent)."""
        self.get(job_id)  # NotFoundError for an unknown job
        state = self.state
        sequence = after
        while active() and not self.stopped():
            events = state.store.events_after(job_id, sequence)
            for event in events:
                sequence = event.sequence
                yield event
            if events:
                continue
            with state.changed:
                job = state.jobs.get(job_id)
                if job is not None and job.last_sequence <= sequence:
                    state.changed.wait(timeout=1.0)
                    continue
            # Memory is ahead of what the database gave: the hold that recorded the events
            # (or ended the job) commits after letting the lock go (Store.locked_batch).
            if job is None:
                final = self._stored(job_id)
                if final is None or (final.last_sequence <= sequence and final.terminal):
                    return
                if final.last_sequence <= sequence:
                    # A live job that memory does not hold: a standby's (api/standby.py),
                    # which polls the store for the leader's events.
                    with state.changed:
                        state.changed.wait(timeout=STORE_POLL_SECONDS)
            else:
                state.store.settle()

    def stored_cluster_state(self) -> S.ClusterState:
        """The cluster as the store has it: a standby's answer (api/standby.py), without
        what only a leader's memory holds (the tenants' admissions; reasons)."""
        store = self.state.store
        workers, jobs = store.workers(), store.active_jobs()
        queued = Counter(job.spec.tenant for job in jobs if job.state == C.JOB_STATE_QUEUED)
        out = S.ClusterState(
            round=int(store.get_state("round") or 0),
            round_seconds=self.state.settings.round_seconds,
            policy=self._policy(),
        )
        return self._view.build(workers, jobs, out, queued=queued, quotas=Quotas(), admitted={})

    def _policy(self) -> str:
        settings = self.state.settings
        return settings.policy + (" (elastic)" if settings.elastic else "")

    def cluster_state(self) -> S.ClusterState:
        """Built outside the lock from the records taken under it (cluster_view.py). Built
        under the lock, each call held up every heartbeat and submission for 30-100 ms at
        1,000 workers and 5,000 jobs (bench/load.py)."""
        state = self.state
        with state.lock:
            workers = list(state.workers.values())
            jobs = list(state.jobs.values())
            queued = {tenant: len(ids) for tenant, ids in state.queued.items()}
            quotas, admitted = self.tenancy()
            round_number = self.round_number()
        out = S.ClusterState(
            round=round_number, round_seconds=state.settings.round_seconds, policy=self._policy()
        )
        return self._view.build(workers, jobs, out, queued=queued, quotas=quotas, admitted=admitted)
