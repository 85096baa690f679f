"""The worker daemon as a real process over real gRPC, its training processes real runtime
processes; the scheduler side is an in-process WorkerRegistry server that records what the
daemon tells it (register, heartbeats with its tasks' progress, leases, TaskFinished)."""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from gearshift.client.processes import DaemonProcess
from gearshift.common import codepkg
from gearshift.common.auth import BearerTokenServerInterceptor
from gearshift.common.channel import connect
from gearshift.common.ports import free_port
from gearshift.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.conftest import DaemonFactory
from tests.helpers import live_pids, repo_on_pythonpath, wait_until

REPO = Path(__file__).resolve().parents[2]
WAIT = 60.0
MLP = "gearshift.examples.mlp"

C = common_pb2
S = scheduler_pb2


@dataclass
class FakeScheduler(scheduler_pb2_grpc.WorkerRegistryServicer):
    """Records the Workers API calls; can ask for a re-registration, and answer RenewLease
    as `leases` says: renew, refuse (the task is not the scheduler's) or down (UNAVAILABLE)."""

    registrations: list[S.RegisterWorkerRequest] = field(default_factory=list)
    heartbeats: list[S.HeartbeatRequest] = field(default_factory=list)
    finished: list[C.TaskStatus] = field(default_factory=list)
    renewals: list[S.RenewLeaseRequest] = field(default_factory=list)
    reregister: threading.Event = field(default_factory=threading.Event)
    code: dict[str, bytes] = field(default_factory=dict)  # FetchCode serves these
    leases: str = "renew"
    relay_port: int = 0  # RegisterWorker names this heartbeat relay (0: none)
    streams: int = 0  # HeartbeatStream calls opened

    def RegisterWorker(
        self, request: S.RegisterWorkerRequest, context: grpc.ServicerContext
    ) -> S.RegisterWorkerResponse:
        self.registrations.append(request)
        return S.RegisterWorkerResponse(
            worker_id=request.worker_id,
            heartbeat_interval_seconds=0.2,
            heartbeat_timeout_seconds=2,
            heartbeat_port=self.relay_port,
        )

    def Heartbeat(
        self, request: S.HeartbeatRequest, context: grpc.ServicerContext
    ) -> S.HeartbeatResponse:
        self.heartbeats.append(request)
        again = self.reregister.is_set()
        self.reregister.clear()
        return S.HeartbeatResponse(reregister=again)

    def HeartbeatStream(
        self, request_iterator: Iterator[S.HeartbeatRequest], context: grpc.ServicerContext
    ) -> Iterator[S.HeartbeatResponse]:
        self.streams += 1
        for request in request_iterator:
            yield self.Heartbeat(request, context)

    def RenewLease(
        self, request: S.RenewLeaseRequest, context: grpc.ServicerContext
    ) -> S.RenewLeaseResponse:
        self.renewals.append(request)
        if self.leases == "down":
            context.abort(grpc.StatusCode.UNAVAILABLE, "the scheduler is restarting")
        if self.leases == "refuse":  # with a lease that ran out: a refusal is not "at its end"
            lease = C.Lease(task_id=request.task_id, expires_at=time.time() - 1)
            return S.RenewLeaseResponse(renewed=False, lease=lease)
        lease = C.Lease(task_id=request.task_id, expires_at=time.time() + 60)
        return S.RenewLeaseResponse(renewed=True, lease=lease)

    def TaskFinished(
        self, request: S.TaskFinishedRequest, context: grpc.ServicerContext
    ) -> S.TaskFinishedResponse:
        self.finished.append(request.status)
        return S.TaskFinishedResponse()

    def FetchCode(
        self, request: S.FetchCodeRequest, context: grpc.ServicerContext
    ) -> Iterator[C.CodeChunk]:
        data = self.code.get(request.sha256)
        if data is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"code package {request.sha256!r} not found")
        yield from codepkg.chunks(request.sha256, data)

    def HeartbeatBatch(
        self, request: S.HeartbeatBatchRequest, context: grpc.ServicerContext
    ) -> S.HeartbeatBatchResponse:
        raise NotImplementedError  # a worker never calls it

    def ended(self, task_id: str) -> C.TaskStatus | None:
        return next((s for s in self.finished if s.task_id == task_id), None)

    def progress(self, task_id: str) -> list[C.JobProgress]:
        """The task's progress, heartbeat after heartbeat."""
        return [t.progress for h in list(self.heartbeats) for t in h.tasks if t.task_id == task_id]


