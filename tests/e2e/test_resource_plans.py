"""DLRover's resource plans applied to live jobs, the whole cluster as processes (Brain on
PostgreSQL, shard manager on Redis, worker daemons, real training processes).

Three jobs of one model type that sleep in their forward pass (they use a small part of
the 2 cores their worker's share gives each process) start on the defaults (no history:
2 cores and 1 shared loader process per process), are shrunk by the Brain's adjust stage
to 1 core without loader processes and restarted on it through the checkpoint path, and
complete. A fourth job of that type then starts with the plan their history implies: 1
core, the memory they were measured to use, no loader process - seen on its training
process (CPU affinity, loader processes as its children), on its worker's enforcement, as
PLAN events and on the `resources` line of `gearshift job`; the Brain holds every plan
with the jobs' histories.

A history cap is only a guess: a 3-EST job that history starts on 1 device grows onto the
2 idle devices at the next round while nothing waits, though no ADJUST ever comes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from gearshift.client import render
from gearshift.client.devcluster import DevCluster
from gearshift.client.sdk import Client
from gearshift.common.channel import connect
from gearshift.v1 import brain_pb2, brain_pb2_grpc, common_pb2, scheduler_pb2
from gearshift.worker.runtime.writer import WRITER_NAME
from tests.e2e.worker_cluster import (
    client_of,
    e2e_cluster,
    started,
    training_processes,
    worker_tasks,
)
from tests.helpers import repo_on_pythonpath, wait_until

C = common_pb2
S = scheduler_pb2
WORKERS = (("w1", "cpu:1"), ("w2", "cpu:1"), ("w3", "cpu:1"))
STEPS = 300  # at about 8 steps/s (0.1 s asleep each): long enough for a restart to pay
WAIT = 240.0


def plan_cluster(
    tmp_path: Path,
    postgres_db: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    plan_interval: str,
) -> Iterator[DevCluster]:
    # The training processes import tests.e2e.plan_jobs.
    monkeypatch.setenv("PYTHONPATH", repo_on_pythonpath())
    flags = {"workers": ["--cpu-cores", "2"]}
    interval = float(plan_interval)
    plans = {"profile": {"plans": {"name": "dlrover", "args": {"intervalSeconds": interval}}}}
    cluster = e2e_cluster(
        tmp_path, postgres_db, redis_url, workers=WORKERS, flags=flags, scheduler=plans
    )
    try:
        yield started(cluster)
    finally:
        cluster.stop()


@pytest.fixture
def cluster(
    tmp_path: Path, postgres_db: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[DevCluster]:
    yield from plan_cluster(tmp_path, postgres_db, redis_url, monkeypatch, "3")


@pytest.fixture
def unadjusted(
    tmp_path: Path, postgres_db: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[DevCluster]:
    """A cluster whose scheduler asks only initial plans (--plan-interval 0): no ADJUST."""
    yield from plan_cluster(tmp_path, postgres_db, redis_url, monkeypatch, "0")


def sleepy_spec(name: str, steps: int = STEPS, ests: int = 1) -> C.JobSpec:
    return C.JobSpec(
        name=name,
        entrypoint=C.Entrypoint(
            module="tests.e2e.plan_jobs", config_json='{"samples": 512, "sleep": 0.1}'
        ),
        model_type="sleepy-mlp",
        num_ests=ests,
        global_batch_size=8 * ests,
        total_steps=steps,
        dataset=C.DatasetSpec(name="sleepy", size=512, shard_size=16, seed=3),
        elastic=C.ElasticBounds(min_devices=1, max_devices=ests),
        checkpoint_every_steps=20,
    )


def plan_events(cluster: DevCluster, job_id: str) -> list[str]:
    with client_of(cluster) as client:
        return [e.message for e in client.events(job_id) if e.type == S.JOB_EVENT_TYPE_PLAN]


def running_process(cluster: DevCluster, job_id: str) -> tuple[int, str]:
    """(pid, worker) of the job's one training process once it runs."""

    def find() -> tuple[int, str] | None:
        with client_of(cluster) as client:
            job = client.get(job_id)
        if job.state != C.JOB_STATE_RUNNING or not job.placement.processes:
            return None
        worker = job.placement.processes[0].worker_id
        pids = training_processes(cluster, worker)
        return (pids[0], worker) if len(pids) == 1 else None

    found = wait_until(find, WAIT, f"{job_id} never ran")
    assert found is not None
    return found


def children(pid: int) -> int:
    """Loader processes: child processes of every thread of `pid` but its checkpoint writer
    (a thread or a child that ends while it is read counts none)."""
    count = 0
    for thread in os.listdir(f"/proc/{pid}/task"):
        try:
            kids = Path(f"/proc/{pid}/task/{thread}/children").read_text().split()
            count += sum(
                Path(f"/proc/{kid}/comm").read_text().strip() != WRITER_NAME for kid in kids
            )
        except FileNotFoundError:
            continue
    return count


def adjusted(cluster: DevCluster, job_id: str) -> list[str]:
    return [m for m in plan_events(cluster, job_id) if m.startswith("adjust")]


def succeeded(client: Client, job_id: str) -> bool:
    return client.get(job_id).state == C.JOB_STATE_SUCCEEDED


def brain_knows_it_succeeded(cluster: DevCluster, job_id: str) -> bool:
    return brain_history(cluster, job_id).job.status == "succeeded"


def brain_history(cluster: DevCluster, job_id: str) -> brain_pb2.JobHistory:
    with connect(cluster.address("brain")) as channel:
        stub = brain_pb2_grpc.BrainStub(channel)
        return stub.GetJobHistory(brain_pb2.GetJobHistoryRequest(job_id=job_id, max_samples=1))


