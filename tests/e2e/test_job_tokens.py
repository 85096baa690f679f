"""A cluster with identities (--tokens-file) runs a dynamic-mode job end to end on tokens
scoped to it: the scheduler mints the job's token, the worker hands it to the training
processes, and with it they create and read their dataset, report progress and samples -
none of which the worker's own token may do any more."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gearshift.common.channel import connect
from gearshift.common.identity import create_job_key, create_token
from gearshift.v1 import (
    brain_pb2,
    brain_pb2_grpc,
    common_pb2,
    shardmanager_pb2,
    shardmanager_pb2_grpc,
)
from tests.e2e.worker_cluster import Cluster, digits_spec

C = common_pb2
STEPS = 30


@pytest.fixture
def guarded(tmp_path: Path, postgres_db: str, redis_url: str) -> Iterator[tuple[Cluster, str]]:
    tokens, key = tmp_path / "tokens", tmp_path / "job.key"
    create_job_key(key)
    service = create_token(tokens, "service")
    workers = {"w1": create_token(tokens, "worker:w1")}
    cluster = Cluster(
        tmp_path,
        postgres_db,
        redis_url,
        service_args=["--tokens-file", str(tokens), "--job-key-file", str(key), "--token", service],
        worker_args=lambda worker_id: ["--tokens-file", str(tokens), "--token", workers[worker_id]],
        token=create_token(tokens, "tenant:alice"),
    )
    try:
        yield cluster, workers["w1"]
    finally:
        cluster.close()


def test_a_dynamic_job_runs_on_its_own_token(guarded: tuple[Cluster, str]) -> None:
    cluster, worker_token = guarded
    cluster.start(workers=[("w1", "cpu:2")])
    spec = digits_spec("scoped", STEPS, ests=2)
    spec.dataset.mode = C.DATA_MODE_DYNAMIC
    with cluster.client() as client:
        job = client.submit(spec)
        done = client.wait(job.job_id, timeout=180)
    assert done.state == C.JOB_STATE_SUCCEEDED, f"{done.message}\n{cluster.logs()}"
    assert done.progress.step == STEPS and done.spec.tenant == "alice"
    assert cluster.brain is not None and cluster.shards is not None
    for daemon in cluster.processes:  # not one call of the job's was refused
        assert "PERMISSION_DENIED" not in daemon.log_path.read_text(), daemon.log_tail(40)
    service = cluster.service_args[-1]
    with connect(cluster.brain.address, token=service) as channel:
        history = brain_pb2_grpc.BrainStub(channel).GetJobHistory(
            brain_pb2.GetJobHistoryRequest(job_id=job.job_id)
        )
    assert history.samples and history.samples[-1].step > 0  # reported on the job's token
    with connect(cluster.shards.address, token=worker_token) as channel:
        shards = shardmanager_pb2_grpc.ShardManagerStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            shards.DescribeDataset(shardmanager_pb2.DescribeDatasetRequest(dataset_id=job.job_id))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "worker:w1 may not call" in (info.value.details() or "")