def serve_fake(token: str = "") -> tuple[FakeScheduler, grpc.Server, str]:
    servicer = FakeScheduler()
    interceptors: list[grpc.ServerInterceptor[Any, Any]] = (
        [BearerTokenServerInterceptor(token)] if token else []
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), interceptors=interceptors)
    scheduler_pb2_grpc.add_WorkerRegistryServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return servicer, server, f"127.0.0.1:{port}"


@pytest.fixture
def fake() -> Iterator[tuple[FakeScheduler, str]]:
    servicer, server, address = serve_fake()
    yield servicer, address
    server.stop(0)


def start_worker(
    daemons: DaemonFactory, scheduler: str, tmp_path: Path, devices: str = "cpu:2", *extra: str
) -> DaemonProcess:
    return daemons(
        "worker",
        [
            *extra,
            "--scheduler",
            scheduler,
            "--devices",
            devices,
            "--worker-id",
            "wA",
            "--work-dir",
            str(tmp_path / "work"),
            "--report-interval",
            "0.3",
            "--stop-timeout",
            "30",
        ],
        # The repository first (tests.integration.worker_jobs), then what the path held.
        env={"PYTHONPATH": repo_on_pythonpath()},
    )


def spec(steps: int, module: str = MLP, config: str = '{"samples": 256}') -> C.JobSpec:
    return C.JobSpec(
        name="t",
        entrypoint=C.Entrypoint(module=module, config_json=config),
        num_ests=4,
        global_batch_size=16,
        total_steps=steps,
        dataset=C.DatasetSpec(size=256, shard_size=16, seed=3),
        checkpoint_every_steps=5,
    )


def start_request(tmp_path: Path, task_id: str, job_spec: C.JobSpec) -> worker_pb2.StartTaskRequest:
    """Two ranks on worker wA holding 3 and 1 ESTs (an uneven split)."""
    processes = [
        C.ProcessAssignment(rank=0, worker_id="wA", device_index=0, est_ids=[0, 1, 2]),
        C.ProcessAssignment(rank=1, worker_id="wA", device_index=1, est_ids=[3]),
    ]
    return worker_pb2.StartTaskRequest(
        task_id=task_id,
        job_id="job-" + task_id,
        spec=job_spec,
        placement=C.Placement(processes=processes),
        local_ranks=[0, 1],
        rendezvous_address=f"127.0.0.1:{free_port()}",
        checkpoint_dir=str(tmp_path / "ckpt" / task_id),
    )


def finished(recorder: FakeScheduler, task_id: str, timeout: float = WAIT) -> C.TaskStatus:
    """The TaskFinished status of a task, once it came."""
    status = wait_until(lambda: recorder.ended(task_id), timeout, f"TaskFinished of {task_id}")
    assert status is not None
    return status


def status(daemon: DaemonProcess, task_id: str) -> C.TaskStatus:
    with connect(daemon.address) as channel:
        stub = worker_pb2_grpc.WorkerAgentStub(channel)
        return stub.GetTaskStatus(worker_pb2.GetTaskStatusRequest(task_id=task_id))