def test_history_sets_a_new_jobs_plan_and_idle_cpu_is_shrunk(cluster: DevCluster) -> None:
    with client_of(cluster) as client:
        past = [client.submit(sleepy_spec(f"sleepy-{i}")).job_id for i in range(3)]

    # With no history the first placement gets the defaults: 2 cores, 1 loader proc.
    pid, worker = running_process(cluster, past[0])
    first = plan_events(cluster, past[0])
    assert first and first[0].startswith("initial plan from defaults: 2 cores"), first
    assert "no similar job in history" in first[0]
    assert len(os.sched_getaffinity(pid)) == 2
    loaders = wait_until(lambda: children(pid), 60.0, "no loader process started")
    assert loaders == 1  # the shared loader pool of --loader-procs 1
    tasks = [t for t in worker_tasks(cluster, worker) if t.job_id == past[0]]
    assert "affinity cores 0-1" in tasks[0].enforcement

    # The adjust stage sees each job use a fraction of its 2 cores: 1 core, no loader.
    for job_id in past:
        shrunk = wait_until(partial(adjusted, cluster, job_id), WAIT, f"{job_id} was never shrunk")
        assert shrunk[0].startswith("adjust plan from optimizer: 1 core, "), shrunk
        assert "0 loader procs per process" in shrunk[0]
        assert "cores 2 -> 1" in shrunk[0] and "core-s as is" in shrunk[0]

    with client_of(cluster) as client:
        for job_id in past:
            wait_until(partial(succeeded, client, job_id), WAIT, f"{job_id} never completed")
            kinds = [e.type for e in client.events(job_id)]
            assert S.JOB_EVENT_TYPE_RESCALING in kinds and S.JOB_EVENT_TYPE_RESCALED in kinds
    for job_id in past:  # the scheduler tells the Brain in the background
        wait_until(
            partial(brain_knows_it_succeeded, cluster, job_id),
            30.0,
            f"the Brain never saw {job_id} succeed",
        )
        stages = [p.plan.stage for p in brain_history(cluster, job_id).plans]
        assert stages[0] == brain_pb2.PLAN_STAGE_INITIAL
        assert brain_pb2.PLAN_STAGE_ADJUST in stages

    # A fourth job of the type starts with what the history implies, not the defaults
    # (the devices too: the Brain reads them from the past jobs' samples).
    with client_of(cluster) as client:
        fourth = client.submit(sleepy_spec("sleepy-4", steps=2000)).job_id
    pid, worker = running_process(cluster, fourth)
    events = plan_events(cluster, fourth)
    assert events[0].startswith("initial plan from history: 1 core, "), events
    assert "0 loader procs per process; starting on at most 1 device(s) " in events[0]
    match = "from 3 similar finished job(s) (model type 'sleepy-mlp', dataset 'sleepy')"
    assert match in events[0]
    with client_of(cluster) as client:  # `gearshift job JOB` shows it
        details = render.job_details(client.get(fourth))
    assert f"resources   {events[0]}" in details.splitlines()
    # The process pins itself once its imports are done: its pid file comes before that.
    wait_until(
        lambda: len(os.sched_getaffinity(pid)) == 1,
        60.0,
        f"the fourth job's process {pid} never pinned itself to 1 core",
    )
    with client_of(cluster) as client:  # training: its loader pool would be up by now
        wait_until(lambda: client.get(fourth).progress.step > 5, WAIT, "the fourth job is stuck")
    assert children(pid) == 0
    plan = brain_history(cluster, fourth).plans[0].plan
    assert plan.source == brain_pb2.PLAN_SOURCE_HISTORY
    memory = plan.workers.memory_bytes
    assert 0 < memory < 2 * 1024**3  # measured use with headroom, not the worker's share
    tasks = [t for t in worker_tasks(cluster, worker) if t.job_id == fourth]
    assert "affinity cores" in tasks[0].enforcement
    assert f"RSS watchdog {memory / 1024**2:.1f} MiB per process" in tasks[0].enforcement
    assert f"{memory / 1024**2:.0f} MiB" in events[0]
    with client_of(cluster) as client:
        client.cancel(fourth)


def processes(client: Client, job_id: str) -> int:
    return len(client.get(job_id).placement.processes)


def test_a_job_capped_by_history_grows_onto_idle_devices(unadjusted: DevCluster) -> None:
    """A finished 1-device job of the type caps a new 3-EST job's start to 1 device; with
    2 devices idle and nothing waiting, the next round grows it to 3 (no ADJUST here)."""
    cluster = unadjusted
    with client_of(cluster) as client:
        past = client.submit(sleepy_spec("sleepy-past", steps=20)).job_id
        wait_until(partial(succeeded, client, past), WAIT, f"{past} never completed")
    wait_until(partial(brain_knows_it_succeeded, cluster, past), 30.0, "the Brain never saw it")

    with client_of(cluster) as client:
        job = client.submit(sleepy_spec("sleepy-wide", steps=5000, ests=3)).job_id
        wait_until(lambda: processes(client, job) == 3, WAIT, f"{job} never grew to 3 devices")
        events = plan_events(cluster, job)
        assert events[0].startswith("initial plan from history: "), events
        assert "starting on at most 1 device(s) (from 1 similar finished job(s)" in events[0]
        kinds = [e.type for e in client.events(job)]
        assert S.JOB_EVENT_TYPE_RESCALED in kinds  # it started on 1, then grew
        client.cancel(job)
