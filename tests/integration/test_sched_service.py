"""The scheduler as a real process over real gRPC, with the real PostgreSQL, driving worker
daemons played by real in-process gRPC WorkerAgent servers that record StartTask/StopTask
and heartbeat like the worker daemon will."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from gearshift.client.processes import DaemonProcess
from gearshift.common import codepkg
from gearshift.common.channel import connect
from gearshift.common.config import merged
from gearshift.common.ports import free_port_in
from gearshift.v1 import (
    brain_pb2,
    brain_pb2_grpc,
    common_pb2,
    scheduler_pb2,
    scheduler_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from tests.conftest import DaemonFactory
from tests.helpers import scheduler_config, single_seed, wait_until

S = scheduler_pb2
C = common_pb2
WAIT = 30.0


class RecordingAgent(worker_pb2_grpc.WorkerAgentServicer):
    """WorkerAgent that records calls and keeps task states like a worker daemon would."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starts: list[worker_pb2.StartTaskRequest] = []
        self.stops: list[worker_pb2.StopTaskRequest] = []
        self.tasks: dict[str, C.TaskStatus] = {}

    def StartTask(
        self, request: worker_pb2.StartTaskRequest, context: grpc.ServicerContext
    ) -> C.TaskStatus:
        with self.lock:
            self.starts.append(request)
            status = self.tasks.setdefault(
                request.task_id,
                C.TaskStatus(
                    task_id=request.task_id, job_id=request.job_id, state=C.TASK_STATE_RUNNING
                ),
            )
            return status

    def StopTask(
        self, request: worker_pb2.StopTaskRequest, context: grpc.ServicerContext
    ) -> C.TaskStatus:
        with self.lock:
            self.stops.append(request)
            status = self.tasks.setdefault(request.task_id, C.TaskStatus(task_id=request.task_id))
            if status.state == C.TASK_STATE_RUNNING:
                status.state = (
                    C.TASK_STATE_CHECKPOINTED if request.checkpoint else C.TASK_STATE_FAILED
                )
                if request.checkpoint:
                    status.checkpoint_path = f"/ckpt/{request.task_id}"
            return status

    def running(self) -> list[C.TaskStatus]:
        with self.lock:
            return [
                C.TaskStatus(task_id=t.task_id, job_id=t.job_id, state=t.state)
                for t in self.tasks.values()
                if t.state == C.TASK_STATE_RUNNING
            ]


@dataclass
class FakeWorker:
    """A worker daemon stand-in: a WorkerAgent server plus a heartbeat thread."""

    worker_id: str
    scheduler: str
    devices: Sequence[C.DeviceGroup]
    agent: RecordingAgent = field(default_factory=RecordingAgent)

    def __post_init__(self) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        worker_pb2_grpc.add_WorkerAgentServicer_to_server(self.agent, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.address = f"127.0.0.1:{port}"
        self.channel = fresh_channel(self.scheduler)
        self.registry = scheduler_pb2_grpc.WorkerRegistryStub(self.channel)
        self.beating = threading.Event()
        self.closed = threading.Event()
        self.reregistrations = 0
        self.register()
        self.beating.set()
        self.thread = threading.Thread(target=self._beat, daemon=True)
        self.thread.start()

    def register(self) -> None:
        reply = self.registry.RegisterWorker(
            S.RegisterWorkerRequest(
                worker_id=self.worker_id,
                address=self.address,
                hostname="test",
                devices=self.devices,
                tasks=self.agent.running(),
            )
        )
        self.interval = reply.heartbeat_interval_seconds

    def _beat(self) -> None:
        while not self.closed.wait(self.interval):
            if not self.beating.is_set():
                continue
            try:
                reply = self.registry.Heartbeat(
                    S.HeartbeatRequest(worker_id=self.worker_id, tasks=self.agent.running()),
                    wait_for_ready=True,
                    timeout=5,
                )
                if reply.reregister:
                    self.reregistrations += 1
                    self.register()
            except grpc.RpcError:
                pass  # the scheduler restarts in some tests

    def finish(self, task_id: str, state: int, digest: str = "") -> None:
        with self.agent.lock:
            status = self.agent.tasks[task_id]
            status.state = state  # type: ignore[assignment]
            status.digest = digest
            final = C.TaskStatus()
            final.CopyFrom(status)
        # wait_for_ready: after a scheduler restart the channel may still be backing off.
        self.registry.TaskFinished(
            S.TaskFinishedRequest(worker_id=self.worker_id, status=final),
            wait_for_ready=True,
            timeout=WAIT,
        )

    def close(self) -> None:
        self.closed.set()
        self.server.stop(0)
        self.channel.close()


@pytest.fixture
def workers() -> Iterator[list[FakeWorker]]:
    started: list[FakeWorker] = []
    yield started
    for worker in started:
        worker.close()


def start_scheduler(
    daemons: DaemonFactory,
    folder: Path,
    db: str,
    *extra: str,
    policy: str = "easyscale",
    **sections: Any,
) -> DaemonProcess:
    """A scheduler on `db` with the old defaults (`single_seed`), 1 s rounds and quick heartbeats;
    `extra` process flags; `sections` laid over the file (its keys: `cluster={"brainAddress":
    ...}`), its file written in `folder`."""
    quick = {
        "round": {"seconds": 1},
        "heartbeats": {"intervalSeconds": 0.3, "timeoutSeconds": 2},
        "limits": {"stopTimeoutSeconds": 5},
    }
    config = merged(merged(single_seed(policy), quick), sections)
    return daemons("scheduler", ["--database-url", db, *scheduler_config(folder, **config), *extra])


def scheduler(
    daemons: DaemonFactory,
    folder: Path,
    db: str,
    *extra: str,
    policy: str = "easyscale",
    **sections: Any,
) -> str:
    return start_scheduler(daemons, folder, db, *extra, policy=policy, **sections).address


def fresh_channel(address: str) -> grpc.Channel:
    """A channel of its own (not sharing gRPC's global subchannels, whose reconnect backoff
    outlives a restarted scheduler) that reconnects within 0.3 s, as a worker daemon would."""
    return grpc.insecure_channel(
        address,
        options=[
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 300),
        ],
    )


