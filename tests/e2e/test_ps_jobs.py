"""A parameter-server job run by the scheduler and sized by the Brain (DLRover's sample ->
optimize), the whole cluster as processes: Brain on PostgreSQL, shard manager on Redis, one
worker daemon (one CPU slot of 2 cores: the PS job's C_total = C_max = 2), the PS launcher
and its PS and worker processes.

The job's spec fixes its first counts (2 PS x 2 workers). The mechanism that rescales it is
DLRover's own: once the task has measured ŵ and ŝ under those counts, the scheduler asks the
Brain's OPTIMIZE stage, whose Eq. 10-11 plan for the 2-core budget differs (fewer PS: a PS
gets s = min(16, C_max) cores), and applies it by stop (checkpoint) -> restart with the new
counts, the embedding rows re-partitioned from the checkpoint. The job then adjusts every
plan interval and ends SUCCEEDED; the PLAN events show each plan, the plan the job runs with
is Eq. 10-11 for the measured ŵ and ŝ in the event (DLRover Table 1's formula, live), every
shard of every finished epoch was consumed, and no acknowledged update was lost.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from gearshift.brain.dlrover import optimize_counts
from gearshift.client import render
from gearshift.client.devcluster import DevCluster
from gearshift.client.sdk import Client
from gearshift.common.channel import connect
from gearshift.common.errors import NotFoundError
from gearshift.v1 import brain_pb2, brain_pb2_grpc, common_pb2, scheduler_pb2, shardmanager_pb2
from gearshift.worker.ps import checkpoint as ckpt
from gearshift.worker.shard_client import ShardClient
from tests.e2e.worker_cluster import client_of, e2e_cluster, started, worker_tasks
from tests.helpers import wait_until

C = common_pb2
S = scheduler_pb2
TOTAL = 4000  # global batches of 128 samples: ~30 s on 2 shared cores
TRAIN_BLOCKS = 400  # 51,200 training samples: 10 epochs in the job
WAIT = 120.0
EVAL_BLOCKS = 40


@pytest.fixture
def cluster(tmp_path: Path, postgres_db: str, redis_url: str) -> Iterator[DevCluster]:
    flags = {"workers": ["--cpu-cores", "2"]}
    plans = {"profile": {"plans": {"args": {"intervalSeconds": 3}}}}
    cluster = e2e_cluster(
        tmp_path, postgres_db, redis_url, workers=(("w1", "cpu:1"),), flags=flags, scheduler=plans
    )
    try:
        yield started(cluster)
    finally:
        cluster.stop()


def ps_spec() -> C.JobSpec:
    return C.JobSpec(
        name="wide-deep",
        total_steps=TOTAL,
        parameter_server=C.ParameterServerSpec(
            ps=2, workers=2, max_ps=4, max_workers=4, seed=11, fields=4, vocab=2000,
            batch=128, train_blocks=TRAIN_BLOCKS, eval_blocks=20,
        ),
    )  # fmt: skip


def plan_events(cluster: DevCluster, job_id: str) -> list[str]:
    with client_of(cluster) as client:
        return [e.message for e in client.events(job_id) if e.type == S.JOB_EVENT_TYPE_PLAN]


def epochs(cluster: DevCluster, job_id: str) -> shardmanager_pb2.Dataset | None:
    """The job's shard-manager dataset (None before it exists or once the job's end
    deleted it)."""
    try:
        with ShardClient(cluster.address("shardmanager")) as client:
            return client.describe(job_id)
    except NotFoundError:
        return None


def moved(client: Client, job_id: str, step: int) -> bool:
    job = client.get(job_id)
    return job.progress.step > step or job.state == C.JOB_STATE_SUCCEEDED


@pytest.mark.slow
def test_a_ps_job_starts_on_its_plan_is_optimized_while_running_and_succeeds(
    cluster: DevCluster,
) -> None:
    with client_of(cluster) as client:
        job_id = client.submit(ps_spec()).job_id

    # It starts with the spec's counts, the Brain's sampling cores.
    first = wait_until(lambda: plan_events(cluster, job_id), WAIT, "no PLAN event")
    assert first[0].startswith("initial plan from spec: 2 PS"), first
    assert "x 2 workers" in first[0] and "not bitwise reproducible" in first[0]

    # DLRover's optimize stage from the measured ŵ, ŝ: a new plan, applied by a restart.
    optimized = wait_until(
        lambda: [m for m in plan_events(cluster, job_id) if m.startswith("optimize")],
        WAIT,
        "no optimize plan was applied",
    )[0]
    with client_of(cluster) as client:  # `gearshift job JOB` shows it while it runs
        running = wait_until(
            lambda: (j := client.get(job_id)).resource_plan.startswith("optimize") and j,
            WAIT,
            "the optimized plan never ran",
        )
        assert running
        details = render.job_details(running)
    assert f"resources   {running.resource_plan}" in details.splitlines()
    assert "asynchronous, not bitwise reproducible" in details
    snapshots: list[shardmanager_pb2.Dataset] = []
    with client_of(cluster) as client:
        # Until it ends: the dataset's counts as it goes (the job's end deletes them).
        while client.get(job_id).state != C.JOB_STATE_SUCCEEDED:
            if (seen := epochs(cluster, job_id)) is not None:
                snapshots.append(seen)
            job = client.get(job_id)
            assert job.state not in (C.JOB_STATE_FAILED, C.JOB_STATE_CANCELLED), job
            wait_until(partial(moved, client, job_id, job.progress.step), WAIT, "stuck")
        job = client.get(job_id)
        events = list(client.events(job_id))
        kinds = [e.type for e in events]
    assert job.progress.step == TOTAL
    assert S.JOB_EVENT_TYPE_RESCALING in kinds and S.JOB_EVENT_TYPE_RESCALED in kinds
    assert S.JOB_EVENT_TYPE_STARTED_FRESH not in kinds  # the restart resumed its checkpoint

    # The plan it ran with is Eq. 10-11 for the ŵ, ŝ it measured (C_total = 2, s = 2).
    found = re.search(r"ŵ=([\d.e-]+), ŝ=([\d.e-]+), C_total=([\d.]+)", optimized)
    assert found is not None, optimized
    w_hat, s_hat, total = (float(g) for g in found.groups())
    workers, _, n_ps = optimize_counts(w_hat, s_hat, total, min(16.0, total))
    counts = re.search(r"(\d+) PS \(.*\) x (\d+) workers", optimized)
    assert counts is not None
    assert (int(counts.group(1)), int(counts.group(2))) == (n_ps, min(workers, 4)), optimized
    assert (n_ps, min(workers, 4)) != (2, 2)  # a change, not the spec's counts again
    aucs = [e.message for e in events if e.message.startswith("held-out AUC")]  # each phase's
    last_phase = f"at step {TOTAL} ({n_ps} PS x {min(workers, 4)} workers)"
    assert len(aucs) >= 2 and aucs[-1].endswith(last_phase), aucs
    print("\n".join(f"{S.JobEventType.Name(e.type)}: {e.message[:300]}" for e in events))

    # The Brain holds every plan it issued: initial, optimize, then adjust every interval.
    with connect(cluster.address("brain")) as channel:
        history = brain_pb2_grpc.BrainStub(channel).GetJobHistory(
            brain_pb2.GetJobHistoryRequest(job_id=job_id, max_samples=1)
        )
    stages = [p.plan.stage for p in history.plans]
    assert stages[:2] == [brain_pb2.PLAN_STAGE_INITIAL, brain_pb2.PLAN_STAGE_OPTIMIZE], stages
    assert brain_pb2.PLAN_STAGE_ADJUST in stages[2:], stages

    # No acknowledged update lost; every batch trained; every shard of a finished epoch read.
    checkpoint = Path(next(t.checkpoint_path for t in worker_tasks(cluster, "w1")))
    manifest = ckpt.read_manifest(checkpoint)
    assert manifest is not None and manifest.next_batch == TOTAL
    assert manifest.updates_acked == manifest.updates_applied
    assert manifest.num_ps == n_ps
    assert snapshots, "the job's dataset was never seen"
    last = snapshots[-1]
    finished = [e for e in last.epochs if e.epoch < last.epoch]
    assert finished and all(e.shards_done >= TRAIN_BLOCKS for e in finished), last

    # Its held-out AUC (the comparison with a fixed plan in the same wall time is
    # tests/integration/test_ps_auc.py's, where read-bound workers make it hold run to run).
    elastic = ckpt.evaluate(checkpoint, EVAL_BLOCKS)
    print(f"held-out AUC: {elastic:.4f} ({TOTAL} batches)")
    assert elastic > 0.5
