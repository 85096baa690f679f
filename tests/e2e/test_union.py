"""The default profile at work on a dev cluster (`gearshift up` with no scheduler file): the
union of the papers, not one seed behind its switch.

One cluster (two workers of one CPU slot each), 1 s rounds as a dev cluster runs them, the
scheduler's defaults except the tenants' quota file (a tenants plugin needs its quotas) and
DeepPool's minIdle at 0 (any placed job lends a device: the idle share of a plan over layer
timings measured on a busy host differs from run to run).
The jobs are the sleepy model (tests/e2e/plan_jobs.py: each EST's step sleeps 0.1 s), so
that a second device doubles a job's measured throughput however busy the host is, and
the elastic objective, which weighs measured throughputs, finds growing worth it:
- an elastic job starts on both devices, shrinks when a second job arrives (the elastic
  LAS objective shares the cluster) and grows back when it ends (at the next
  recomputation of the allocation, 30 s apart), then ends with the digest of its fixed
  run on 2 processes. The second job comes once the first has run 30 s, when a
  recomputation is due: it runs in the background on the first job's device only until
  the objective gives it a device (a round or two), not until it ends;
- a second run of the same model starts on its history plan (DLRover's plan from similar
  finished jobs);
- on a full cluster, a one-device best-effort job runs at once in the background on a
  running job's idle device (DeepPool's collocation: the objective's allocation stands
  until its next recomputation, 30 s later), and a guaranteed job of a tenant with quota
  is placed before a best-effort job submitted first (of two ESTs, so that it cannot run
  in the background).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from gearshift.client.devcluster import ClusterConfig, DevCluster
from gearshift.client.sdk import Client
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.e2e.test_resource_plans import brain_knows_it_succeeded, sleepy_spec
from tests.e2e.worker_cluster import (
    READY_TIMEOUT,
    client_of,
    reference,
    rendezvous_base,
)
from tests.helpers import repo_on_pythonpath, wait_until

pytestmark = pytest.mark.slow

C = common_pb2
S = scheduler_pb2
STEPS = 600  # the elastic job (60-90 s): running still 30 s after it shrank
SHORT = 40  # the job that makes it shrink: done within its 10 s placement (4 s of steps)
WAIT = 400.0


@pytest.fixture
def cluster(
    tmp_path: Path, postgres_db: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[DevCluster]:
    # The training processes (and the reference run) import tests.e2e.plan_jobs.
    monkeypatch.setenv("PYTHONPATH", repo_on_pythonpath())
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text("tenants:\n  a:\n    quota: {cpu: 1}\n  b: {}\n")
    config = ClusterConfig(
        run_dir=tmp_path / "cluster",
        base_port=0,
        workers=[("w1", "cpu:1"), ("w2", "cpu:1")],
        postgres_url=postgres_db,
        redis_url=redis_url,
        round_seconds=1.0,
        heartbeat_interval=0.5,
        heartbeat_timeout=5.0,
        report_interval=0.5,
        metrics=False,
        # The profile's plugins, with the tenants' quotas and DeepPool's minIdle at 0 (see the
        # module docstring); this test's own rendezvous ports.
        scheduler={
            "profile": {
                "collocate": {"args": {"minIdle": 0}},
                "tenants": {"args": {"file": str(tenants)}},
            },
            "cluster": {"rendezvousPortBase": rendezvous_base()},
        },
    )
    cluster = DevCluster(config)
    cluster.start(READY_TIMEOUT)
    try:
        yield cluster
    finally:
        cluster.stop()


def device_counts(client: Client, job_id: str) -> list[int]:
    """The job's device count at each change of placement, in order."""
    counts: list[int] = []
    for event in client.watch(job_id):
        if event.type in (S.JOB_EVENT_TYPE_STARTED, S.JOB_EVENT_TYPE_RESCALED):
            count = sum(len(p.est_ids) > 0 for p in event.placement.processes)
            if not counts or counts[-1] != count:
                counts.append(count)
    return counts


def first_placed(client: Client, job_id: str) -> float:
    for event in client.watch(job_id):
        if event.placement.processes:
            return event.time
    raise AssertionError(f"{job_id} was never placed")


def test_the_default_profile_is_the_union(
    cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "gs-ref"
    ref = reference(shared, STEPS, ests=2, spec=sleepy_spec("reference", STEPS, ests=2))
    with client_of(cluster) as client:
        state = client.cluster()
        assert state.policy == "las (elastic)", state.policy  # the default objective
        # An elastic job shrinks for a newcomer and grows back when it leaves.
        a = client.submit(sleepy_spec("a", STEPS, ests=2)).job_id
        for event in client.watch(a):
            if len(event.placement.processes) == 2:
                break
        # 300 steps of 0.1 s each: 30 s on two devices at least, so a recomputation is due.
        wait_until(lambda: client.get(a).progress.step >= STEPS // 2, WAIT, f"{a} ran 30 s")
        b = client.submit(sleepy_spec("b", SHORT, ests=1)).job_id
        assert client.wait(b, timeout=WAIT).state == C.JOB_STATE_SUCCEEDED
        done = client.wait(a, timeout=WAIT)
        assert done.state == C.JOB_STATE_SUCCEEDED, done.message + cluster.log_tails()
        assert done.final_digest == ref.digest  # the bits of 2 fixed processes
        assert device_counts(client, a) == [2, 1, 2]

        # The same model again: its first plan comes from the history of the two that ended.
        for job_id in (a, b):
            wait_until(partial(brain_knows_it_succeeded, cluster, job_id), 30.0, job_id)
        c = client.submit(sleepy_spec("c", SHORT * 4, ests=2)).job_id

        def plans() -> list[str]:
            return [e.message for e in client.events(c) if e.type == S.JOB_EVENT_TYPE_PLAN]

        wait_until(lambda: bool(plans()), WAIT, f"{c} got no plan")
        assert plans()[0].startswith("initial plan from history: "), plans()
        assert "similar finished job" in plans()[0], plans()

        # A full cluster: a one-device best-effort job runs in the background on an idle
        # device of a running job's (DeepPool's collocation) ...
        for event in client.watch(c):
            if sum(len(p.est_ids) > 0 for p in event.placement.processes) == 2:
                break
        e = client.submit(sleepy_spec("e", SHORT, ests=1)).job_id
        first = next(ev for ev in client.watch(e) if ev.type == S.JOB_EVENT_TYPE_STARTED)
        assert f"in the background on {c}'s device" in first.message, first.message
        # ... and a guaranteed job of a tenant with quota is placed before a best-effort job
        # submitted first.
        x_spec = sleepy_spec("x", SHORT, ests=2)
        x_spec.tenant = "b"
        x = client.submit(x_spec).job_id
        g_spec = sleepy_spec("g", SHORT, ests=1)
        g_spec.tenant, g_spec.service_class = "a", C.SERVICE_CLASS_GUARANTEED
        g = client.submit(g_spec).job_id
        placed_g = first_placed(client, g)
        placed_x = first_placed(client, x)
        assert placed_g <= placed_x, (placed_g, placed_x)
        for job_id in (c, e, x, g):
            job = client.wait(job_id, timeout=WAIT)
            assert job.state == C.JOB_STATE_SUCCEEDED, job.message + cluster.log_tails()