def spec(name: str = "job", ests: int = 2, **kw: object) -> C.JobSpec:
    out = C.JobSpec(
        name=name,
        entrypoint=C.Entrypoint(module="gearshift.examples.mlp"),
        num_ests=ests,
        global_batch_size=8 * ests,
        total_steps=100,
        dataset=C.DatasetSpec(name="digits", size=1000, shard_size=10),
    )
    for key, value in kw.items():
        if key == "max_devices":
            out.elastic.max_devices = int(value)  # type: ignore[call-overload]
        elif key == "tenant":
            out.tenant = str(value)
    return out


def cpus(count: int) -> list[C.DeviceGroup]:
    return [C.DeviceGroup(accelerator_type="cpu", count=count)]


def events(jobs: scheduler_pb2_grpc.JobServiceStub, job_id: str) -> list[S.JobEvent]:
    """Every event so far (the stream is cut after a short deadline)."""
    out: list[S.JobEvent] = []
    try:
        for event in jobs.WatchJob(S.WatchJobRequest(job_id=job_id), timeout=1.5):
            out.append(event)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    return out


def kinds(evs: Sequence[S.JobEvent]) -> list[str]:
    return [S.JobEventType.Name(e.type).removeprefix("JOB_EVENT_TYPE_") for e in evs]


def job_state(jobs: scheduler_pb2_grpc.JobServiceStub, job_id: str) -> int:
    return jobs.GetJob(S.GetJobRequest(job_id=job_id)).state


