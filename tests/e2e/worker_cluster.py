"""A whole Gearshift cluster as real processes for the worker end-to-end tests.

Brain and scheduler on the test's PostgreSQL database, a shard manager on the
test Redis, 1-3 worker daemons offering CPU slots; daemons that do not depend
on each other start in parallel. The reference a job through the cluster must
match is the same job run directly by the runtime's launcher on a fixed 4
processes; it is computed once per test session and shared by the xdist
workers through a file lock.
"""

from __future__ import annotations

import fcntl
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gearshift.client.processes import DaemonProcess, start_daemon
from gearshift.client.sdk import Client
from gearshift.common.auth import ClientTls
from gearshift.common.channel import connect
from gearshift.common.ports import free_port_in
from gearshift.v1 import common_pb2, scheduler_pb2, worker_pb2, worker_pb2_grpc
from tests.helpers import live_pids

CNN = "gearshift.examples.digits_cnn"
CONFIG = '{"lr": 0.05}'
ESTS = 4
BATCH = 16
SEED = 7
SIZE = 512  # 128 samples per EST per epoch: 32 steps an epoch
SHARD = 16
CHECKPOINT_EVERY = 10
HEARTBEAT = ("0.5", "5")  # interval, timeout (seconds)

C = common_pb2
S = scheduler_pb2


def digits_spec(name: str, steps: int, *, ests: int = ESTS, min_devices: int = 1) -> C.JobSpec:
    """The digits CNN job of these tests (every e2e test compares against one reference)."""
    return C.JobSpec(
        name=name,
        entrypoint=C.Entrypoint(module=CNN, config_json=CONFIG),
        num_ests=ests,
        global_batch_size=BATCH // ESTS * ests,
        total_steps=steps,
        dataset=C.DatasetSpec(name="digits", size=SIZE, shard_size=SHARD, seed=SEED),
        elastic=C.ElasticBounds(min_devices=min_devices, max_devices=ests),
        checkpoint_every_steps=CHECKPOINT_EVERY,
    )


