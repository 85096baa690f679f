"""The Python SDK: a thin, typed wrapper over the scheduler's jobs API.

Errors come back as the typed GearshiftError subclasses of gearshift.common.errors
(ValidationError, NotFoundError, ...), carrying the server's message.
"""

from __future__ import annotations

import builtins
import functools
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import grpc

from gearshift.common import codepkg
from gearshift.common.auth import ClientTls
from gearshift.common.channel import DEFAULT_TIMEOUT_SECONDS, connect
from gearshift.common.errors import DeadlineExceededError, error_from_rpc, rpc_code, typed_call
from gearshift.common.facts import TERMINAL_STATES
from gearshift.common.leader_follow import standby_leader
from gearshift.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

P = ParamSpec("P")
R = TypeVar("R")

_RETRY_WATCH = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}

UPLOAD_TIMEOUT_SECONDS = 300.0
Job = scheduler_pb2.Job
JobEvent = scheduler_pb2.JobEvent
JobSpec = common_pb2.JobSpec


@dataclass(frozen=True)
class CodeUpload:
    sha256: str
    uploaded: bool  # False: the scheduler had it already, nothing was sent
    size: int  # bytes of the package
    files: int


def _typed_errors(fn: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        return typed_call(lambda: fn(*args, **kwargs))

    return call


class Client:
    """Talks to a Gearshift scheduler. Use as a context manager, or call close().

    `address` may name a leader and its standbys, IP:PORT comma-separated: calls go to
    the one that serves, and after a takeover to the new leader (channel_target).

    `standby_leader` says who answered this client's last read (get, list, cluster): None
    when a leading scheduler did; when a standby did (from the database, as the leader last
    committed it, without queue positions or waiting reasons), the leader it named ("" while
    no leader is known: a takeover under way)."""

    def __init__(
        self,
        address: str = "127.0.0.1:50051",
        token: str | None = None,
        *,
        tls: ClientTls | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self._channel = connect(address, token=token, tls=tls, timeout=timeout)
        self._jobs = scheduler_pb2_grpc.JobServiceStub(self._channel)
        self.standby_leader: str | None = None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @_typed_errors
    def submit(
        self,
        spec: JobSpec,
        idempotency_key: str | None = None,
        *,
        working_dir: str | Path | None = None,
    ) -> Job:
        """Submit a job; retries are safe because every call carries an idempotency key.

        With `working_dir` (a folder, or one .py file), the job runs the user's own code:
        it is packaged and uploaded first (only if the scheduler lacks it) and
        `spec.entrypoint.module` is imported from it on the workers."""
        if working_dir is not None:
            upload = self.upload_code(working_dir)
            spec = JobSpec.FromString(spec.SerializeToString())
            spec.entrypoint.code_sha256 = upload.sha256
        key = idempotency_key or uuid.uuid4().hex
        reply = self._jobs.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec, idempotency_key=key))
        return reply.job

    @_typed_errors
    def upload_code(self, path: str | Path) -> CodeUpload:
        """Package a folder (or one file) and upload it unless the scheduler has it."""
        package = codepkg.package(Path(path))
        present = self._jobs.HasCode(scheduler_pb2.HasCodeRequest(sha256=package.sha256)).present
        if not present:
            self._jobs.UploadCode(
                codepkg.chunks(package.sha256, package.data), timeout=UPLOAD_TIMEOUT_SECONDS
            )
        return CodeUpload(package.sha256, not present, len(package.data), len(package.files))

    def logs(
        self, job_id: str, rank: int = -1, tail_lines: int = 0, follow: bool = False
    ) -> Iterator[common_pb2.LogLine]:
        """The job's training-process output: the last lines of each rank (or of `rank`),
        then with `follow` new lines as they are written, until the job ends."""
        request = scheduler_pb2.StreamJobLogsRequest(
            job_id=job_id, rank=rank, tail_lines=tail_lines, follow=follow
        )
        try:
            yield from self._jobs.StreamJobLogs(request, timeout=None if follow else self.timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    @_typed_errors
    def steps(self, job_id: str, after_step: int = 0) -> list[common_pb2.StepLoss]:
        """The job's step log: the mean loss of every global step after `after_step`."""
        request = scheduler_pb2.StreamJobStepsRequest(job_id=job_id, after_step=after_step)
        return list(self._jobs.StreamJobSteps(request, timeout=self.timeout))

    def _read(self, method: Any, request: Any) -> Any:
        """A unary read, noting in `standby_leader` whether a standby answered it."""
        reply, call = method.with_call(request)
        self.standby_leader = standby_leader(call.initial_metadata())
        return reply

    @_typed_errors
    def get(self, job_id: str) -> Job:
        job: Job = self._read(self._jobs.GetJob, scheduler_pb2.GetJobRequest(job_id=job_id))
        return job

    @_typed_errors
    def list(
        self,
        tenant: str = "",
        states: list[common_pb2.JobState.ValueType] | None = None,
        name_prefix: str = "",
        page_size: int = 0,
        page_token: str = "",
    ) -> scheduler_pb2.ListJobsResponse:
        page: scheduler_pb2.ListJobsResponse = self._read(
            self._jobs.ListJobs,
            scheduler_pb2.ListJobsRequest(
                tenant=tenant,
                states=states or [],
                name_prefix=name_prefix,
                page=common_pb2.PageRequest(page_size=page_size, page_token=page_token),
            ),
        )
        return page

    @_typed_errors
    def cancel(self, job_id: str, reason: str = "") -> Job:
        return self._jobs.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job_id, reason=reason))

    @_typed_errors
    def scale(
        self,
        job_id: str,
        ps: int = 0,
        workers: int = 0,
        *,
        ps_cores: float = 0.0,
        worker_cores: float = 0.0,
        auto: bool = False,
    ) -> Job:
        """Set a parameter-server job's counts (pinned over the Brain's plans; applied at
        the next round by a checkpointed restart), or with `auto` clear them."""
        return self._jobs.ScaleJob(
            scheduler_pb2.ScaleJobRequest(
                job_id=job_id,
                ps=ps,
                workers=workers,
                ps_cores=ps_cores,
                worker_cores=worker_cores,
                auto=auto,
            )
        )

    def watch(self, job_id: str, after_sequence: int = 0) -> Iterator[JobEvent]:
        """Yield the job's events until it ends."""
        try:
            yield from self._jobs.WatchJob(
                scheduler_pb2.WatchJobRequest(job_id=job_id, after_sequence=after_sequence)
            )
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    def events(self, job_id: str, after_sequence: int = 0) -> builtins.list[JobEvent]:
        """The job's events so far (those after `after_sequence`), without waiting for more.

        Reads the job's event stream up to the latest event GetJob reports, then closes it.
        """
        last = self.get(job_id).last_sequence
        if last <= after_sequence:
            return []
        request = scheduler_pb2.WatchJobRequest(job_id=job_id, after_sequence=after_sequence)
        call: Any = self._jobs.WatchJob(request, timeout=self.timeout)  # also a grpc.Call
        out: builtins.list[JobEvent] = []
        try:
            for event in call:
                out.append(event)
                if event.sequence >= last:
                    break
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        finally:
            call.cancel()
        return out

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Block until the job ends (succeeded, failed or cancelled) and return it.

        Follows the job's event stream and reconnects after a dropped stream
        (e.g. a scheduler restart) from the last event seen, so no event is
        missed. Raises DeadlineExceededError after `timeout` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        after = 0
        while True:
            job = self.get(job_id)
            if job.state in TERMINAL_STATES:
                return job
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise DeadlineExceededError(
                    f"job {job_id!r} still {common_pb2.JobState.Name(job.state)} after {timeout}s"
                )
            request = scheduler_pb2.WatchJobRequest(job_id=job_id, after_sequence=after)
            try:
                for event in self._jobs.WatchJob(request, timeout=remaining):
                    after = event.sequence
                    if event.state in TERMINAL_STATES:
                        break
            except grpc.RpcError as exc:
                if rpc_code(exc) not in _RETRY_WATCH:
                    raise error_from_rpc(exc) from None
                if rpc_code(exc) == grpc.StatusCode.UNAVAILABLE:
                    time.sleep(0.5)  # the scheduler is restarting; the channel reconnects

    @_typed_errors
    def cluster(self) -> scheduler_pb2.ClusterState:
        state: scheduler_pb2.ClusterState = self._read(
            self._jobs.GetClusterState, scheduler_pb2.GetClusterStateRequest()
        )
        return state
