"""The chaos run: a whole cluster on its own PostgreSQL and Redis, jobs on it, and a driver
that, at seeded random moments, SIGKILLs one of the scheduler, the Brain, the shard
manager, a worker daemon, a training process or Redis, or crashes PostgreSQL, and starts
it again. Shared by the CI test (tests/chaos/test_chaos.py) and the long soak
(`python -m tests.chaos.soak --minutes 30`)."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from gearshift.client.devcluster import SERVICES, DevCluster
from gearshift.client.sdk import Client
from gearshift.common.channel import connect
from gearshift.common.errors import DeadlineExceededError, UnavailableError
from gearshift.v1 import common_pb2, scheduler_pb2, shardmanager_pb2, shardmanager_pb2_grpc
from tests.chaos.services import PrivatePostgres, PrivateRedis
from tests.e2e.worker_cluster import WORKERS, e2e_cluster, started
from tests.helpers import live_pids

KINDS = ("scheduler", "brain", "shardmanager", "worker", "training", "redis", "postgres")
RESTART_TIMEOUT = 90.0


@dataclass
class Site:
    """The daemons of a chaos run and the PostgreSQL and Redis of its own under them."""

    cluster: DevCluster
    postgres: PrivatePostgres
    redis: PrivateRedis


def index_dir(run_dir: Path) -> Path:
    """Where the dynamic job's training processes log what they read (--index-log-dir)."""
    return run_dir / "index"


@contextmanager
def chaos_site(root: Path, *, max_restarts: int = 1000) -> Iterator[Site]:
    """A started cluster on a fresh PostgreSQL and Redis; everything stopped afterwards."""
    postgres = PrivatePostgres()
    redis = PrivateRedis(root / "redis")
    cluster = e2e_cluster(
        root,
        postgres.url,
        redis.url,
        workers=WORKERS,
        flags={"workers": ["--index-log-dir", str(index_dir(root / "cluster"))]},
        scheduler={"limits": {"maxRestarts": max_restarts}},
    )
    try:
        postgres.start()
        redis.start()
        started(cluster)
        yield Site(cluster, postgres, redis)
    finally:
        cluster.stop()
        redis.close()
        postgres.close()


def training_pids(cluster: DevCluster, job_id: str = "") -> list[int]:
    """Live training processes of the cluster's workers (of one job, if given). A spawned
    rank runs `gearshift.worker.run`; a forked one keeps the zygote's command line."""
    return live_pids(
        cluster.work_root.glob(f"*/tasks/{job_id}*/rank*.pid"),
        (b"gearshift.worker.run", b"gearshift.worker.zygote"),
    )


@dataclass
class Chaos:
    """Kills one part of the cluster at a time, then starts it again and waits until it serves."""

    site: Site
    rng: random.Random
    pause: tuple[float, float] = (0.3, 1.5)  # seconds between one restart and the next kill
    kills: Counter[str] = field(default_factory=Counter)
    journal: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    focus: str = ""  # a job whose training processes half of the "training" kills go to
    focus_hits: int = 0
    _order: list[str] = field(default_factory=list)

    def next_kind(self) -> str:
        """Every kind once in a shuffled cycle, then another cycle: each is hit early on."""
        if not self._order:
            self._order = list(KINDS)
            self.rng.shuffle(self._order)
        return self._order.pop()

    def strike(self, kind: str) -> str:
        """Kill one `kind` and start it again; what was done, in words."""
        c = self.site.cluster
        if kind in SERVICES:
            c.restart(kind, kill=True, timeout=RESTART_TIMEOUT)
            return "shard manager" if kind == "shardmanager" else kind
        if kind == "worker":
            worker_id, _ = self.rng.choice(WORKERS)
            c.restart(worker_id, kill=True, timeout=RESTART_TIMEOUT)
            return f"worker {worker_id}"
        if kind == "training":
            focused = sorted(training_pids(c, self.focus)) if self.focus else []
            pids = focused if focused and self.rng.random() < 0.5 else sorted(training_pids(c))
            if not pids:
                return "no training process ran"
            pid = self.rng.choice(pids)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return "a training process that had just exited"
            if pid in focused:
                self.focus_hits += 1
                return f"training process {pid} of {self.focus}"
            return f"training process {pid}"
        if kind == "redis":
            self.site.redis.kill()
            self.site.redis.start()
            return "redis"
        if kind == "postgres":
            self.site.postgres.crash()
            self.site.postgres.start()
            return "postgres"
        raise ValueError(f"no such kind {kind!r}")

    def run(self) -> None:
        """Strike until `stop` is set (a thread's target; its error is kept in `error`)."""
        try:
            while not self.stop.wait(self.rng.uniform(*self.pause)):
                kind = self.next_kind()
                started = time.monotonic()
                what = self.strike(kind)
                self.kills[kind] += 1
                self.journal.append(f"{what} ({time.monotonic() - started:.1f} s to come back)")
        except BaseException as exc:  # the test reports it
            self.error = exc

    @contextmanager
    def running(self) -> Iterator[Chaos]:
        thread = threading.Thread(target=self.run, name="chaos", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            thread.join(RESTART_TIMEOUT * 2)


def job_states(cluster: DevCluster, job_ids: list[str]) -> dict[str, scheduler_pb2.Job] | None:
    """Every job as the scheduler has it now, or None while it is down."""
    try:
        with Client(cluster.address("scheduler"), timeout=5) as client:
            return {job_id: client.get(job_id) for job_id in job_ids}
    except (UnavailableError, DeadlineExceededError):
        return None


def submit(cluster: DevCluster, spec: common_pb2.JobSpec) -> str:
    """Submit, retrying while the scheduler is being restarted."""
    deadline = time.monotonic() + RESTART_TIMEOUT
    while True:
        try:
            with Client(cluster.address("scheduler"), timeout=10) as client:
                return client.submit(spec).job_id
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


@dataclass
class ShardLedger:
    """The dynamic job's shard accounting, read from the shard manager while the job runs
    (its dataset is deleted when the job ends): per epoch, the newest progress seen."""

    cluster: DevCluster
    dataset_id: str
    epochs: dict[int, shardmanager_pb2.EpochProgress] = field(default_factory=dict)
    num_shards: int = 0
    size: int = 0

    def poll(self) -> None:
        with connect(self.cluster.address("shardmanager")) as channel:
            stub = shardmanager_pb2_grpc.ShardManagerStub(channel)
            request = shardmanager_pb2.DescribeDatasetRequest(dataset_id=self.dataset_id)
            try:
                data = stub.DescribeDataset(request, timeout=2)
            except grpc.RpcError as exc:
                if exc.code() in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    grpc.StatusCode.NOT_FOUND,  # not created yet, or deleted at the end
                ):
                    return
                raise
        self.num_shards, self.size = data.num_shards, data.config.size
        for progress in data.epochs:
            self.epochs[progress.epoch] = progress

    def closed_epochs(self) -> list[shardmanager_pb2.EpochProgress]:
        """Epochs every shard of which was handed out and none is held any more."""
        return [
            p
            for _, p in sorted(self.epochs.items())
            if p.samples_todo == 0 and p.samples_in_flight == 0
        ]