def local_digest(tmp_path: Path, job_spec: C.JobSpec, *extra: str) -> str:
    """The same job run by the runtime's launcher on one process."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "gearshift.worker.run",
            "--job",
            job_spec.entrypoint.module,
            "--config",
            job_spec.entrypoint.config_json,
            "--ests",
            "4",
            "--procs",
            "1",
            "--steps",
            str(job_spec.total_steps),
            "--batch-size",
            "16",
            "--seed",
            str(job_spec.dataset.seed),
            "--shard-size",
            str(job_spec.dataset.shard_size),
            "--data-size",
            str(job_spec.dataset.size),
            "--checkpoint-dir",
            str(tmp_path / "local"),
            *extra,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return str(re.findall(r"^digest sha256:([0-9a-f]{64})$", run.stdout, re.MULTILINE)[-1])


def test_registers_heartbeats_and_registers_again_when_told(
    daemons: DaemonFactory, fake: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    recorder, address = fake
    worker = start_worker(daemons, address, tmp_path, devices="v100:1,t4:2:16GiB")
    first = wait_until(lambda: recorder.registrations, WAIT, "registration")[0]
    assert first.worker_id == "wA" and first.address == worker.address
    assert [(g.accelerator_type, g.count, g.memory_bytes) for g in first.devices] == [
        ("v100", 1, 0),
        ("t4", 2, 16 * 2**30),
    ]
    wait_until(lambda: len(recorder.heartbeats) >= 3, WAIT, "heartbeats at the given interval")
    assert all(h.worker_id == "wA" for h in recorder.heartbeats)
    recorder.reregister.set()
    wait_until(lambda: len(recorder.registrations) >= 2, WAIT, "registration after reregister")
    with connect(worker.address) as channel:
        description = worker_pb2_grpc.WorkerAgentStub(channel).DescribeWorker(
            worker_pb2.DescribeWorkerRequest()
        )
    assert description.worker_id == "wA" and list(description.devices) == list(first.devices)


def test_heartbeats_go_to_the_named_relay_and_back_to_the_scheduler_when_it_fails(
    daemons: DaemonFactory, fake: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    recorder, address = fake
    relay, relay_server, relay_address = serve_fake()  # a relay takes heartbeats like this
    recorder.relay_port = int(relay_address.rpartition(":")[2])
    try:
        start_worker(daemons, address, tmp_path)
        wait_until(lambda: len(relay.heartbeats) >= 3, WAIT, "heartbeats at the relay")
        assert recorder.heartbeats == [] and len(recorder.registrations) == 1
        assert all(h.worker_id == "wA" for h in relay.heartbeats)
        assert relay.streams == 1  # every heartbeat on one open stream
    finally:
        relay_server.stop(0)
    # The relay is gone: the worker registers again at the scheduler, which names none now.
    recorder.relay_port = 0
    wait_until(lambda: len(recorder.registrations) >= 2, WAIT, "registration after the relay")
    wait_until(lambda: recorder.heartbeats, WAIT, "heartbeats at the scheduler itself")


def test_a_task_completes_with_the_digest_of_a_local_run(
    daemons: DaemonFactory, fake: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    recorder, address = fake
    worker = start_worker(daemons, address, tmp_path)
    job_spec = spec(20)
    request = start_request(tmp_path, "t-done", job_spec)
    with connect(worker.address) as channel:
        stub = worker_pb2_grpc.WorkerAgentStub(channel)
        first = stub.StartTask(request)
        assert first.state in (C.TASK_STATE_STARTING, C.TASK_STATE_RUNNING)
        again = stub.StartTask(request)  # a retry: the same task, nothing spawned twice
        assert again.task_id == "t-done" and again.job_id == request.job_id
        tasks = stub.DescribeWorker(worker_pb2.DescribeWorkerRequest()).tasks
        assert [t.task_id for t in tasks] == ["t-done"]
    final = finished(recorder, "t-done")
    assert final.state == C.TASK_STATE_COMPLETED, final.message
    assert final.digest == local_digest(tmp_path, job_spec)
    assert final.progress.step == 20 and final.checkpoint_path == request.checkpoint_dir
    assert sorted(p.name for p in (tmp_path / "work" / "tasks" / "t-done").glob("rank*.log")) == [
        "rank0.log",
        "rank1.log",
    ]
    assert status(worker, "t-done").state == C.TASK_STATE_COMPLETED


def test_stop_task_checkpoints_and_ends_checkpointed(
    daemons: DaemonFactory, fake: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    recorder, address = fake
    worker = start_worker(daemons, address, tmp_path)
    request = start_request(tmp_path, "t-stop", spec(1_000_000))
    with connect(worker.address) as channel:
        stub = worker_pb2_grpc.WorkerAgentStub(channel)
        stub.StartTask(request)
        wait_until(lambda: status(worker, "t-stop").progress.step >= 5, WAIT, "training")
        wait_until(lambda: recorder.renewals, WAIT, "the lease is renewed")
        stopped = stub.StopTask(
            worker_pb2.StopTaskRequest(task_id="t-stop", checkpoint=True, timeout_seconds=60)
        )
    assert stopped.state == C.TASK_STATE_CHECKPOINTED, stopped.message
    assert list((tmp_path / "ckpt" / "t-stop").glob("ckpt-*.pt"))
    final = finished(recorder, "t-stop")
    assert final.state == C.TASK_STATE_CHECKPOINTED


def test_the_heartbeat_carries_rank_0s_progress_and_a_fresh_start(
    daemons: DaemonFactory, fake: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    """Progress takes one path: rank 0 keeps it in a file, the daemon's heartbeats carry it.
    Told to resume from a folder with no checkpoint, rank 0 says it started fresh before its
    first step (the job takes 2 s to build), and on every report after."""
    recorder, address = fake
    worker = start_worker(daemons, address, tmp_path)
    config = '{"samples": 256, "crash_after": 1000000, "start_delay": 2}'
    request = start_request(tmp_path, "t-fresh", spec(20, "tests.integration.worker_jobs", config))
    request.resume = True
    with connect(worker.address) as channel:
        worker_pb2_grpc.WorkerAgentStub(channel).StartTask(request)
    final = finished(recorder, "t-fresh")
    assert final.state == C.TASK_STATE_COMPLETED, final.message
    assert final.progress.step == 20 and final.progress.started_fresh
    reported = [p for p in recorder.progress("t-fresh") if p.started_fresh]
    assert reported and reported[0].step == 0 and reported[0].total_steps == 20, reported
    assert all(p.started_fresh for p in recorder.progress("t-fresh") if p.step > 0)


def test_the_lease_is_a_fence_not_a_stop(
    daemons: DaemonFactory, fake: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    """A lease that runs out stops nothing (here the scheduler is down: the task trains on);
    a refused renewal, which means the scheduler no longer holds the task, terminates it at
    once, without a checkpoint. A stop with a checkpoint is StopTask's only."""
    recorder, address = fake
    recorder.leases = "down"
    worker = start_worker(daemons, address, tmp_path)
    job_spec = spec(1_000_000)
    job_spec.checkpoint_every_steps = 1_000_000  # no checkpoint of its own
    request = start_request(tmp_path, "t-fence", job_spec)
    request.lease.expires_at = time.time() + 1
    with connect(worker.address) as channel:
        worker_pb2_grpc.WorkerAgentStub(channel).StartTask(request)
    wait_until(lambda: status(worker, "t-fence").progress.step >= 5, WAIT, "training")
    wait_until(lambda: time.time() > request.lease.expires_at + 1, 5, "the lease ran out")
    before = status(worker, "t-fence")
    assert before.state == C.TASK_STATE_RUNNING and recorder.renewals

    def trained_on() -> bool:
        return status(worker, "t-fence").progress.step > before.progress.step

    wait_until(trained_on, WAIT, "training on past the lease")
    recorder.leases = "refuse"
    final = finished(recorder, "t-fence")
    assert final.state == C.TASK_STATE_FAILED, final.message
    assert "terminated: unknown to the scheduler" in final.message, final.message
    assert not list((tmp_path / "ckpt" / "t-fence").glob("ckpt-*.pt"))