def reference_command(
    directory: Path, steps: int, *, ests: int = ESTS, determinism: str = "D1"
) -> list[str]:
    """`python -m gearshift.worker.run` on a fixed N processes, with the spec's settings."""
    return [
        sys.executable,
        "-m",
        "gearshift.worker.run",
        "--job",
        CNN,
        "--config",
        CONFIG,
        "--ests",
        str(ests),
        "--procs",
        str(ests),
        "--steps",
        str(steps),
        "--batch-size",
        str(BATCH // ESTS * ests),
        "--determinism",
        determinism,
        "--seed",
        str(SEED),
        "--shard-size",
        str(SHARD),
        "--data-size",
        str(SIZE),
        "--checkpoint-dir",
        str(directory / "ckpt"),
        "--checkpoint-every",
        str(CHECKPOINT_EVERY),
        "--loss-log",
        str(directory / "losses.jsonl"),
        "--log-every",
        "1000",
    ]


@dataclass(frozen=True)
class Reference:
    digest: str
    losses: dict[int, list[str]]  # step -> every EST's loss bits


def reference(
    shared_dir: Path, steps: int, *, ests: int = ESTS, determinism: str = "D1"
) -> Reference:
    """The fixed-placement run's digest and losses, computed once per session (file lock)."""
    name = f"reference-{steps}" + (
        "" if (ests, determinism) == (ESTS, "D1") else f"-{ests}-{determinism}"
    )
    directory = shared_dir / name
    result = directory / "result.json"
    shared_dir.mkdir(parents=True, exist_ok=True)
    with (shared_dir / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            directory.mkdir(parents=True, exist_ok=True)
            run = subprocess.run(
                reference_command(directory, steps, ests=ests, determinism=determinism),
                check=False,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert run.returncode == 0, run.stdout + run.stderr
            digest = re.findall(r"^digest sha256:([0-9a-f]{64})$", run.stdout, re.MULTILINE)[-1]
            losses = step_log(directory / "losses.jsonl")
            result.write_text(json.dumps({"digest": digest, "losses": losses}))
    data = json.loads(result.read_text())
    return Reference(data["digest"], {int(k): v for k, v in data["losses"].items()})


def step_log(path: Path) -> dict[int, list[str]]:
    """step -> loss bits from a loss log; a step run twice must have the same bits."""
    by_step: dict[int, list[str]] = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a line cut by a SIGKILL mid-write
            continue
        step, bits = int(record["step"]), list(record["loss_bits"])
        assert by_step.setdefault(step, bits) == bits, f"step {step} ran twice with other losses"
        by_step[step] = bits
    return by_step


def step_sequence(path: Path) -> list[int]:
    """Every step in the order rank 0 of each placement ran it (repeats after restarts)."""
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError):
            continue
    return out


def rendezvous_base() -> int:
    """This test's own range of the scheduler's 100 rendezvous ports (parallel tests should
    not share one: a port taken by another test costs a job a restart)."""
    return free_port_in(30000, 32700) // 100 * 100


@dataclass
class Cluster:
    """The daemons of one test; `close()` stops what is still running."""

    root: Path
    database: str
    redis_url: str
    scheduler_args: Sequence[str] = ()
    common_args: Sequence[str] = ()  # given to every daemon (e.g. TLS flags)
    service_args: Sequence[str] = ()  # given to the Brain, shard manager and scheduler
    worker_args: Callable[[str], Sequence[str]] = lambda worker_id: ()
    tls: ClientTls | None = None  # how the test reaches the daemons
    token: str = ""  # what the test calls the scheduler with
    processes: list[DaemonProcess] = field(default_factory=list)
    brain: DaemonProcess | None = None
    shards: DaemonProcess | None = None
    scheduler: DaemonProcess | None = None
    workers: dict[str, DaemonProcess] = field(default_factory=dict)
    scheduler_port: int = 0
    shards_port: int = 0
    brain_port: int = 0
    _count: int = 0

    @property
    def checkpoint_root(self) -> Path:
        return self.root / "checkpoints"

    def _start(
        self, name: str, args: Sequence[str], module: str | None = None, listen: str = ""
    ) -> DaemonProcess:
        self._count += 1
        daemon = start_daemon(
            name,
            [*args, *self.common_args, "--log-format", "text"],
            run_dir=self.root / "run" / f"{self._count:02d}-{name}",
            module=module,
            listen=listen or "127.0.0.1:0",
            tls=self.tls,
        )
        self.processes.append(daemon)
        return daemon

    def start(self, workers: Iterable[tuple[str, str]] = (("w1", "cpu:2"), ("w2", "cpu:2"))):
        """Brain and shard manager, then the scheduler, then the workers (each ready)."""
        self.brain_port = free_port_in(20000, 30000)
        self.start_brain()
        self.shards_port = free_port_in(20000, 30000)
        self.start_shard_manager()
        assert self.shards is not None and self.brain is not None
        ready([self.brain, self.shards])
        self.scheduler_port = free_port_in(20000, 30000)
        self.start_scheduler()
        assert self.scheduler is not None
        ready([self.scheduler])
        ready([self.add_worker(wid, devices, wait=False) for wid, devices in workers])
        return self

    def start_brain(self) -> DaemonProcess:
        self.brain = self._start(
            "brain",
            ["--database-url", self.database, *self.service_args],
            listen=f"127.0.0.1:{self.brain_port}",
        )
        return self.brain

    def start_shard_manager(self) -> DaemonProcess:
        self.shards = self._start(
            "shardmanager",
            ["--redis-url", self.redis_url, *self.service_args],
            listen=f"127.0.0.1:{self.shards_port}",
        )
        return self.shards

    def start_scheduler(self) -> DaemonProcess:
        assert self.brain is not None and self.shards is not None
        interval, timeout = HEARTBEAT
        self.scheduler = self._start(
            "scheduler",
            [
                "--database-url",
                self.database,
                "--brain-address",
                f"127.0.0.1:{self.brain_port}",
                "--shard-manager-address",
                f"127.0.0.1:{self.shards_port}",
                "--checkpoint-root",
                str(self.checkpoint_root),
                "--round-seconds",
                "1",
                "--heartbeat-interval",
                interval,
                "--heartbeat-timeout",
                timeout,
                "--stop-timeout",
                "30",
                "--rendezvous-port-base",
                str(rendezvous_base()),
                *self.service_args,
                *self.scheduler_args,
            ],
            listen=f"127.0.0.1:{self.scheduler_port}",
        )
        return self.scheduler

    def add_worker(self, worker_id: str, devices: str, *, wait: bool = True) -> DaemonProcess:
        daemon = self._start(
            "worker",
            [
                "--scheduler",
                f"127.0.0.1:{self.scheduler_port}",
                "--devices",
                devices,
                "--worker-id",
                worker_id,
                "--work-dir",
                str(self.root / "work" / worker_id),
                "--report-interval",
                "0.5",
                *self.worker_args(worker_id),
            ],
            module="gearshift.worker",
        )
        self.workers[worker_id] = daemon
        if wait:
            ready([daemon])
        return daemon

    def client(self) -> Client:
        return Client(
            f"127.0.0.1:{self.scheduler_port}", tls=self.tls, token=self.token or None, timeout=10
        )

    def worker_tasks(self, worker_id: str) -> list[C.TaskStatus]:
        with connect(self.workers[worker_id].address) as channel:
            stub = worker_pb2_grpc.WorkerAgentStub(channel)
            return list(stub.DescribeWorker(worker_pb2.DescribeWorkerRequest()).tasks)

    def close(self) -> None:
        """Workers first (they report their tasks' ends), then the services."""
        workers = set(map(id, self.workers.values()))
        for daemon in sorted(reversed(self.processes), key=lambda d: id(d) not in workers):
            daemon.stop()

    def logs(self) -> str:
        """Every daemon's log tail, for a failing assertion's message."""
        return "\n".join(f"--- {d.name}\n{d.log_tail(40)}" for d in self.processes)


def ready(daemons: Sequence[DaemonProcess], timeout: float = 90.0) -> None:
    with ThreadPoolExecutor(max_workers=max(len(daemons), 1)) as pool:
        list(pool.map(lambda d: d.wait_ready(timeout), daemons))


def running_on(job: S.Job) -> dict[str, int]:
    """worker id -> processes of the job there."""
    out: dict[str, int] = {}
    for process in job.placement.processes:
        out[process.worker_id] = out.get(process.worker_id, 0) + 1
    return out


def training_processes(cluster: Cluster, worker_id: str = "*", task_id: str = "*") -> list[int]:
    """Pids of a worker's training processes that still run (the daemon writes rank<R>.pid);
    `*` for every worker or task."""
    return live_pids((cluster.root / "work").glob(f"{worker_id}/tasks/{task_id}/rank*.pid"))
