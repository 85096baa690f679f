"""Every daemon served with mTLS and calling the others over it: a job runs end to end.

The worker registers with the scheduler, the scheduler starts the task on the worker and
asks the Brain and the shard manager, and the training processes read their data from the
shard manager and report progress to the scheduler, each call over TLS with a client
certificate (`--tls-ca` for outgoing calls; `--tls-client-ca` makes each server insist).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gearshift.common.auth import ClientTls
from gearshift.common.channel import connect
from gearshift.v1 import brain_pb2, brain_pb2_grpc, common_pb2
from tests.e2e.worker_cluster import Cluster, digits_spec

STEPS = 30


@pytest.fixture
def tls_cluster(
    tmp_path: Path, postgres_db: str, redis_url: str, pki: dict[str, Path]
) -> Iterator[Cluster]:
    flags = {
        "--tls-cert": pki["server_cert"],
        "--tls-key": pki["server_key"],
        "--tls-client-ca": pki["ca"],
        "--tls-ca": pki["ca"],
    }
    cluster = Cluster(
        tmp_path,
        postgres_db,
        redis_url,
        common_args=[str(part) for item in flags.items() for part in item],
        tls=ClientTls(pki["ca"], pki["client_cert"], pki["client_key"]),
    )
    try:
        yield cluster
    finally:
        cluster.close()


def test_a_job_runs_with_mtls_between_every_daemon(tls_cluster: Cluster) -> None:
    cluster = tls_cluster.start(workers=[("w1", "cpu:2")])
    with cluster.client() as client:
        job = client.submit(digits_spec("tls", STEPS, ests=2))
        done = client.wait(job.job_id, timeout=180)
    assert done.state == common_pb2.JOB_STATE_SUCCEEDED, f"{done.message}\n{cluster.logs()}"
    assert done.progress.step == STEPS
    assert done.final_digest
    # Rank 0's runtime samples reached the Brain over mTLS too.
    assert cluster.brain is not None
    with connect(cluster.brain.address, tls=cluster.tls) as channel:
        brain = brain_pb2_grpc.BrainStub(channel)
        history = brain.GetJobHistory(brain_pb2.GetJobHistoryRequest(job_id=job.job_id))
    assert history.samples and history.samples[-1].step > 0