def test_submit_list_get_watch_cancel(
    daemons: DaemonFactory, tmp_path: Path, postgres_db: str, workers: list[FakeWorker]
) -> None:
    address = scheduler(daemons, tmp_path, postgres_db)
    workers.append(FakeWorker("w1", address, cpus(2)))
    with connect(address) as channel:
        jobs = scheduler_pb2_grpc.JobServiceStub(channel)
        ids = [
            jobs.SubmitJob(S.SubmitJobRequest(spec=spec(name, tenant=tenant))).job.job_id
            for name, tenant in [("a-1", "team-a"), ("a-2", "team-a"), ("b-1", "team-b")]
        ]
        first = ids[0]
        wait_until(lambda: job_state(jobs, first) == C.JOB_STATE_RUNNING, WAIT, "first job runs")
        job = jobs.GetJob(S.GetJobRequest(job_id=first))
        assert job.spec.tenant == "team-a" and job.spec.elastic.max_devices == 2
        assert job.started_at >= job.submitted_at > 0
        assert {p.worker_id for p in job.placement.processes} == {"w1"}
        started = [r for r in workers[0].agent.starts if r.job_id == first]
        for request in started:  # it may have been rescaled as the others arrived
            ranks = [p.rank for p in request.placement.processes if p.worker_id == "w1"]
            assert list(request.local_ranks) == ranks
            assert sorted(e for p in request.placement.processes for e in p.est_ids) == [0, 1]
            assert request.checkpoint_dir.endswith(first) and request.dataset_id == first

        named = jobs.ListJobs(S.ListJobsRequest(name_prefix="a-")).jobs
        assert [j.job_id for j in named] == [ids[1], ids[0]]  # newest first
        assert [j.job_id for j in jobs.ListJobs(S.ListJobsRequest(tenant="team-b")).jobs] == [
            ids[2]
        ]
        paged: list[str] = []
        token = ""
        while True:
            page = jobs.ListJobs(
                S.ListJobsRequest(page=C.PageRequest(page_size=1, page_token=token))
            )
            paged += [j.job_id for j in page.jobs]
            token = page.next_page_token
            if not token:
                break
        assert set(ids) <= set(paged) and len(paged) == len(set(paged))

        cancelled = jobs.CancelJob(S.CancelJobRequest(job_id=first, reason="changed my mind"))
        assert cancelled.state == C.JOB_STATE_CANCELLED
        assert cancelled.message == "changed my mind"
        # The stream ends by itself once the job has ended.
        streamed = list(jobs.WatchJob(S.WatchJobRequest(job_id=first), timeout=WAIT))
        assert kinds(streamed)[0] == "SUBMITTED" and kinds(streamed)[-1] == "CANCELLED"
        assert "STARTED" in kinds(streamed)
        assert [e.sequence for e in streamed] == list(range(1, len(streamed) + 1))
        replay = list(
            jobs.WatchJob(S.WatchJobRequest(job_id=first, after_sequence=2), timeout=WAIT)
        )
        assert [e.sequence for e in replay] == list(range(3, len(streamed) + 1))
        wait_until(
            lambda: not [t for t in workers[0].agent.running() if t.job_id == first],
            WAIT,
            "the cancelled job's tasks are stopped",
        )
        with pytest.raises(grpc.RpcError) as exc:
            jobs.CancelJob(S.CancelJobRequest(job_id=first))
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.RpcError) as exc:
            jobs.GetJob(S.GetJobRequest(job_id="job-nope"))
        assert exc.value.code() == grpc.StatusCode.NOT_FOUND
        # The freed devices go to the others.
        wait_until(
            lambda: all(job_state(jobs, j) == C.JOB_STATE_RUNNING for j in ids[1:]),
            WAIT,
            "the other jobs run",
        )
        state = jobs.GetClusterState(S.GetClusterStateRequest())
        assert [w.worker_id for w in state.workers] == ["w1"] and state.workers[0].alive
        assert {a.job_id for a in state.allocations} == set(ids[1:])
        assert state.policy == "easyscale" and state.round_seconds == 1.0


def test_submissions_are_idempotent_by_key(
    daemons: DaemonFactory, tmp_path: Path, postgres_db: str
) -> None:
    address = scheduler(daemons, tmp_path, postgres_db)
    with connect(address) as channel:
        jobs = scheduler_pb2_grpc.JobServiceStub(channel)
        request = S.SubmitJobRequest(spec=spec("once"), idempotency_key="key-1")
        with futures.ThreadPoolExecutor(max_workers=4) as pool:
            replies = list(pool.map(lambda _: jobs.SubmitJob(request), range(4)))
        assert len({r.job.job_id for r in replies}) == 1
        assert sum(r.created for r in replies) == 1
        again = jobs.SubmitJob(request)
        assert not again.created and again.job.job_id == replies[0].job.job_id
        other = jobs.SubmitJob(S.SubmitJobRequest(spec=spec("once"), idempotency_key="key-2"))
        assert other.created and other.job.job_id != again.job.job_id


def _mutate(field: str) -> C.JobSpec:
    out = spec()
    if field == "spec.name":
        out.name = "bad name!"
    elif field == "spec.num_ests":
        out.num_ests = 0
    elif field == "spec.global_batch_size":
        out.global_batch_size = 7
    elif field == "spec.elastic.max_devices":
        out.elastic.max_devices = 9
    elif field == "spec.dataset.shard_size":
        out.dataset.shard_size = 0
    elif field == "spec.accelerator_types[1]":
        out.accelerator_types.extend(["v100", "v100"])
    elif field == "spec.entrypoint.module":
        out.entrypoint.module = "not a module"
    return out


FIELDS = [
    "spec.name",
    "spec.num_ests",
    "spec.global_batch_size",
    "spec.elastic.max_devices",
    "spec.dataset.shard_size",
    "spec.accelerator_types[1]",
    "spec.entrypoint.module",
]


