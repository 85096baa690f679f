"""The dashboard's gRPC side: the SDK (and stubs for what it lacks) per bearer token.

Each token a browser presents gets its own channels (a few are kept, least
recently used closed first), so the scheduler checks every request against the
token of the person who made it. A job's events are append-only: they are
cached per job and only the new ones are read on each refresh. The progress seen
at each refresh is kept too (PROGRESS events are throttled; a page that stays
open draws a finer curve).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from gearshift.client.dashboard.allocation import JobRun
from gearshift.client.dashboard.series import LossPoint
from gearshift.client.dashboard.step_cache import StepCache
from gearshift.client.sdk import Client
from gearshift.client.timeline import ProgressPoint, segments
from gearshift.common.auth import ClientTls
from gearshift.common.channel import connect
from gearshift.common.errors import GearshiftError, typed_call
from gearshift.common.facts import TERMINAL_STATES
from gearshift.v1 import brain_pb2, brain_pb2_grpc, common_pb2, scheduler_pb2, scheduler_pb2_grpc

MAX_SESSIONS = 16
MAX_CACHED_JOBS = 256
MAX_WINDOW_JOBS = 200  # jobs the allocation and tenants pages read the events of
UNFINISHED = [
    common_pb2.JOB_STATE_QUEUED,
    common_pb2.JOB_STATE_RUNNING,
    common_pb2.JOB_STATE_RESCALING,
]
LOG_TIMEOUT_SECONDS = 10.0


@dataclass
class Session:
    """The channels of one token: the SDK client, a jobs stub (logs), a Brain stub."""

    client: Client
    channel: grpc.Channel
    jobs_stub: scheduler_pb2_grpc.JobServiceStub
    brain: brain_pb2_grpc.BrainStub | None = None
    brain_channel: grpc.Channel | None = None

    def close(self) -> None:
        self.client.close()
        self.channel.close()
        if self.brain_channel is not None:
            self.brain_channel.close()


@dataclass
class JobHistory:
    """What the dashboard knows of a job: its events, and the progress seen at each read."""

    events: list[scheduler_pb2.JobEvent] = field(default_factory=list)
    seen: list[ProgressPoint] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def last(self) -> int:
        return self.events[-1].sequence if self.events else 0

    def copy(self) -> JobHistory:
        return JobHistory(list(self.events), list(self.seen))


class Gateway:
    """What the pages need from the scheduler (and the Brain), by token."""

    def __init__(
        self,
        scheduler: str,
        brain: str = "",
        default_token: str = "",
        timeout: float = 10.0,
        tls: ClientTls | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.tls = tls
        self.brain = brain
        self.default_token = default_token
        self.timeout = timeout
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._history: OrderedDict[str, JobHistory] = OrderedDict()
        self._steps = StepCache()
        self._lock = threading.Lock()

    def session(self, token: str) -> Session:
        token = token or self.default_token
        with self._lock:
            found = self._sessions.get(token)
            if found is not None:
                self._sessions.move_to_end(token)
                return found
            session = self._open(token)
            self._sessions[token] = session
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)[1].close()
            return session

    def _open(self, token: str) -> Session:
        client = Client(self.scheduler, token or None, tls=self.tls, timeout=self.timeout)
        channel = connect(self.scheduler, token=token or None, tls=self.tls, timeout=self.timeout)
        session = Session(client, channel, scheduler_pb2_grpc.JobServiceStub(channel))
        if self.brain:
            session.brain_channel = connect(
                self.brain, token=token or None, tls=self.tls, timeout=self.timeout
            )
            session.brain = brain_pb2_grpc.BrainStub(session.brain_channel)
        return session

    def close(self) -> None:
        with self._lock:
            for session in self._sessions.values():
                session.close()
            self._sessions.clear()

    # -- what the pages read ---------------------------------------------------------

    def check_token(self, token: str) -> None:
        """A cheap authorized call; UnauthenticatedError when the scheduler refuses the token."""
        self.session(token).client.list(page_size=1)

    def jobs(
        self,
        token: str,
        *,
        states: Sequence[common_pb2.JobState.ValueType] = (),
        tenant: str = "",
        name_prefix: str = "",
        limit: int = 200,
    ) -> scheduler_pb2.ListJobsResponse:
        return self.session(token).client.list(
            tenant=tenant, states=list(states), name_prefix=name_prefix, page_size=limit
        )

    def job(self, token: str, job_id: str) -> scheduler_pb2.Job:
        return self.session(token).client.get(job_id)

    def history(self, token: str, job: scheduler_pb2.Job) -> JobHistory:
        """Every event of the job so far (cached: only new ones are read), and its progress
        as seen at each call while it ran."""
        with self._lock:
            cached = self._history.get(job.job_id)
            if cached is None:
                cached = self._history[job.job_id] = JobHistory()
            self._history.move_to_end(job.job_id)
            while len(self._history) > MAX_CACHED_JOBS:
                self._history.popitem(last=False)
        with cached.lock:
            if job.last_sequence > cached.last:
                new = self.session(token).client.events(job.job_id, after_sequence=cached.last)
                cached.events.extend(e for e in new if e.sequence > cached.last)
            step = job.progress.step
            if job.state not in TERMINAL_STATES and step > (
                cached.seen[-1].step if cached.seen else 0
            ):
                p = job.progress
                cached.seen.append(ProgressPoint(time.time(), step, p.loss, p.samples_per_second))
            return cached.copy()

    def steps(self, token: str, job: scheduler_pb2.Job) -> list[LossPoint]:
        """Every step of the job's step log so far (cached: only new steps are read)."""
        client = self.session(token).client
        return self._steps.read(job.job_id, job.state in TERMINAL_STATES, client.steps)

    def runs(self, token: str, since: float) -> tuple[list[JobRun], bool]:
        """The placements of the jobs that ran at some time after `since` (their events
        cached as the job page's are), and whether some may be missing: more than
        MAX_WINDOW_JOBS, or older jobs beyond the newest listed."""
        client = self.session(token).client
        recent = client.list(page_size=MAX_WINDOW_JOBS)
        unfinished = client.list(states=UNFINISHED, page_size=MAX_WINDOW_JOBS)
        found = {j.job_id: j for j in [*recent.jobs, *unfinished.jobs]}
        ran = sorted(
            (
                j
                for j in found.values()
                if j.started_at and (not j.finished_at or j.finished_at >= since)
            ),
            key=lambda j: -j.started_at,
        )
        truncated = len(ran) > MAX_WINDOW_JOBS or bool(unfinished.next_page_token)
        if recent.next_page_token and recent.jobs:
            truncated |= min(j.submitted_at for j in recent.jobs) > since
        runs = []
        for job in ran[:MAX_WINDOW_JOBS]:
            events = self.history(token, job).events
            runs.append(
                JobRun(job.job_id, job.spec.name, job.spec.tenant or "default", segments(events))
            )
        return runs, truncated

    def cancel(self, token: str, job_id: str, reason: str) -> scheduler_pb2.Job:
        return self.session(token).client.cancel(job_id, reason=reason)

    def cluster(self, token: str) -> scheduler_pb2.ClusterState:
        return self.session(token).client.cluster()

    def logs(self, token: str, job_id: str, lines: int) -> list[common_pb2.LogLine]:
        """The last `lines` lines of every rank (StreamJobLogs without follow)."""
        stub = self.session(token).jobs_stub
        request = scheduler_pb2.StreamJobLogsRequest(
            job_id=job_id, rank=-1, tail_lines=lines, follow=False
        )
        return typed_call(lambda: list(stub.StreamJobLogs(request, timeout=LOG_TIMEOUT_SECONDS)))

    def brain_samples(self, token: str, job_id: str, limit: int = 1000) -> brain_pb2.JobHistory:
        """The job's runtime samples as the Brain recorded them (GearshiftError if it cannot)."""
        brain = self.session(token).brain
        if brain is None:
            raise GearshiftError("no Brain address was given (--brain)")
        request = brain_pb2.GetJobHistoryRequest(job_id=job_id, max_samples=limit)
        return typed_call(lambda: brain.GetJobHistory(request, timeout=self.timeout))
