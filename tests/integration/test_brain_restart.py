"""A PostgreSQL restart during ingest: no acknowledged sample is lost, calls during the outage
fail with UNAVAILABLE, and the Brain keeps serving afterwards.

The shared test PostgreSQL must not be restarted (others use it), so this test
runs its own throwaway cluster: `initdb` + `pg_ctl` from the PostgreSQL server
binaries (found with pg_config or under /usr/lib/postgresql/*/bin), in a temp
folder, on a free port. The server refuses to run as root, so as root the
commands run as the `postgres` user through `runuser`. The stop is
`pg_ctl stop -m immediate` (no shutdown checkpoint: a crash, recovered from
the WAL on start).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from gearshift.common.channel import connect
from gearshift.common.db import create_engine
from gearshift.common.ports import free_port
from gearshift.v1 import brain_pb2, brain_pb2_grpc, common_pb2
from tests.conftest import REQUIRE_SERVICES, DaemonFactory
from tests.helpers import wait_until

BATCH = 100


def _bindir() -> Path | None:
    pg_config = shutil.which("pg_config")
    candidates = []
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidates.append(out.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for folder in candidates:
        if folder and (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    return None


@dataclass
class Cluster:
    """A throwaway PostgreSQL server: start, crash-stop, start again."""

    bindir: Path
    root: Path
    port: int
    as_user: list[str]

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        result = subprocess.run(
            [*self.as_user, *args], capture_output=True, text=True, check=False, timeout=120
        )
        assert result.returncode == 0, f"{args[0]} failed: {result.stdout}{result.stderr}"

    def init(self) -> None:
        self._run(
            str(self.bindir / "initdb"),
            "-D", str(self.root / "data"), "-U", "postgres", "-A", "trust", "--no-sync",
        )  # fmt: skip

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-l",
            str(self.root / "server.log"), "-o", options, "-w", "-t", "60", "start",
        )  # fmt: skip

    def crash(self) -> None:
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate",
            "-w", "stop",
        )  # fmt: skip

    def stop(self) -> None:
        subprocess.run(
            [*self.as_user, str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"),
             "-m", "fast", "-w", "stop"],
            capture_output=True, check=False, timeout=120,
        )  # fmt: skip


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    bindir = _bindir()
    if bindir is None:
        reason = "PostgreSQL server binaries (initdb, pg_ctl) not found"
        if REQUIRE_SERVICES:
            pytest.fail(f"{reason} (GEARSHIFT_REQUIRE_SERVICES=1)")
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="gs-brain-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    server = Cluster(bindir, root, free_port(), as_user)
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Ingest:
    """Sends numbered batches until told to stop; remembers how each call ended."""

    stub: brain_pb2_grpc.BrainStub
    acked: list[int] = field(default_factory=list)
    failed: dict[int, grpc.StatusCode] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    next_batch: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, number: int) -> bool:
        request = brain_pb2.ReportSamplesRequest(
            batch_id=f"batch-{number}",
            job_id="job",
            samples=[
                brain_pb2.RuntimeSample(
                    time=1e9 + number * BATCH + i,
                    step=number * BATCH + i,
                    steps_per_second=5.0,
                    accelerator_type="v100",
                    device_count=1,
                )
                for i in range(BATCH)
            ],
        )
        try:
            self.stub.ReportSamples(request, timeout=15)
        except grpc.RpcError as exc:
            with self.lock:
                self.failed[number] = exc.code()
                self.details.append(str(exc.details()))
            return False
        with self.lock:
            self.acked.append(number)
            self.failed.pop(number, None)
        return True

    def run(self) -> None:
        while not self.stop.is_set():
            self.send(self.next_batch)
            self.next_batch += 1
            # Pace the sender so the outage sees calls without flooding the log.
            self.stop.wait(0.02)

    def count(self) -> int:
        with self.lock:
            return len(self.acked)


@pytest.mark.slow
def test_postgres_restart_loses_no_acknowledged_sample(
    cluster: Cluster, daemons: DaemonFactory
) -> None:
    daemon = daemons("brain", ["--database-url", cluster.url])
    with connect(daemon.address, retry=False, timeout=15) as channel:
        stub = brain_pb2_grpc.BrainStub(channel)
        stub.ReportJobEvent(
            brain_pb2.ReportJobEventRequest(
                event_id="submit",
                job_id="job",
                kind=brain_pb2.JOB_EVENT_KIND_SUBMITTED,
                spec=common_pb2.JobSpec(
                    name="job",
                    entrypoint=common_pb2.Entrypoint(module="gearshift.examples.mlp"),
                    num_ests=1,
                    global_batch_size=8,
                    total_steps=10,
                    dataset=common_pb2.DatasetSpec(size=100, shard_size=10),
                ),
            )
        )
        ingest = Ingest(stub)
        sender = threading.Thread(target=ingest.run, name="ingest")
        sender.start()
        try:
            wait_until(lambda: ingest.count() >= 5, 60, "no batch acknowledged before the restart")
            before = ingest.count()
            cluster.crash()
            wait_until(
                lambda: grpc.StatusCode.UNAVAILABLE in set(ingest.failed.values()),
                60,
                "no call failed with UNAVAILABLE during the outage",
            )
            assert daemon.process.poll() is None, daemon.log_tail()
            outage_failures = len(ingest.failed)
            cluster.start()
            wait_until(
                lambda: ingest.count() >= before + 5, 60, "ingest did not resume after restart"
            )
        finally:
            ingest.stop.set()
            sender.join(30)
        assert not sender.is_alive()
        assert set(ingest.failed.values()) <= {grpc.StatusCode.UNAVAILABLE}, ingest.failed
        assert all("database unavailable" in d for d in ingest.details), ingest.details[:3]
        assert outage_failures >= 1
        # The client retries what failed, with the same batch ids (idempotent).
        for number in sorted(ingest.failed):
            assert ingest.send(number), ingest.details[-1]
        acked = sorted(ingest.acked)
        assert acked == list(range(ingest.next_batch)), "a batch was neither acked nor retried"
        # Every acknowledged sample is in the database, exactly once.
        engine = create_engine(cluster.url)
        with engine.connect() as conn:
            steps = list(
                conn.execute(
                    sa.text("select step from brain_samples where job_id = 'job' order by step")
                ).scalars()
            )
        engine.dispose()
        assert steps == list(range(len(acked) * BATCH)), "lost or duplicated samples"
        history = stub.GetJobHistory(brain_pb2.GetJobHistoryRequest(job_id="job", max_samples=500))
        assert [s.step for s in history.samples] == steps[-500:]
        # Still serving other calls after the restart.
        estimate = stub.EstimateThroughput(
            brain_pb2.EstimateThroughputRequest(
                job_id="job", accelerator_type="v100", device_count=1
            )
        )
        assert estimate.source == brain_pb2.ESTIMATE_SOURCE_OWN_SAMPLES
    assert daemon.process.poll() is None
    print(
        f"\nrestart test: {len(acked)} batches acknowledged, {outage_failures} UNAVAILABLE "
        f"during the outage (retried), {len(steps)} samples present"
    )