def test_invalid_requests_name_the_field(
    daemons: DaemonFactory, tmp_path: Path, postgres_db: str
) -> None:
    address = scheduler(daemons, tmp_path, postgres_db)
    with connect(address) as channel:
        jobs = scheduler_pb2_grpc.JobServiceStub(channel)
        for field in FIELDS:
            with pytest.raises(grpc.RpcError) as exc:
                jobs.SubmitJob(S.SubmitJobRequest(spec=_mutate(field)))
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
            assert str(exc.value.details()).startswith(field + ":"), exc.value.details()
        registry = scheduler_pb2_grpc.WorkerRegistryStub(channel)
        bad_calls: dict[str, Callable[[], object]] = {
            "devices:": lambda: registry.RegisterWorker(
                S.RegisterWorkerRequest(address="h:1", devices=[])
            ),
            "address:": lambda: registry.RegisterWorker(
                S.RegisterWorkerRequest(address="nohost", devices=cpus(1))
            ),
            "devices[0].count:": lambda: registry.RegisterWorker(
                S.RegisterWorkerRequest(
                    address="h:1", devices=[C.DeviceGroup(accelerator_type="cpu")]
                )
            ),
            "page.page_token:": lambda: jobs.ListJobs(
                S.ListJobsRequest(page=C.PageRequest(page_token="garbage"))
            ),
            "states[0]:": lambda: jobs.ListJobs(S.ListJobsRequest(states=[99])),  # type: ignore[list-item]
            "status.state:": lambda: registry.TaskFinished(
                S.TaskFinishedRequest(
                    worker_id="w", status=C.TaskStatus(task_id="t", state=C.TASK_STATE_RUNNING)
                )
            ),
            "tasks[0].progress.step:": lambda: registry.Heartbeat(
                S.HeartbeatRequest(
                    worker_id="w",
                    tasks=[
                        C.TaskStatus(
                            task_id="t", state=C.TASK_STATE_RUNNING, progress=C.JobProgress(step=-1)
                        )
                    ],
                )
            ),
        }
        for prefix, call in bad_calls.items():
            with pytest.raises(grpc.RpcError) as exc:
                call()
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, prefix
            assert str(exc.value.details()).startswith(prefix), exc.value.details()


def test_a_restarted_scheduler_keeps_every_job(
    daemons: DaemonFactory, tmp_path: Path, postgres_db: str, workers: list[FakeWorker]
) -> None:
    # A fixed port below the ephemeral range, so that no daemon of a parallel test can be
    # given it while this one is down (gRPC servers bind with SO_REUSEPORT).
    port = free_port_in(20000, 30000)
    daemon = start_scheduler(daemons, tmp_path, postgres_db, "--listen", f"127.0.0.1:{port}")
    address = daemon.address
    workers.append(FakeWorker("w1", address, cpus(1)))
    with connect(address) as channel:
        jobs = scheduler_pb2_grpc.JobServiceStub(channel)
        ids = [
            jobs.SubmitJob(S.SubmitJobRequest(spec=spec(f"r{i}", 1))).job.job_id for i in range(3)
        ]
        wait_until(
            lambda: any(job_state(jobs, j) == C.JOB_STATE_RUNNING for j in ids), WAIT, "one runs"
        )
        jobs.CancelJob(S.CancelJobRequest(job_id=ids[2]))
        before = {j: jobs.GetJob(S.GetJobRequest(job_id=j)) for j in ids}
        history = {j: events(jobs, j) for j in ids}
    starts_before = len(workers[0].agent.starts)
    daemon.kill()  # as a crash would: no chance to flush anything
    # Same database, same port: the worker keeps heartbeating to the same address.
    restarted = start_scheduler(
        daemons,
        tmp_path,
        postgres_db,
        "--listen",
        f"127.0.0.1:{port}",
        heartbeats={"timeoutSeconds": 4},
        limits={"stopTimeoutSeconds": 60},
    )
    assert restarted.address == address
    with fresh_channel(address) as fresh:
        jobs = scheduler_pb2_grpc.JobServiceStub(fresh)
        listed = {j.job_id: j for j in jobs.ListJobs(S.ListJobsRequest()).jobs}
        assert set(ids) <= set(listed)
        for job_id, old in before.items():
            new = listed[job_id]
            assert (new.state, new.spec, new.submitted_at) == (
                old.state,
                old.spec,
                old.submitted_at,
            )
            assert new.placement == old.placement
            assert kinds(events(jobs, job_id))[: len(history[job_id])] == kinds(history[job_id])
        # A few rounds later the running job still runs where it ran, without a restart.
        running = [j for j, job in before.items() if job.state == C.JOB_STATE_RUNNING]
        wait_until(
            lambda: jobs.GetClusterState(S.GetClusterStateRequest()).round >= 3,
            WAIT,
            "rounds continue",
        )
        for job_id in running:
            assert jobs.GetJob(S.GetJobRequest(job_id=job_id)).placement == before[job_id].placement
        assert workers[0].reregistrations == 0
        assert len(workers[0].agent.starts) == starts_before
        # The waiting job is still waiting; when the running one finishes, it starts.
        (task,) = [t.task_id for t in workers[0].agent.running()]
        workers[0].finish(task, C.TASK_STATE_COMPLETED, digest="abc")
        waiting = [j for j in ids[:2] if j not in running]
        wait_until(
            lambda: all(job_state(jobs, j) == C.JOB_STATE_RUNNING for j in waiting),
            WAIT,
            "the queued job starts after the restart",
        )
        done = jobs.GetJob(S.GetJobRequest(job_id=running[0]))
        assert done.state == C.JOB_STATE_SUCCEEDED and done.final_digest == "abc"


