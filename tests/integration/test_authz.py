"""Identities and roles on a real scheduler process (--tokens-file): a tenant sees and
changes only its own jobs, a tenant cannot act as a worker, a worker speaks only for its
own worker id, every mutating call leaves an audit line, and SIGHUP reloads the file."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import grpc
import pytest

from gearshift.common.channel import connect
from gearshift.common.identity import create_token
from gearshift.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.conftest import DaemonFactory
from tests.helpers import wait_until

C = common_pb2
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
    daemon = daemons(
        "scheduler",
        ["--database-url", f"sqlite:///{tmp_path / 's.db'}", "--tokens-file", str(tokens),
         "--token", "internal-service-token", "--round-seconds", "60"],
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