def test_a_crashing_training_process_is_reported_failed_with_its_error(
    daemons: DaemonFactory, fake: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    recorder, address = fake
    worker = start_worker(daemons, address, tmp_path)
    crash = spec(1000, "tests.integration.worker_jobs", '{"samples": 256, "crash_after": 7}')
    with connect(worker.address) as channel:
        worker_pb2_grpc.WorkerAgentStub(channel).StartTask(
            start_request(tmp_path, "t-crash", crash)
        )
    final = finished(recorder, "t-crash")
    assert final.state == C.TASK_STATE_FAILED
    assert final.exit_code == 1
    assert "RuntimeError: boom after 7 forward passes" in final.message, final.message
    assert final.message.startswith("rank ")


def gpu_request(tmp_path: Path, task_id: str, job_spec: C.JobSpec, devices: list[int]) -> Any:
    """start_request with rank r on device devices[r] of worker wA (ESTs: 3 + 1, or all 4)."""
    request = start_request(tmp_path, task_id, job_spec)
    if len(devices) == 1:
        del request.placement.processes[1:]
        request.placement.processes[0].est_ids[:] = [0, 1, 2, 3]
        del request.local_ranks[1:]
    for process, device in zip(request.placement.processes, devices, strict=True):
        process.device_index = device
    return request


@pytest.mark.skipif(torch.cuda.is_available(), reason="reads the error of a GPU-less machine")
def test_cuda_processes_are_shown_their_tasks_gpus(
    daemons: DaemonFactory, fake: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    """Ranks on devices 3 and 1 both see CUDA_VISIBLE_DEVICES=1,3 (and take their own by
    position, --local-device: see tests/unit/test_worker_gpus.py); without a GPU the
    runtime says what it was shown and exits 2."""
    recorder, address = fake
    worker = start_worker(daemons, address, tmp_path, "h100:4", "--accelerator", "cuda")
    with connect(worker.address) as channel:
        worker_pb2_grpc.WorkerAgentStub(channel).StartTask(
            gpu_request(tmp_path, "t-gpus", spec(5), [3, 1])
        )
    final = finished(recorder, "t-gpus")
    assert final.state == C.TASK_STATE_FAILED and final.exit_code == 2, final.message
    shown = "--device: cuda was asked for but no GPU is visible (CUDA_VISIBLE_DEVICES=1,3)"
    assert shown in final.message, final.message


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_cuda_task_trains_on_its_gpus_with_nccl_between_them(
    daemons: DaemonFactory, fake: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    """Two processes on two GPUs talk over NCCL (one process on a one-GPU machine) and end
    with the digest of one launcher process with 4 ESTs on the GPU."""
    recorder, address = fake
    gpus = torch.cuda.device_count()
    devices = [0, 1] if gpus >= 2 else [0]
    worker = start_worker(daemons, address, tmp_path, f"gpu:{gpus}", "--accelerator", "cuda")
    job_spec = spec(20)
    with connect(worker.address) as channel:
        worker_pb2_grpc.WorkerAgentStub(channel).StartTask(
            gpu_request(tmp_path, "t-cuda", job_spec, devices)
        )
    final = finished(recorder, "t-cuda")
    assert final.state == C.TASK_STATE_COMPLETED, final.message
    stats_dir = tmp_path / "work" / "tasks" / "t-cuda" / "stats"
    stats = [json.loads((stats_dir / f"rank{r}.json").read_text()) for r in range(len(devices))]
    backend = "nccl" if len(devices) > 1 else "none"
    assert [(s["device"], s["backend"]) for s in stats] == [
        (f"cuda:{d}", backend) for d in range(len(devices))
    ]
    assert final.digest == local_digest(tmp_path, job_spec, "--device", "cuda")


def test_stop_without_checkpoint_terminates(
    daemons: DaemonFactory, fake: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    _, address = fake
    worker = start_worker(daemons, address, tmp_path)
    with connect(worker.address) as channel:
        stub = worker_pb2_grpc.WorkerAgentStub(channel)
        stub.StartTask(start_request(tmp_path, "t-kill", spec(1_000_000)))
        stopped = stub.StopTask(
            worker_pb2.StopTaskRequest(task_id="t-kill", checkpoint=False, reason="cancelled")
        )
        assert stopped.state == C.TASK_STATE_FAILED and "terminated: cancelled" in stopped.message
        calls: list[Callable[[], object]] = [
            lambda: stub.GetTaskStatus(worker_pb2.GetTaskStatusRequest(task_id="t-nope")),
            lambda: stub.StopTask(worker_pb2.StopTaskRequest(task_id="t-nope")),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as exc:
                call()
            assert exc.value.code() == grpc.StatusCode.NOT_FOUND


def _bad(tmp_path: Path, field: str) -> worker_pb2.StartTaskRequest:
    request = start_request(tmp_path, "t-bad", spec(10))
    processes = request.placement.processes
    if field == "task_id":
        request.task_id = ""
    elif field == "spec":
        request.ClearField("spec")
    elif field == "spec.num_ests":
        request.spec.num_ests = 0
    elif field == "spec.dataset.shard_size":
        request.spec.dataset.shard_size = 100  # 3 shards for 4 ESTs
    elif field == "placement.processes":
        del processes[:]
    elif field == "placement.processes[1].est_ids":
        processes[1].est_ids[:] = [2]
    elif field == "placement.processes[1].rank":
        processes[1].rank = 5
    elif field == "placement.processes[1].device_index":
        processes[1].device_index = 7
    elif field == "local_ranks[0]":
        processes[0].worker_id = "wB"
    elif field == "local_ranks[1]":
        request.local_ranks[:] = [0, 9]
    elif field == "local_ranks":
        request.local_ranks[:] = []
    elif field == "rendezvous_address":
        request.rendezvous_address = "nowhere"
    elif field == "checkpoint_dir":
        request.checkpoint_dir = ""
    elif field == "endpoints.shard_manager":
        request.spec.dataset.mode = C.DATA_MODE_DYNAMIC
    return request


BAD_FIELDS = [
    "task_id",
    "spec",
    "spec.num_ests",
    "spec.dataset.shard_size",
    "placement.processes",
    "placement.processes[1].est_ids",
    "placement.processes[1].rank",
    "placement.processes[1].device_index",
    "local_ranks[0]",
    "local_ranks[1]",
    "local_ranks",
    "rendezvous_address",
    "checkpoint_dir",
    "endpoints.shard_manager",
]


def test_bad_start_requests_name_the_field_and_change_nothing(
    daemons: DaemonFactory, tmp_path: Path
) -> None:
    worker = daemons(
        "worker", ["--devices", "cpu:2", "--worker-id", "wA", "--work-dir", str(tmp_path / "work")]
    )
    with connect(worker.address) as channel:
        stub = worker_pb2_grpc.WorkerAgentStub(channel)
        for field_name in BAD_FIELDS:
            with pytest.raises(grpc.RpcError) as exc:
                stub.StartTask(_bad(tmp_path, field_name))
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field_name
            assert str(exc.value.details()).startswith(field_name + ":"), exc.value.details()
        with pytest.raises(grpc.RpcError) as exc:
            stub.StopTask(worker_pb2.StopTaskRequest(task_id="x", timeout_seconds=-1))
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert str(exc.value.details()).startswith("timeout_seconds:")
        assert not stub.DescribeWorker(worker_pb2.DescribeWorkerRequest()).tasks
    assert not (tmp_path / "work" / "tasks").exists()


def test_sigterm_checkpoints_the_tasks_and_exits_0(
    daemons: DaemonFactory, fake: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    recorder, address = fake
    worker = start_worker(daemons, address, tmp_path)
    with connect(worker.address) as channel:
        worker_pb2_grpc.WorkerAgentStub(channel).StartTask(
            start_request(tmp_path, "t-term", spec(1_000_000))
        )
    wait_until(lambda: status(worker, "t-term").progress.step >= 1, WAIT, "training")
    worker.process.send_signal(signal.SIGTERM)
    assert worker.process.wait(timeout=60) == 0, worker.log_tail()
    final = recorder.ended("t-term")
    assert final is not None and final.state == C.TASK_STATE_CHECKPOINTED, worker.log_tail()
    assert list((tmp_path / "ckpt" / "t-term").glob("ckpt-*.pt"))


def test_a_killed_daemon_takes_its_training_processes_along(
    daemons: DaemonFactory, fake: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    _, address = fake
    worker = start_worker(daemons, address, tmp_path)
    with connect(worker.address) as channel:
        worker_pb2_grpc.WorkerAgentStub(channel).StartTask(
            start_request(tmp_path, "t-orphan", spec(1_000_000))
        )
    wait_until(lambda: status(worker, "t-orphan").progress.step >= 1, WAIT, "training")
    task_dir = tmp_path / "work" / "tasks" / "t-orphan"
    assert len(alive(task_dir)) == 2
    worker.kill()
    wait_until(lambda: not alive(task_dir), 30, "the processes died")


def alive(task_dir: Path) -> list[int]:
    """Pids of the task's training processes that still run (the daemon writes rank<R>.pid)."""
    return live_pids(task_dir.glob("rank*.pid"))


def test_the_token_goes_with_every_call(daemons: DaemonFactory, tmp_path: Path) -> None:
    """--token protects the daemon and rides on its calls."""
    recorder, server, address = serve_fake("s3cret")
    try:
        worker = daemons(
            "worker",
            [
                "--scheduler",
                address,
                "--devices",
                "cpu:2",
                "--worker-id",
                "wA",
                "--work-dir",
                str(tmp_path / "work"),
                "--report-interval",
                "0.3",
            ],
            env={"GEARSHIFT_TOKEN": "s3cret"},
        )
        wait_until(lambda: recorder.registrations, WAIT, "an authenticated registration")
        request = start_request(tmp_path, "t-auth", spec(5))
        with connect(worker.address) as channel:
            with pytest.raises(grpc.RpcError) as exc:
                worker_pb2_grpc.WorkerAgentStub(channel).StartTask(request)
            assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with connect(worker.address, token="s3cret") as channel:
            worker_pb2_grpc.WorkerAgentStub(channel).StartTask(request)
        assert finished(recorder, "t-auth").state == C.TASK_STATE_COMPLETED
    finally:
        server.stop(0)


def test_a_task_runs_a_code_package_fetched_once_and_its_logs_stream(
    daemons: DaemonFactory, fake: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    recorder, address = fake
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_mlp.py").write_text("from gearshift.examples.mlp import build  # noqa\n")
    package = codepkg.package(project)
    recorder.code[package.sha256] = package.data
    job_spec = spec(6, module="my_mlp")
    job_spec.entrypoint.code_sha256 = package.sha256
    worker = start_worker(daemons, address, tmp_path)
    with connect(worker.address) as channel:
        stub = worker_pb2_grpc.WorkerAgentStub(channel)
        stub.StartTask(start_request(tmp_path, "t-own", job_spec))
        final = finished(recorder, "t-own")
        assert final.state == C.TASK_STATE_COMPLETED, final.message
        request = worker_pb2.StreamTaskLogsRequest(task_id="t-own", rank=0, tail_lines=3)
        lines = [line.text for line in stub.StreamTaskLogs(request, timeout=10)]
        assert lines[0].startswith("step 6/6") and lines[-1].startswith("digest sha256:"), lines
        steps = list(stub.ReadStepLog(worker_pb2.ReadStepLogRequest(task_id="t-own"), timeout=10))
        assert [s.step for s in steps] == [1, 2, 3, 4, 5, 6]
        assert all(math.isfinite(s.loss) and s.time > 0 for s in steps)
        later = worker_pb2.ReadStepLogRequest(task_id="t-own", after_step=4)
        assert [s.step for s in stub.ReadStepLog(later, timeout=10)] == [5, 6]
        with pytest.raises(grpc.RpcError) as info:
            list(stub.StreamTaskLogs(worker_pb2.StreamTaskLogsRequest(task_id="t-own", rank=5)))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    cached = list((tmp_path / "work" / "code").iterdir())
    assert [p.name for p in cached] == [package.sha256]


def test_a_task_whose_code_package_is_missing_fails_saying_so(
    daemons: DaemonFactory, fake: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    recorder, address = fake
    job_spec = spec(6)
    job_spec.entrypoint.code_sha256 = "ab" * 32
    worker = start_worker(daemons, address, tmp_path)
    with connect(worker.address) as channel:
        worker_pb2_grpc.WorkerAgentStub(channel).StartTask(
            start_request(tmp_path, "t-nocode", job_spec)
        )
    final = finished(recorder, "t-nocode")
    assert final.state == C.TASK_STATE_FAILED
    assert "could not start" in final.message and "abab" in final.message, final.message