def test_max_restarts_counts_across_a_scheduler_restart(
    daemons: DaemonFactory, tmp_path: Path, postgres_db: str, workers: list[FakeWorker]
) -> None:
    """A failed task resumes the job at most limits.maxRestarts times, even when the scheduler
    restarts in between: the count is part of the stored job."""
    port = free_port_in(20000, 30000)
    flags = ["--listen", f"127.0.0.1:{port}"]
    daemon = start_scheduler(daemons, tmp_path, postgres_db, *flags, limits={"maxRestarts": 2})
    address = daemon.address
    worker = FakeWorker("w1", address, cpus(1))
    workers.append(worker)
    seen: set[str] = set()

    def next_task() -> str:
        def started() -> bool:
            return any(t.task_id not in seen for t in worker.agent.running())

        wait_until(started, WAIT, "the job starts a new task")
        (task,) = [t.task_id for t in worker.agent.running() if t.task_id not in seen]
        seen.add(task)
        return task

    with connect(address) as channel:
        jobs = scheduler_pb2_grpc.JobServiceStub(channel)
        job_id = jobs.SubmitJob(S.SubmitJobRequest(spec=spec("flaky", 1))).job.job_id
        for _ in range(2):
            worker.finish(next_task(), C.TASK_STATE_FAILED)
        task = next_task()
        assert job_state(jobs, job_id) == C.JOB_STATE_RUNNING
    daemon.kill()
    start_scheduler(daemons, tmp_path, postgres_db, *flags, limits={"maxRestarts": 2})
    worker.finish(task, C.TASK_STATE_FAILED)
    with fresh_channel(address) as fresh:
        jobs = scheduler_pb2_grpc.JobServiceStub(fresh)
        wait_until(lambda: job_state(jobs, job_id) == C.JOB_STATE_FAILED, WAIT, "the job fails")
        assert kinds(events(jobs, job_id)).count("PREEMPTED") >= 2


def test_a_silent_worker_loses_its_tasks_to_another(
    daemons: DaemonFactory, tmp_path: Path, postgres_db: str, workers: list[FakeWorker]
) -> None:
    address = scheduler(daemons, tmp_path, postgres_db)
    workers.append(FakeWorker("w1", address, cpus(1)))
    workers.append(FakeWorker("w2", address, cpus(1)))
    with connect(address) as channel:
        jobs = scheduler_pb2_grpc.JobServiceStub(channel)
        job_id = jobs.SubmitJob(S.SubmitJobRequest(spec=spec("mover", 1))).job.job_id
        wait_until(lambda: job_state(jobs, job_id) == C.JOB_STATE_RUNNING, WAIT, "job runs")
        first = jobs.GetJob(S.GetJobRequest(job_id=job_id)).placement.processes[0].worker_id
        victim = next(w for w in workers if w.worker_id == first)
        other = next(w for w in workers if w.worker_id != first)
        victim.beating.clear()  # the worker goes silent
        wait_until(
            lambda: any(r.job_id == job_id for r in other.agent.starts),
            WAIT,
            "the job starts on the other worker",
        )
        moved = next(r for r in other.agent.starts if r.job_id == job_id)
        assert moved.resume  # it resumes from its checkpoint
        first_start = next(r for r in victim.agent.starts if r.job_id == job_id)
        assert moved.checkpoint_dir == first_start.checkpoint_dir
        wait_until(lambda: job_state(jobs, job_id) == C.JOB_STATE_RUNNING, WAIT, "runs again")
        job = jobs.GetJob(S.GetJobRequest(job_id=job_id))
        assert job.placement.processes[0].worker_id == other.worker_id
        assert "WORKER_LOST" in kinds(events(jobs, job_id))
        state = jobs.GetClusterState(S.GetClusterStateRequest())
        alive = {w.worker_id: w.alive for w in state.workers}
        assert alive == {victim.worker_id: False, other.worker_id: True}
        # Back from the dead: told to register again, and its devices return.
        victim.beating.set()
        wait_until(lambda: victim.reregistrations >= 1, WAIT, "re-registration")
        wait_until(
            lambda: all(w.alive for w in jobs.GetClusterState(S.GetClusterStateRequest()).workers),
            WAIT,
            "worker alive again",
        )


