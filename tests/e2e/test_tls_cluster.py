"""Every daemon served with mTLS and calling the others over it: a job runs end to end.

The worker registers with the scheduler, the scheduler starts the task on the worker and
asks the Brain and the shard manager, and the training processes read their data from the
shard manager and report samples to the Brain, each call over TLS with a client
certificate (`--tls-ca` for outgoing calls; `--tls-client-ca` makes each server insist).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearshift.client.devcluster import ClusterTls, DevCluster
from gearshift.common.auth import ClientTls
from gearshift.common.channel import connect
from gearshift.v1 import brain_pb2, brain_pb2_grpc, common_pb2
from tests.e2e.worker_cluster import client_of, digits_spec, e2e_cluster, started

STEPS = 30


@pytest.fixture
def tls_cluster(
    tmp_path: Path, postgres_db: str, redis_url: str, pki: dict[str, Path]
) -> Iterator[DevCluster]:
    tls = ClusterTls(pki["server_cert"], pki["server_key"], pki["ca"], client_ca=pki["ca"])
    cluster = e2e_cluster(tmp_path, postgres_db, redis_url, workers=[("w1", "cpu:2")], tls=tls)
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_job_runs_with_mtls_between_every_daemon(
    tls_cluster: DevCluster, pki: dict[str, Path]
) -> None:
    cluster = started(tls_cluster)
    with client_of(cluster) as client:
        job = client.submit(digits_spec("tls", STEPS, ests=2))
        done = client.wait(job.job_id, timeout=180)
    assert done.state == common_pb2.JOB_STATE_SUCCEEDED, f"{done.message}\n{cluster.log_tails()}"
    assert done.progress.step == STEPS
    assert done.final_digest
    # Rank 0's runtime samples reached the Brain over mTLS too.
    user = ClientTls(pki["ca"], pki["client_cert"], pki["client_key"])
    with connect(cluster.address("brain"), tls=user) as channel:
        brain = brain_pb2_grpc.BrainStub(channel)
        history = brain.GetJobHistory(brain_pb2.GetJobHistoryRequest(job_id=job.job_id))
    assert history.samples and history.samples[-1].step > 0
    # The command line reaches it with the user's certificate, and not without one.
    address = ["--address", cluster.address("scheduler")]
    mtls = ["--tls-ca", str(pki["ca"]), "--tls-cert", str(pki["client_cert"]),
            "--tls-key", str(pki["client_key"])]  # fmt: skip
    listed = gearshift("jobs", *address, *mtls, "--json")
    assert listed.returncode == 0 and job.job_id in listed.stdout, listed.stderr
    plain = gearshift("jobs", *address, "--rpc-timeout", "5")
    assert plain.returncode == 4, plain.stdout + plain.stderr  # unreachable


def gearshift(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEARSHIFT_TLS_")}
    return subprocess.run(
        [sys.executable, "-m", "gearshift.client.cli", *args],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
