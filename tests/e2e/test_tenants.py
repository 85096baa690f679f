"""Tenants live (Rubick's service classes): tenant b's best-effort jobs fill four CPU slots;
tenant a, with a quota of 2, submits a guaranteed job. At the next round it runs on the 2
devices it asks for, b's jobs shrink (checkpoint and restart), and every job ends with the
digest of its fixed run. `gearshift tenants` and `gearshift watch` show it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearshift.client.devcluster import DevCluster
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.e2e.worker_cluster import (
    GAVEL_TIMING,
    client_of,
    digits_spec,
    e2e_cluster,
    reference,
    started,
)

C = common_pb2
S = scheduler_pb2
STEPS = 160  # the guaranteed job
BE_STEPS = 480  # tenant b's jobs: still running when it comes, even on a loaded machine
WAIT = 300.0


@pytest.fixture
def cluster(tmp_path: Path, postgres_db: str, redis_url: str) -> Iterator[DevCluster]:
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text("tenants:\n  a:\n    quota: {cpu: 0}\n  b: {}\n")  # SIGHUP raises it
    profile = {
        "allocate": {"name": "max_min_fairness", "args": GAVEL_TIMING},
        "tenants": {"name": "guarantees", "args": {"file": str(tenants)}},
    }
    # The decision in the child process: the SIGHUP reload reaches it with the next round
    # (in-process tenants: tests/unit/test_sched_tenants.py).
    scheduler = {"profile": profile, "round": {"decisionProcess": True}}
    cluster = e2e_cluster(tmp_path, postgres_db, redis_url, scheduler=scheduler)
    try:
        yield cluster
    finally:
        cluster.stop()


def gearshift(cluster: DevCluster, *args: str) -> str:
    env = os.environ | {"GEARSHIFT_SCHEDULER": cluster.address("scheduler")}
    run = subprocess.run(
        [sys.executable, "-m", "gearshift.client.cli", *args],
        check=False, capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def tenant_row(text: str, tenant: str) -> list[str]:
    """A tenant's row of `gearshift tenants`, split into cells."""
    return next(line.split() for line in text.splitlines() if line.split()[:1] == [tenant])


def reload_quota(cluster: DevCluster, path: Path, timeout: float = 30.0) -> None:
    """Give tenant a 2 devices and SIGHUP the scheduler; wait until it shows them."""
    path.write_text("tenants:\n  a:\n    quota: {cpu: 2}\n  b: {}\n")
    cluster.daemons["scheduler"].process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + timeout
    with client_of(cluster) as client:
        while time.monotonic() < deadline:
            quota = {t.tenant: dict(t.quota) for t in client.cluster().tenants}
            if quota.get("a") == {"cpu": 2}:
                return
            time.sleep(0.1)  # polling a condition, bounded by the deadline
    raise AssertionError(f"the reloaded quota did not show within {timeout} s: {quota}")


def wait_running(cluster: DevCluster, job_ids: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with client_of(cluster) as client:
        while time.monotonic() < deadline:
            jobs = [client.get(j) for j in job_ids]
            if all(j.progress.step > 0 for j in jobs):
                return
            assert not any(j.state == C.JOB_STATE_FAILED for j in jobs), jobs
            time.sleep(0.2)  # polling a condition, bounded by the deadline
    raise AssertionError(f"{job_ids} not all training within {timeout} s" + cluster.log_tails())


@pytest.mark.slow
def test_a_guaranteed_job_gets_its_request_and_best_effort_jobs_shrink(
    cluster: DevCluster, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "gs-ref"
    ref, be_ref = reference(shared, STEPS, ests=2), reference(shared, BE_STEPS, ests=2)
    started(cluster)  # w1 cpu:2, w2 cpu:2
    with client_of(cluster) as client:
        bs = []
        for name in ("b1", "b2"):
            spec = digits_spec(name, BE_STEPS, ests=2)
            spec.tenant = "b"
            bs.append(client.submit(spec).job_id)
        wait_running(cluster, bs, WAIT)
        assert tenant_row(gearshift(cluster, "tenants"), "a")[1] == "-"  # quota 0 at start
        reload_quota(cluster, tmp_path / "tenants.yaml")
        assert sum(len(client.get(b).placement.processes) for b in bs) == 4  # cluster full
        g_spec = digits_spec("g", STEPS, ests=2)
        g_spec.tenant, g_spec.service_class = "a", C.SERVICE_CLASS_GUARANTEED
        submitted = time.time()
        g = client.submit(g_spec).job_id
        first = None
        for event in client.watch(g):
            if event.placement.processes:
                first = event
                break
        assert first is not None
        print(f"guaranteed job placed {first.time - submitted:.1f} s after its submission")
        # the round after the submission: round 1 s, the b job's checkpoint and stop first
        assert first.time - submitted < 60.0, first.time - submitted
        assert len(first.placement.processes) == 2  # what it asked for, not a share
        tenants = gearshift(cluster, "tenants")
        done = {j: client.wait(j, timeout=WAIT) for j in [*bs, g]}
        events = {j: list(client.watch(j)) for j in bs}
    for job_id, job in done.items():
        assert job.state == C.JOB_STATE_SUCCEEDED, job.message + cluster.log_tails()
        assert job.final_digest == (ref if job_id == g else be_ref).digest, job_id
    shrunk = [
        e
        for j in bs
        for e in events[j]
        if e.time >= submitted and e.type in (S.JOB_EVENT_TYPE_RESCALED, S.JOB_EVENT_TYPE_PREEMPTED)
    ]
    assert shrunk, "no best-effort job made room"
    assert tenant_row(tenants, "a")[:3] == ["a", "cpux2", "cpux2"], tenants
    watched = gearshift(cluster, "watch", bs[0]) + gearshift(cluster, "watch", bs[1])
    assert "rescaled" in watched.lower() or "preempted" in watched.lower(), watched
    assert "guaranteed" in gearshift(cluster, "job", g)
