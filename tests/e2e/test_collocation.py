"""Jobs sharing devices on a real cluster of processes (issue 20, points 4 and 5).

- Gavel's space sharing live: under `las_packed` two one-device jobs on a worker with one
  device are paired on it, both run, and each ends with its fixed run's digest.
- DeepPool's multiplexing live: a foreground job whose layer profile (stored by `gearshift
  profile`) leaves its devices idle lends one to a waiting best-effort job; the worker runs it
  in the background, pauses it when the foreground's step time crosses the bound (its events
  say so), and each job ends with its own fixed run's digest.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearshift.client.devcluster import DevCluster
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.e2e.worker_cluster import client_of, digits_spec, e2e_cluster, reference, started

C = common_pb2
S = scheduler_pb2
WAIT = 300.0


def shared_dir(factory: pytest.TempPathFactory) -> Path:
    base = factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "gs-ref"


def events(cluster: DevCluster, job_id: str) -> list[S.JobEvent]:
    with client_of(cluster) as client:
        return list(client.watch(job_id))


@pytest.fixture
def packed(tmp_path: Path, postgres_db: str, redis_url: str) -> Iterator[DevCluster]:
    cluster = e2e_cluster(
        tmp_path,
        postgres_db,
        redis_url,
        workers=[("w1", "cpu:1")],
        # Gavel's space sharing is rigid, and pairs jobs itself (no collocate stage).
        scheduler={"profile": {"allocate": {"name": "las_packed", "args": {"elastic": False}}}},
    )
    try:
        yield started(cluster)
    finally:
        cluster.stop()


@pytest.mark.slow
def test_las_packed_runs_a_pair_on_one_device_and_both_keep_their_bits(
    packed: DevCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    steps = 60
    ref = reference(shared_dir(tmp_path_factory), steps, ests=1)
    with client_of(packed) as client:
        ids = [client.submit(digits_spec(name, steps, ests=1)).job_id for name in ("a", "b")]
        jobs = [client.wait(job_id, timeout=WAIT) for job_id in ids]
    for job in jobs:
        assert job.state == C.JOB_STATE_SUCCEEDED, job.message + packed.log_tails()
        assert job.final_digest == ref.digest, job.job_id
    a, b = ids
    shared = [e.message for e in events(packed, a) if e.type == S.JOB_EVENT_TYPE_STARTED]
    assert any(f"sharing its devices with {b}" in m for m in shared), shared


FG_STEPS, BG_STEPS = 1500, 300


@pytest.fixture
def multiplexed(tmp_path: Path, postgres_db: str, redis_url: str) -> Iterator[DevCluster]:
    cluster = e2e_cluster(
        tmp_path,
        postgres_db,
        redis_url,
        workers=[("w1", "cpu:2")],
        scheduler={
            "profile": {
                "allocate": {"name": "fifo_strict"},
                "collocate": {
                    "name": "deeppool",
                    "args": {
                        "maxForegroundSlowdown": 0.0001,  # any slowdown pauses it
                        # Any plan lends: layer timings taken on a loaded machine may show
                        # no idle time (the threshold itself is unit-tested).
                        "minIdle": 0,
                    },
                },
            }
        },
    )
    try:
        yield started(cluster)
    finally:
        cluster.stop()


@pytest.mark.slow
def test_a_background_job_runs_on_a_lent_device_is_paused_and_both_keep_their_bits(
    multiplexed: DevCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """No profile is stored first: the foreground's rank 0 measures it before its first step
    (profile_first), the next round finds it in the Brain and lends the device."""
    fg_ref = reference(shared_dir(tmp_path_factory), FG_STEPS, ests=2)
    bg_ref = reference(shared_dir(tmp_path_factory), BG_STEPS, ests=1)
    with client_of(multiplexed) as client:
        fg_id = client.submit(digits_spec("fg", FG_STEPS, ests=2, min_devices=2)).job_id
        bg_id = client.submit(digits_spec("bg", BG_STEPS, ests=1)).job_id
        fg, bg = (client.wait(job_id, timeout=WAIT) for job_id in (fg_id, bg_id))
    for job, ref in ((fg, fg_ref), (bg, bg_ref)):
        assert job.state == C.JOB_STATE_SUCCEEDED, job.message + multiplexed.log_tails()
        assert job.final_digest == ref.digest, job.job_id
    bg_events = events(multiplexed, bg_id)
    lent = [e for e in bg_events if "in the background on" in e.message]
    assert lent and fg_id in lent[0].message, [e.message for e in bg_events]
    paused = [e for e in bg_events if e.type == S.JOB_EVENT_TYPE_PAUSED]
    assert paused and "foreground" in paused[0].message, [e.message for e in bg_events]