def test_an_elastic_job_rescales_through_checkpoint_and_resume(
    daemons: DaemonFactory, tmp_path: Path, postgres_db: str, workers: list[FakeWorker]
) -> None:
    address = scheduler(daemons, tmp_path, postgres_db)
    workers.append(FakeWorker("w1", address, cpus(4)))
    worker = workers[0]
    with connect(address) as channel:
        jobs = scheduler_pb2_grpc.JobServiceStub(channel)
        registry = scheduler_pb2_grpc.WorkerRegistryStub(channel)
        big = jobs.SubmitJob(S.SubmitJobRequest(spec=spec("big", 4))).job.job_id

        def grown() -> bool:
            job = jobs.GetJob(S.GetJobRequest(job_id=big))
            return job.state == C.JOB_STATE_RUNNING and len(job.placement.processes) == 4

        wait_until(grown, WAIT, "the lone job grows to 4 devices")
        (task,) = [r.task_id for r in worker.agent.starts if r.job_id == big]
        renewed = registry.RenewLease(S.RenewLeaseRequest(worker_id="w1", task_id=task))
        assert renewed.renewed and renewed.lease.expires_at > 0
        progress = C.JobProgress(step=5, total_steps=100)
        status = C.TaskStatus(
            task_id=task, job_id=big, state=C.TASK_STATE_RUNNING, progress=progress
        )
        registry.Heartbeat(S.HeartbeatRequest(worker_id="w1", tasks=[status]))
        assert jobs.GetJob(S.GetJobRequest(job_id=big)).progress == progress

        small = jobs.SubmitJob(S.SubmitJobRequest(spec=spec("small", 1))).job.job_id
        wait_until(lambda: job_state(jobs, small) == C.JOB_STATE_RUNNING, WAIT, "newcomer runs")
        wait_until(lambda: job_state(jobs, big) == C.JOB_STATE_RUNNING, WAIT, "big runs again")
        job = jobs.GetJob(S.GetJobRequest(job_id=big))
        # 1 device for the newcomer; 3 of 4 ESTs would step no faster than 2 (Eq. 1), so
        # the big job keeps 2 devices of the 3 left.
        assert [list(p.est_ids) for p in job.placement.processes] == [[0, 1], [2, 3]]
        assert job.rescale_count == 1
        stop = next(s for s in worker.agent.stops if s.task_id == task)
        assert stop.checkpoint
        resumed = [r for r in worker.agent.starts if r.job_id == big][-1]
        assert resumed.resume and resumed.task_id != task
        history = kinds(events(jobs, big))
        assert history[:2] == ["SUBMITTED", "STARTED"]
        assert (
            history.index("RESCALING") < history.index("CHECKPOINTED") < history.index("RESCALED")
        )
        # The old task is no longer the scheduler's: its lease is refused (the fence).
        assert not registry.RenewLease(S.RenewLeaseRequest(worker_id="w1", task_id=task)).renewed


