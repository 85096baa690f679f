"""Identities and roles on real daemon processes (--tokens-file): a tenant sees and changes
only its own jobs, a tenant cannot act as a worker, a worker speaks only for its own worker
id, every mutating call leaves an audit line, SIGHUP reloads the file, and a job's token
(what a training process calls with) acts for its own job only."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

from gearshift.client.processes import start_daemon
from gearshift.common.channel import connect
from gearshift.common.errors import ValidationError
from gearshift.common.identity import create_job_key, create_token, load_job_key
from gearshift.v1 import (
    brain_pb2,
    brain_pb2_grpc,
    common_pb2,
    scheduler_pb2,
    scheduler_pb2_grpc,
    shardmanager_pb2,
    shardmanager_pb2_grpc,
)
from tests.conftest import DaemonFactory
from tests.helpers import scheduler_config, wait_until

B = brain_pb2
C = common_pb2
M = shardmanager_pb2
S = scheduler_pb2


def spec(name: str) -> C.JobSpec:
    return C.JobSpec(
        name=name,
        entrypoint=C.Entrypoint(module="gearshift.examples.mlp"),
        num_ests=2,
        global_batch_size=8,
        total_steps=5,
        dataset=C.DatasetSpec(size=64, shard_size=8),
    )


def denied(call: object, code: grpc.StatusCode = grpc.StatusCode.PERMISSION_DENIED) -> str:
    """The details of a call that must fail with `code` (a lambda, run here)."""
    with pytest.raises(grpc.RpcError) as info:
        result = call()  # type: ignore[operator]
        if hasattr(result, "__next__"):
            next(result)
    assert info.value.code() == code, info.value.details()
    return info.value.details() or ""


def test_tenants_workers_audit_and_reload(daemons: DaemonFactory, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    a, b = create_token(tokens, "tenant:a"), create_token(tokens, "tenant:b")
    w1, admin = create_token(tokens, "worker:w1"), create_token(tokens, "admin")
    key = tmp_path / "job.key"
    create_job_key(key)
    config = scheduler_config(tmp_path, round={"seconds": 60}, heartbeats={"relays": 0})
    daemon = daemons(
        "scheduler",
        ["--database-url", f"sqlite:///{tmp_path / 's.db'}", "--tokens-file", str(tokens),
         "--job-key-file", str(key), "--token", "internal-service-token", *config],
    )  # fmt: skip

    def stubs(
        token: str,
    ) -> tuple[scheduler_pb2_grpc.JobServiceStub, scheduler_pb2_grpc.WorkerRegistryStub]:
        channel = connect(daemon.address, token=token)
        return scheduler_pb2_grpc.JobServiceStub(channel), scheduler_pb2_grpc.WorkerRegistryStub(
            channel
        )

    (jobs_a, registry_a), (jobs_b, _) = stubs(a), stubs(b)
    job_a = jobs_a.SubmitJob(S.SubmitJobRequest(spec=spec("mine"))).job
    job_b = jobs_b.SubmitJob(S.SubmitJobRequest(spec=spec("theirs"))).job
    assert (job_a.spec.tenant, job_b.spec.tenant) == ("a", "b")  # filled in from the token

    other = job_b.job_id
    for call in (
        lambda: jobs_a.GetJob(S.GetJobRequest(job_id=other)),
        lambda: jobs_a.WatchJob(S.WatchJobRequest(job_id=other)),
        lambda: jobs_a.CancelJob(S.CancelJobRequest(job_id=other)),
        lambda: jobs_a.StreamJobLogs(S.StreamJobLogsRequest(job_id=other)),
        lambda: jobs_a.ScaleJob(S.ScaleJobRequest(job_id=other, ps=2, workers=2)),
    ):
        assert denied(call) == f"tenant:a may not see or change job {other}"
    assert jobs_a.GetJob(S.GetJobRequest(job_id=job_a.job_id)).spec.name == "mine"
    assert [j.job_id for j in jobs_a.ListJobs(S.ListJobsRequest()).jobs] == [job_a.job_id]
    assert "may not list tenant 'b'" in denied(
        lambda: jobs_a.ListJobs(S.ListJobsRequest(tenant="b"))
    )
    assert "may not submit as tenant 'b'" in denied(
        lambda: jobs_a.SubmitJob(S.SubmitJobRequest(spec=C.JobSpec(name="x", tenant="b")))
    )
    admin_jobs, _ = stubs(admin)
    assert admin_jobs.GetJob(S.GetJobRequest(job_id=other)).spec.name == "theirs"
    assert jobs_b.CancelJob(S.CancelJobRequest(job_id=other)).state == C.JOB_STATE_CANCELLED
    # A tenant sets its own PS job's counts, recorded with who set them; an admin any job's.
    ps_spec = C.JobSpec(name="ps", total_steps=10, parameter_server=C.ParameterServerSpec())
    ps_job = jobs_a.SubmitJob(S.SubmitJobRequest(spec=ps_spec)).job.job_id
    jobs_a.ScaleJob(S.ScaleJobRequest(job_id=ps_job, ps=3, workers=4))
    assert "set by tenant:a: 3 PS" in daemon.log_path.read_text()
    stubs(admin)[0].ScaleJob(S.ScaleJobRequest(job_id=ps_job, ps=2, workers=2))
    assert "set by admin: 2 PS" in daemon.log_path.read_text()
    assert "auto: clears the pinned counts" in denied(
        lambda: jobs_a.ScaleJob(S.ScaleJobRequest(job_id=ps_job, ps=2, auto=True)),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    jobs_a.ScaleJob(S.ScaleJobRequest(job_id=ps_job, auto=True))  # the Brain's plans again
    assert "ps: must be 1..8" in denied(
        lambda: jobs_a.ScaleJob(S.ScaleJobRequest(job_id=ps_job, ps=9, workers=1)),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert "not a parameter-server job" in denied(
        lambda: jobs_a.ScaleJob(S.ScaleJobRequest(job_id=job_a.job_id, ps=1, workers=1)),
        grpc.StatusCode.FAILED_PRECONDITION,
    )

    worker_request = S.RegisterWorkerRequest(
        worker_id="w1",
        address="127.0.0.1:1",
        devices=[C.DeviceGroup(accelerator_type="cpu", count=1)],
    )
    assert "tenant:a may not call /gearshift.v1.WorkerRegistry/RegisterWorker" in denied(
        lambda: registry_a.RegisterWorker(worker_request)
    )
    _, registry_w1 = stubs(w1)
    registry_w1.RegisterWorker(worker_request)
    registry_w1.Heartbeat(S.HeartbeatRequest(worker_id="w1"))
    assert denied(lambda: registry_w1.Heartbeat(S.HeartbeatRequest(worker_id="w2"))) == (
        "worker:w1 may not speak for worker 'w2'"
    )
    denied(
        lambda: stubs("nobody")[0].ListJobs(S.ListJobsRequest()), grpc.StatusCode.UNAUTHENTICATED
    )

    audit = [
        json.loads(line)
        for line in daemon.log_path.read_text().splitlines()
        if '"gearshift.audit"' in line
    ]
    cancel = {"who": "tenant:b", "what": "/gearshift.v1.JobService/CancelJob", "result": "OK"}
    assert any(cancel.items() <= entry.items() for entry in audit), audit
    assert any(e.get("who") == "tenant:a" and e.get("result") == "PERMISSION_DENIED" for e in audit)

    late = create_token(tokens, "tenant:c")
    jobs_c, _ = stubs(late)
    denied(lambda: jobs_c.ListJobs(S.ListJobsRequest()), grpc.StatusCode.UNAUTHENTICATED)
    daemon.process.send_signal(signal.SIGHUP)

    def reloaded() -> bool:
        try:
            jobs_c.ListJobs(S.ListJobsRequest())
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAUTHENTICATED
            return False
        return True

    wait_until(reloaded, 10, "the reloaded tokens file takes effect")
    assert daemon.process.poll() is None


def test_a_jobs_token_acts_for_its_own_job_only(
    daemons: DaemonFactory, tmp_path: Path, redis_url: str
) -> None:
    """The scheduler, the Brain and the shard manager with one job key: job a's token may
    report a's runtime samples and use a's dataset; every call about job b, every
    message of a shard stream about b, every call no training process makes, and a forged
    token are refused, and a worker's token no longer reaches any job's data."""
    tokens, key = tmp_path / "tokens", tmp_path / "job.key"
    create_job_key(key)
    worker = create_token(tokens, "worker:w1")
    common = ["--tokens-file", str(tokens), "--job-key-file", str(key), "--token", "svc"]
    prefix = f"authz-{uuid.uuid4().hex[:8]}:"
    started = {
        "scheduler": [
            *common,
            *("--database-url", f"sqlite:///{tmp_path / 's.db'}"),
            *scheduler_config(tmp_path, heartbeats={"relays": 0}),
        ],
        "brain": [*common, "--database-url", f"sqlite:///{tmp_path / 'b.db'}"],
        "shardmanager": [*common, "--redis-url", redis_url, "--key-prefix", prefix],
    }
    address = {name: daemons(name, args).address for name, args in started.items()}
    minted = load_job_key(key)
    a, b = "job-aaaaaaaaaaaa", "job-bbbbbbbbbbbb"

    def stubs(token: str) -> tuple[Any, Any, Any]:
        return (
            scheduler_pb2_grpc.WorkerRegistryStub(connect(address["scheduler"], token=token)),
            brain_pb2_grpc.BrainStub(connect(address["brain"], token=token)),
            shardmanager_pb2_grpc.ShardManagerStub(connect(address["shardmanager"], token=token)),
        )

    registry, brain, shards = stubs(minted.mint(a))
    dataset = M.DatasetConfig(
        job_id=a, size=64, shard_size=8, num_epochs=1, mode=C.DATA_MODE_DYNAMIC
    )
    shards.CreateDataset(M.CreateDatasetRequest(dataset_id=a, config=dataset))
    got = shards.AcquireShard(M.AcquireShardRequest(dataset_id=a, holder_id=f"{a}/est-0"))
    assert got.shard.shard_id >= 0
    answers = list(
        shards.StreamShards(
            iter(
                [
                    M.StreamShardsRequest(
                        acquire=M.AcquireShardRequest(dataset_id=a, holder_id=f"{a}/est-1")
                    )
                ]
            )
        )
    )
    assert answers and not answers[0].error_code
    sample = B.RuntimeSample(time=1.0, step=1, accelerator_type="cpu", device_count=1)
    samples = B.ReportSamplesRequest(batch_id="a:1", job_id=a, samples=[sample])
    assert denied(lambda: brain.ReportSamples(samples), grpc.StatusCode.NOT_FOUND)  # passed

    naming = f"service:{a} may not act on"
    for call in (
        lambda: brain.ReportSamples(
            B.ReportSamplesRequest(batch_id="x", job_id=b, samples=[B.RuntimeSample(step=1)])
        ),
        lambda: shards.CreateDataset(M.CreateDatasetRequest(dataset_id=b, config=dataset)),
        lambda: shards.CreateDataset(
            M.CreateDatasetRequest(dataset_id=f"{a}/x", config=M.DatasetConfig(job_id=b))
        ),
        lambda: shards.AcquireShard(M.AcquireShardRequest(dataset_id=b, holder_id="h")),
        lambda: shards.AckShard(M.AckShardRequest(dataset_id=b, holder_id="h")),
        lambda: shards.ReleaseHolder(M.ReleaseHolderRequest(dataset_id=b, holder_id="h")),
        lambda: shards.DescribeDataset(M.DescribeDatasetRequest(dataset_id=f"{a}x")),
    ):
        assert naming in denied(call)
    stream = shards.StreamShards(
        iter(
            [
                M.StreamShardsRequest(
                    acquire=M.AcquireShardRequest(dataset_id=a, holder_id=f"{a}/est-2")
                ),
                M.StreamShardsRequest(acquire=M.AcquireShardRequest(dataset_id=b, holder_id="h")),
            ]
        )
    )
    with pytest.raises(grpc.RpcError) as info:
        list(stream)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert f"acquire.dataset_id '{b}'" in (info.value.details() or "")
    for call in (
        lambda: registry.Heartbeat(S.HeartbeatRequest(worker_id="w1")),
        lambda: shards.DeleteJobDatasets(M.DeleteJobDatasetsRequest(job_id=a)),
        lambda: brain.ListJobRecords(B.ListJobRecordsRequest()),
    ):
        assert f"service:{a} (a job's token) may not call" in denied(call)

    forged = minted.mint(a)[:-4] + "0000"
    other_key = tmp_path / "other.key"
    create_job_key(other_key)
    for token in (forged, load_job_key(other_key).mint(a)):
        _, brain_f, shards_f = stubs(token)
        describe = M.DescribeDatasetRequest(dataset_id=a)
        denied(lambda: shards_f.DescribeDataset(describe), grpc.StatusCode.UNAUTHENTICATED)  # noqa: B023
        samples = B.ReportSamplesRequest(job_id=a)
        denied(lambda: brain_f.ReportSamples(samples), grpc.StatusCode.UNAUTHENTICATED)  # noqa: B023

    _, worker_brain, worker_shards = stubs(worker)
    assert "worker:w1 may not call" in denied(
        lambda: worker_shards.AcquireShard(M.AcquireShardRequest(dataset_id=a, holder_id="h"))
    )
    assert "worker:w1 may not call" in denied(
        lambda: worker_brain.ReportSamples(B.ReportSamplesRequest(job_id=a))
    )


def test_a_scheduler_with_a_tokens_file_needs_a_job_key(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    create_token(tokens, "admin")
    run = start_daemon(
        "scheduler",
        ["--database-url", f"sqlite:///{tmp_path / 's.db'}", "--tokens-file", str(tokens)],
        run_dir=tmp_path / "run",
    )
    assert run.process.wait(60) == 1
    assert "--tokens-file needs --job-key-file" in run.log_path.read_text()
    key = tmp_path / "job.key"
    create_job_key(key)
    with pytest.raises(ValidationError, match="exists already"):
        create_job_key(key)
