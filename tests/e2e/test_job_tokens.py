"""A cluster with identities (--tokens-file) runs a dynamic-mode job end to end on tokens
scoped to it: the scheduler mints the job's token, the worker hands it to the training
processes, and with it they create and read their dataset, report samples -
none of which the worker's own token may do any more."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from gearshift.client.devcluster import DevCluster
from gearshift.common.channel import connect
from gearshift.common.identity import create_job_key, create_token
from gearshift.v1 import (
    brain_pb2,
    brain_pb2_grpc,
    common_pb2,
    shardmanager_pb2,
    shardmanager_pb2_grpc,
)
from tests.e2e.worker_cluster import client_of, digits_spec, e2e_cluster, started

C = common_pb2
STEPS = 30


@dataclass
class Guarded:
    """A cluster with identities, and the tokens of its parts."""

    cluster: DevCluster
    service: str
    worker: str  # w1's
    tenant: str  # alice's


@pytest.fixture
def guarded(tmp_path: Path, postgres_db: str, redis_url: str) -> Iterator[Guarded]:
    tokens, key = tmp_path / "tokens", tmp_path / "job.key"
    create_job_key(key)
    service = create_token(tokens, "service")
    worker = create_token(tokens, "worker:w1")
    identities = ["--tokens-file", str(tokens)]
    cluster = e2e_cluster(
        tmp_path,
        postgres_db,
        redis_url,
        workers=[("w1", "cpu:2")],
        flags={
            "services": [*identities, "--job-key-file", str(key), "--token", service],
            "w1": [*identities, "--token", worker],
        },
    )
    try:
        yield Guarded(cluster, service, worker, create_token(tokens, "tenant:alice"))
    finally:
        cluster.stop()


def test_a_dynamic_job_runs_on_its_own_token(guarded: Guarded) -> None:
    cluster = started(guarded.cluster)
    spec = digits_spec("scoped", STEPS, ests=2)
    spec.dataset.mode = C.DATA_MODE_DYNAMIC
    with client_of(cluster, guarded.tenant) as client:
        job = client.submit(spec)
        done = client.wait(job.job_id, timeout=180)
    assert done.state == C.JOB_STATE_SUCCEEDED, f"{done.message}\n{cluster.log_tails()}"
    assert done.progress.step == STEPS and done.spec.tenant == "alice"
    for daemon in cluster.daemons.values():  # not one call of the job's was refused
        assert "PERMISSION_DENIED" not in daemon.log_path.read_text(), daemon.log_tail(40)
    with connect(cluster.address("brain"), token=guarded.service) as channel:
        history = brain_pb2_grpc.BrainStub(channel).GetJobHistory(
            brain_pb2.GetJobHistoryRequest(job_id=job.job_id)
        )
    assert history.samples and history.samples[-1].step > 0  # reported on the job's token
    with connect(cluster.address("shardmanager"), token=guarded.worker) as channel:
        shards = shardmanager_pb2_grpc.ShardManagerStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            shards.DescribeDataset(shardmanager_pb2.DescribeDatasetRequest(dataset_id=job.job_id))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "worker:w1 may not call" in (info.value.details() or "")