def test_gavel_rounds_time_share_one_device(
    daemons: DaemonFactory, tmp_path: Path, postgres_db: str, workers: list[FakeWorker]
) -> None:
    # residency 3: each turn 3 restarts long, a restart (the live prior of 10 s) counted one
    # 1 s round at most (restart_cost.py): 3 s, not the default's 30 s; shareMultiple 0.3:
    # the devices re-shared every 3 s (0.3 x 10 s), not every 80 s
    allocate = {"name": "las", "args": {"residency": 3, "shareMultiple": 0.3}}
    address = scheduler(
        daemons, tmp_path, postgres_db, policy="las", profile={"allocate": allocate}
    )
    workers.append(FakeWorker("w1", address, cpus(1)))
    with connect(address) as channel:
        jobs = scheduler_pb2_grpc.JobServiceStub(channel)
        ids = [
            jobs.SubmitJob(S.SubmitJobRequest(spec=spec(f"g{i}", 2, max_devices=1))).job.job_id
            for i in range(2)
        ]
        # One device, two rigid jobs with equal shares: rounds alternate them, each turn
        # its residency long.
        wait_until(
            lambda: (
                all("PREEMPTED" in kinds(events(jobs, j)) for j in ids)
                or all(len([r for r in workers[0].agent.starts if r.job_id == j]) >= 2 for j in ids)
            ),
            WAIT + 30.0,
            "both jobs run in turn",
        )
        for job_id in ids:
            starts = [r for r in workers[0].agent.starts if r.job_id == job_id]
            assert starts and len(starts[0].placement.processes) == 1
            assert sorted(starts[0].placement.processes[0].est_ids) == [0, 1]


class ScriptedBrain(brain_pb2_grpc.BrainServicer):
    """A Brain whose estimates say "fast" devices are 3x "slow" ones, or UNIMPLEMENTED."""

    def __init__(self, implemented: bool) -> None:
        self.implemented = implemented
        self.requests: list[brain_pb2.EstimateThroughputRequest] = []
        self.events: list[brain_pb2.ReportJobEventRequest] = []

    def ReportJobEvent(
        self, request: brain_pb2.ReportJobEventRequest, context: grpc.ServicerContext
    ) -> brain_pb2.ReportJobEventResponse:
        self.events.append(request)
        return brain_pb2.ReportJobEventResponse(recorded=True)

    def EstimateThroughput(
        self, request: brain_pb2.EstimateThroughputRequest, context: grpc.ServicerContext
    ) -> brain_pb2.ThroughputEstimate:
        self.requests.append(request)
        if not self.implemented:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "not yet")
        speed = 3.0 if request.accelerator_type == "fast" else 1.0
        return brain_pb2.ThroughputEstimate(steps_per_second=speed * request.device_count)


@pytest.mark.parametrize("implemented", [True, False])
def test_est_split_from_the_brains_estimates_or_even(
    daemons: DaemonFactory,
    tmp_path: Path,
    postgres_db: str,
    workers: list[FakeWorker],
    implemented: bool,
) -> None:
    """One planner (EasyScale's Eq. 1) in the scheduler, fed by the Brain's estimates: a D2
    job of 4 ESTs on one fast and one slow device puts 3 ESTs on the fast one; without
    estimates every device counts alike and the split is even."""
    brain = ScriptedBrain(implemented)  # type: ignore[abstract]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    brain_pb2_grpc.add_BrainServicer_to_server(brain, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        address = scheduler(
            daemons, tmp_path, postgres_db, cluster={"brainAddress": f"127.0.0.1:{port}"}
        )
        devices = [
            C.DeviceGroup(accelerator_type="fast", count=1),
            C.DeviceGroup(accelerator_type="slow", count=1),
        ]
        workers.append(FakeWorker("w1", address, devices))
        with connect(address) as channel:
            jobs = scheduler_pb2_grpc.JobServiceStub(channel)
            mixed = spec("planned", 4)
            mixed.determinism = C.DETERMINISM_LEVEL_D2
            job_id = jobs.SubmitJob(S.SubmitJobRequest(spec=mixed)).job.job_id
            wait_until(lambda: job_state(jobs, job_id) == C.JOB_STATE_RUNNING, WAIT, "runs")
            placement = jobs.GetJob(S.GetJobRequest(job_id=job_id)).placement
        split = {p.accelerator_type: len(p.est_ids) for p in placement.processes}
        assert brain.requests and brain.requests[0].job_id == job_id
        assert split == ({"fast": 3, "slow": 1} if implemented else {"fast": 2, "slow": 2})
        # The Brain hears of the job's life (its histories begin with SUBMITTED and the spec).
        wait_until(lambda: len(brain.events) >= 2, WAIT, "lifecycle events reach the Brain")
        submitted = brain.events[0]
        assert submitted.kind == brain_pb2.JOB_EVENT_KIND_SUBMITTED
        assert submitted.job_id == job_id and submitted.spec.name == "planned"
        assert brain.events[1].kind == brain_pb2.JOB_EVENT_KIND_STARTED
    finally:
        server.stop(0)


