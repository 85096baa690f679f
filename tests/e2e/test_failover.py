"""A scheduler leader killed with SIGKILL under load: its standby takes over from the
database (scheduler/state/leader.py), the workers and a client that know both addresses
ride over it, no job is lost, no task is started twice, and the running jobs end with
their fixed runs' digests.

Two scheduler processes share the test's PostgreSQL database: the DevCluster's (the
first leader) and a second one started beside it, which waits as a standby. A thread
submits jobs in a loop (bench/load.py's submissions, lighter: they ask for a type no
worker has, so they queue) through a client given both addresses. The test reports the
takeover time: from the SIGKILL to the first submission the new leader serves.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearshift.client.devcluster import DevCluster
from gearshift.client.processes import DaemonProcess, start_daemon
from gearshift.client.sdk import Client
from gearshift.common.errors import GearshiftError
from gearshift.common.ports import free_port_in
from gearshift.v1 import common_pb2
from tests.e2e.worker_cluster import (
    READY_TIMEOUT,
    digits_spec,
    e2e_cluster,
    reference,
    shared_dir,
)
from tests.helpers import wait_until

STEPS = 80  # with 2 ESTs: test_elastic_las's reference, computed once a session
ESTS = 2
WAIT = 180.0
TAKEOVER_LIMIT_S = 5.0  # the target is 2 s (issue 46); this is the most it may take
C = common_pb2
STARTING = re.compile(r"starting task.*?task_id=(\S+)")


@pytest.fixture
def cluster(tmp_path: Path, postgres_db: str, redis_url: str) -> Iterator[DevCluster]:
    cluster = e2e_cluster(tmp_path, postgres_db, redis_url, workers=())
    try:
        yield cluster
    finally:
        cluster.stop()


def _standby(cluster: DevCluster, database: str) -> tuple[DaemonProcess, str]:
    """A second scheduler on the same database and file, at an address of its own."""
    listen = f"127.0.0.1:{free_port_in(20000, 29000)}"
    args = ["--database-url", database, "--config", str(cluster.scheduler_file)]
    args += ["--log-format", "text"]
    daemon = start_daemon(
        "scheduler-b", args, run_dir=cluster.logs, listen=listen, module="gearshift.scheduler"
    )
    return daemon, listen


class Submissions:
    """bench/load.py's submit loop, light: one queued job after another, through a client
    that knows both schedulers; each accepted job id, and when each was served."""

    def __init__(self, addresses: str) -> None:
        self.client = Client(addresses, timeout=2.0)
        self.accepted: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            spec = digits_spec(f"load-{n}", 10)
            spec.accelerator_types.append("v100")  # none here: it waits in the queue
            try:
                job = self.client.submit(spec, idempotency_key=f"load-{n}")
            except GearshiftError:
                self._stop.wait(0.05)  # no leader serves yet: the next try
                continue
            self.accepted.append((time.monotonic(), job.job_id))
            n += 1
            self._stop.wait(0.05)

    def __enter__(self) -> Submissions:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.client.close()


def test_a_killed_leader_is_replaced_within_seconds_losing_nothing(
    cluster: DevCluster, postgres_db: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ref = reference(shared_dir(tmp_path_factory), STEPS, ests=ESTS)
    cluster.start(READY_TIMEOUT)
    leader = cluster.address("scheduler")
    standby, second = _standby(cluster, postgres_db)  # starts while the workers do
    both = f"{leader},{second}"
    cluster.config.flags = {"workers": ["--scheduler", both]}
    cluster.add_workers([("w1", "cpu:2"), ("w2", "cpu:2")], READY_TIMEOUT)
    try:
        wait_until(lambda: "standby:" in standby.log_path.read_text(), 60, "a standby")
        assert "serving writes" not in standby.log_path.read_text()  # it answers reads only
        with Client(both, timeout=10) as client:
            jobs = [
                client.submit(digits_spec(f"run-{i}", STEPS, ests=ESTS)).job_id for i in range(2)
            ]
            wait_until(
                lambda: all(client.get(j).progress.step >= 5 for j in jobs),
                WAIT,
                "both jobs running",
            )
        with Submissions(both) as load:
            wait_until(lambda: len(load.accepted) >= 5, 30, "submissions served")
            cluster.daemons["scheduler"].kill()
            killed = time.monotonic()
            wait_until(lambda: any(t > killed for t, _ in load.accepted), 30, "a served submission")
            takeover = min(t for t, _ in load.accepted if t > killed) - killed
            wait_until(lambda: sum(t > killed for t, _ in load.accepted) >= 3, 30, "more")
        print(f"takeover: first submission served {takeover:.2f} s after the SIGKILL")
        assert takeover < TAKEOVER_LIMIT_S, takeover
        assert "elected leader" in standby.log_path.read_text()

        with Client(both, timeout=10) as client:
            for _, job_id in load.accepted:  # no job lost: each accepted one is known
                assert client.get(job_id).state == C.JOB_STATE_QUEUED, job_id
            for job_id in jobs:
                job = client.wait(job_id, timeout=WAIT)
                assert job.state == C.JOB_STATE_SUCCEEDED, job.message + cluster.log_tails()
                assert job.final_digest == ref.digest
        starts = Counter(
            task_id
            for worker in ("w1", "w2")
            for task_id in STARTING.findall((cluster.logs / f"{worker}.log").read_text())
        )
        assert starts and all(n == 1 for n in starts.values()), starts  # no task twice
    finally:
        standby.stop()
