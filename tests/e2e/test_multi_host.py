"""Jobs across hosts, for real (issue 46 point 4): worker daemons each in its own network
namespace (tests/netns.py), the scheduler, Brain and shard manager in the root namespace
listening on the bridge address. Every byte between hosts crosses a real TCP stack and the
bridge; a worker advertises its namespace's address, and 127.0.0.1 in a namespace is that
host's own.

- An EST job (the digits CNN, 4 ESTs on 2 hosts) trains with gloo across the namespaces and
  ends with the digest of the same job on a fixed 4 processes.
- A PS job spans two hosts, its PS and worker processes meeting through a TCP store: by
  hand (two launchers), and placed by the scheduler (parameter_server.slots), ending with
  the digest of the same job on one host.
- Killing one host (every process in its namespace) moves the job to the others, which end
  it with the same digest.

Skipped with the reason when namespaces cannot be made; a failure under
GEARSHIFT_REQUIRE_SERVICES=1 (CI runs as root).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gearshift.client.devcluster import DevCluster
from gearshift.v1 import common_pb2, scheduler_pb2
from gearshift.worker.ps import checkpoint as ckpt
from tests import netns
from tests.conftest import REQUIRE_SERVICES
from tests.e2e.worker_cluster import (
    CHECKPOINT_EVERY,
    Reference,
    client_of,
    digits_spec,
    e2e_cluster,
    reference,
    running_on,
    shared_dir,
    started,
    step_log,
)
from tests.helpers import wait_until

C = common_pb2
S = scheduler_pb2
STEPS = 40
WAIT = 120.0
SLOW = ("--step-delay", "0.1")  # the daemon's test-only flag: seconds added to a step
PS_STEPS = 100  # global batches of 128 samples: about a second of training
PS_STORE_PORT = 29555  # in host 1's own namespace: no other program can hold it


@pytest.fixture
def hosts_possible() -> None:
    reason = netns.unavailable()
    if reason:
        if REQUIRE_SERVICES:
            pytest.fail(f"{reason} (GEARSHIFT_REQUIRE_SERVICES=1)")
        pytest.skip(reason)


@pytest.fixture
def ref(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return reference(shared_dir(tmp_path_factory), STEPS)


def hosts_cluster(
    root: Path,
    database: str,
    redis_url: str,
    net: netns.Network,
    *,
    slots: str = "cpu:2",
    scheduler: dict[str, Any] | None = None,
    worker_flags: tuple[str, ...] = (),
) -> DevCluster:
    """Services on the bridge address; worker `w<i>` (`slots`, `worker_flags`) in host i's
    namespace."""
    workers = tuple((f"w{i}", slots) for i in range(1, len(net.hosts) + 1))
    flags = {name: list(worker_flags) for name, _ in workers}
    cluster = e2e_cluster(
        root, database, redis_url, workers=workers, flags=flags, scheduler=scheduler
    )
    cluster.config.host = net.bridge_address
    cluster.config.listen_hosts = {
        name: h.address for (name, _), h in zip(workers, net.hosts, strict=True)
    }
    cluster.config.wrappers = {
        name: h.command(()) for (name, _), h in zip(workers, net.hosts, strict=True)
    }
    return cluster


@pytest.fixture
def two_hosts(
    hosts_possible: None, tmp_path: Path, postgres_db: str, redis_url: str
) -> Iterator[tuple[DevCluster, netns.Network]]:
    with netns.network(2) as net:
        cluster = hosts_cluster(tmp_path, postgres_db, redis_url, net)
        try:
            yield started(cluster), net
        finally:
            cluster.stop()


@pytest.fixture
def three_hosts(
    hosts_possible: None, tmp_path: Path, postgres_db: str, redis_url: str
) -> Iterator[tuple[DevCluster, netns.Network]]:
    with netns.network(3) as net:
        # A step of 0.1 s: the job's 40 steps last long enough for its host to be killed
        # mid-run (a few ms a step, it sometimes ended before the kill mattered).
        cluster = hosts_cluster(tmp_path, postgres_db, redis_url, net, worker_flags=SLOW)
        try:
            yield started(cluster), net
        finally:
            cluster.stop()


def test_an_est_job_spans_two_hosts(
    two_hosts: tuple[DevCluster, netns.Network], ref: Reference
) -> None:
    cluster, net = two_hosts
    # Each worker advertises its own namespace's address, the services the bridge's.
    for i, host in enumerate(net.hosts, start=1):
        assert cluster.address(f"w{i}").rpartition(":")[0] == host.address
        assert cluster.daemons[f"w{i}"].process.pid in host.pids()
    assert cluster.address("scheduler").startswith(net.bridge_address + ":")
    with client_of(cluster) as client:
        job_id = client.submit(digits_spec("across", STEPS)).job_id
        job = client.wait(job_id, timeout=WAIT)
        began = next(e for e in client.watch(job_id) if e.type == S.JOB_EVENT_TYPE_STARTED)
    assert job.state == C.JOB_STATE_SUCCEEDED, job.message + cluster.log_tails()
    assert running_on(S.Job(placement=began.placement)) == {"w1": 2, "w2": 2}
    assert job.final_digest == ref.digest
    assert step_log(cluster.checkpoint_root / job_id / "steps.jsonl") == ref.losses


@pytest.fixture
def two_one_slot_hosts(
    hosts_possible: None, tmp_path: Path, postgres_db: str, redis_url: str
) -> Iterator[tuple[DevCluster, netns.Network]]:
    """One CPU slot a worker, so a PS job of 2 slots spans both hosts. No Brain: a PS job
    runs its spec's counts throughout (a plan of the Brain's would restart it)."""
    no_brain = {"cluster": {"brainAddress": ""}}
    with netns.network(2) as net:
        cluster = hosts_cluster(
            tmp_path, postgres_db, redis_url, net, slots="cpu:1", scheduler=no_brain
        )
        try:
            yield started(cluster), net
        finally:
            cluster.stop()


def ps_spec(name: str, slots: int) -> C.JobSpec:
    """2 PS and 1 worker: one worker waits for its pushes before its next batch, so the
    job's bits do not depend on timing, and a fixed run's digest can be compared."""
    return C.JobSpec(
        name=name,
        total_steps=PS_STEPS,
        parameter_server=C.ParameterServerSpec(
            ps=2, workers=1, seed=5, fields=4, vocab=2000, batch=128, train_blocks=100,
            eval_blocks=5, slots=slots,
        ),
    )  # fmt: skip


def test_the_scheduler_spreads_a_ps_job_over_two_hosts(
    two_one_slot_hosts: tuple[DevCluster, netns.Network],
) -> None:
    """parameter_server.slots = 2 on one-slot workers: a launcher on each host, PS 0 and the
    worker on w1's (rank 0: it serves the TCP store on its host), PS 1 on w2's; the job ends
    with the digest of the same job on one host (slots = 1, a file store)."""
    cluster, _ = two_one_slot_hosts
    with client_of(cluster) as client:
        spread = client.submit(ps_spec("spread", 2)).job_id
        fixed = client.submit(ps_spec("fixed", 1)).job_id
        done = {job_id: client.wait(job_id, timeout=WAIT) for job_id in (spread, fixed)}
        began = next(e for e in client.watch(spread) if e.type == S.JOB_EVENT_TYPE_STARTED)
    for job in done.values():
        assert job.state == C.JOB_STATE_SUCCEEDED, job.message + cluster.log_tails()
        assert job.final_digest
    assert running_on(S.Job(placement=began.placement)) == {"w1": 1, "w2": 1}
    assert done[spread].final_digest == done[fixed].final_digest
    root = cluster.checkpoint_root
    assert not list((root / spread).rglob("rpc.store"))  # met through the TCP store
    assert list((root / fixed).rglob("rpc.store"))  # one host: the file store
    logs = {w: (cluster.logs / f"{w}.log").read_text() for w in ("w1", "w2")}
    assert all(f"{spread}.g1.{w}" in logs[w] for w in logs)  # a task, a launcher, each


@pytest.fixture
def two_bare_hosts(hosts_possible: None) -> Iterator[netns.Network]:
    with netns.network(2) as net:
        yield net


def test_a_ps_job_spans_two_hosts_through_a_tcp_store(
    two_bare_hosts: netns.Network, tmp_path: Path
) -> None:
    """2 PS x 2 workers, PS 0 and worker 0 on host 1 (whose launcher serves the store and
    publishes the checkpoint), PS 1 and worker 1 on host 2: every lookup and push between
    them crosses the bridge."""
    h1, h2 = two_bare_hosts.hosts
    root = tmp_path / "ps"
    launcher = [
        sys.executable, "-m", "gearshift.worker.ps.run", "--ps", "2", "--workers", "2",
        "--steps", str(PS_STEPS), "--checkpoint-dir", str(root), "--train-blocks", "100",
        "--vocab", "2000", "--fields", "4", "--eval-blocks", "0", "--timeout", "90", "--json",
        "--store", f"{h1.address}:{PS_STORE_PORT}",
    ]  # fmt: skip
    runs = [
        subprocess.Popen(
            host.command([*launcher, *extra]), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for host, extra in (
            (h1, ["--serve-store", "--roles", "ps:0,worker:0"]),
            (h2, ["--roles", "ps:1,worker:1"]),
        )
    ]
    outputs = [run.communicate(timeout=120) for run in runs]
    for run, (out, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, (out + err).decode(errors="replace")[-3000:]
    first, second = (json.loads(out.decode().splitlines()[-1]) for out, _ in outputs)
    # Each launcher ran its half (one PS, one worker), and both report the whole phase.
    assert first["metrics"]["ps"] == first["metrics"]["workers"] == 1
    assert second["metrics"]["ps"] == second["metrics"]["workers"] == 1
    for res in (first, second):
        assert (res["ps"], res["workers"], res["end_batch"]) == (2, 2, PS_STEPS)
        assert res["batches_missing"] == res["batches_repeated"] == 0
        assert res["updates_acked"] == res["updates_applied"] > 0
    manifest = ckpt.read_manifest(root)
    assert manifest is not None and manifest.num_ps == 2 and manifest.next_batch == PS_STEPS
    # No file store: the processes met through the TCP store.
    assert not list(root.rglob("rpc.store"))


def test_a_lost_host_moves_the_job_to_the_others(
    three_hosts: tuple[DevCluster, netns.Network], ref: Reference
) -> None:
    cluster, net = three_hosts
    with client_of(cluster) as client:
        job_id = client.submit(digits_spec("survivor", STEPS)).job_id

        def checkpointed() -> S.Job | None:
            job = client.get(job_id)
            return job if job.progress.step > CHECKPOINT_EVERY else None

        job = wait_until(checkpointed, WAIT, "the job passes its first checkpoint")
        assert job is not None
        # Rank 0's host: its worker holds the rendezvous too.
        victim = job.placement.processes[0].worker_id
        host = net.hosts[int(victim.removeprefix("w")) - 1]
        killed = host.kill_all()
        assert cluster.daemons[victim].process.pid in killed
        done = client.wait(job_id, timeout=WAIT)
        workers = {w.worker_id: w.alive for w in client.cluster().workers}
        starts = [e for e in client.watch(job_id) if e.type == S.JOB_EVENT_TYPE_STARTED]
    assert done.state == C.JOB_STATE_SUCCEEDED, done.message + cluster.log_tails()
    assert workers[victim] is False
    # It started again on the other hosts, from its checkpoint, and ended as a fixed run.
    assert len(starts) >= 2
    last = running_on(S.Job(placement=starts[-1].placement))
    assert last and victim not in last, last
    assert done.final_digest == ref.digest
    assert step_log(cluster.checkpoint_root / job_id / "steps.jsonl") == ref.losses