def test_an_unreachable_brain_falls_back_to_the_local_planner(
    daemons: DaemonFactory, tmp_path: Path, postgres_db: str, workers: list[FakeWorker]
) -> None:
    address = scheduler(daemons, tmp_path, postgres_db, cluster={"brainAddress": "127.0.0.1:9"})
    workers.append(FakeWorker("w1", address, cpus(2)))
    with connect(address) as channel:
        jobs = scheduler_pb2_grpc.JobServiceStub(channel)
        job_id = jobs.SubmitJob(S.SubmitJobRequest(spec=spec("alone", 2))).job.job_id
        wait_until(lambda: job_state(jobs, job_id) == C.JOB_STATE_RUNNING, WAIT, "runs")


def test_with_the_real_brain_on_the_same_database(
    daemons: DaemonFactory, tmp_path: Path, postgres_db: str, workers: list[FakeWorker]
) -> None:
    """Both daemons migrate the one Alembic history of the shared database; the scheduler's
    estimates come from the Brain and the Brain records the job."""
    brain = daemons("brain", ["--database-url", postgres_db])
    address = scheduler(daemons, tmp_path, postgres_db, cluster={"brainAddress": brain.address})
    workers.append(FakeWorker("w1", address, cpus(2)))
    with connect(address) as channel:
        jobs = scheduler_pb2_grpc.JobServiceStub(channel)
        job_id = jobs.SubmitJob(S.SubmitJobRequest(spec=spec("with-brain", 4))).job.job_id
        wait_until(lambda: job_state(jobs, job_id) == C.JOB_STATE_RUNNING, WAIT, "runs")
        placement = jobs.GetJob(S.GetJobRequest(job_id=job_id)).placement
    assert sorted(e for p in placement.processes for e in p.est_ids) == [0, 1, 2, 3]
    with connect(brain.address) as channel:
        stub = brain_pb2_grpc.BrainStub(channel)
        history = wait_until(
            lambda: _history(stub, job_id), WAIT, "the Brain records the scheduler's job"
        )
    assert history is not None and history.job.spec.name == "with-brain"


def _history(stub: brain_pb2_grpc.BrainStub, job_id: str) -> brain_pb2.JobHistory | None:
    try:
        reply = stub.GetJobHistory(brain_pb2.GetJobHistoryRequest(job_id=job_id))
    except grpc.RpcError:
        return None
    return reply if reply.job.status == "running" else None


def test_code_packages_upload_once_and_bad_uploads_change_nothing(
    daemons: DaemonFactory, tmp_path: Path, postgres_db: str
) -> None:
    address = scheduler(daemons, tmp_path, postgres_db)
    data = bytes(range(256)) * 5000  # 1.28 MB: two chunks
    sha = codepkg.sha256_of(data)
    with connect(address) as channel:
        jobs = scheduler_pb2_grpc.JobServiceStub(channel)
        workers = scheduler_pb2_grpc.WorkerRegistryStub(channel)
        unknown = spec("own-code")
        unknown.entrypoint.code_sha256 = sha
        with pytest.raises(grpc.RpcError) as info:
            jobs.SubmitJob(S.SubmitJobRequest(spec=unknown))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "upload it first" in (info.value.details() or "")
        lie = [C.CodeChunk(sha256=sha, size=len(data), data=data[:-1] + b"x")]
        with pytest.raises(grpc.RpcError) as info:
            jobs.UploadCode(iter(lie))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "hash to" in (info.value.details() or "")
        assert not jobs.HasCode(S.HasCodeRequest(sha256=sha)).present  # nothing stored
        with pytest.raises(grpc.RpcError) as info:
            jobs.HasCode(S.HasCodeRequest(sha256="not-a-hash"))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        first = jobs.UploadCode(codepkg.chunks(sha, data))
        again = jobs.UploadCode(codepkg.chunks(sha, data))
        assert (first.sha256, first.stored, again.stored) == (sha, True, False)
        assert jobs.HasCode(S.HasCodeRequest(sha256=sha)).present
        fetched = codepkg.assemble(workers.FetchCode(S.FetchCodeRequest(sha256=sha)))
        assert fetched == (sha, data)
        assert jobs.SubmitJob(S.SubmitJobRequest(spec=unknown)).created
        with pytest.raises(grpc.RpcError) as info:
            list(workers.FetchCode(S.FetchCodeRequest(sha256="0" * 64)))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as info:
            list(jobs.StreamJobLogs(S.StreamJobLogsRequest(job_id="job-nope")))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
