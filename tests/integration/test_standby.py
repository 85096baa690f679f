"""A standby scheduler (api/standby.py) on the leader's PostgreSQL database: it answers
reads with the leader's data, saying it is a standby and naming the leader; it refuses
writes, naming the leader, and a client given both addresses (standby first) lands them
on the leader (gearshift.common.leader_follow); when the leader is killed it takes over
and serves writes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gearshift.client import cli
from gearshift.client.devcluster import wait_all
from gearshift.client.processes import DaemonProcess, start_daemon
from gearshift.client.sdk import Client
from gearshift.common.channel import connect
from gearshift.common.errors import GearshiftError
from gearshift.common.leader_follow import LEADER_KEY, STANDBY_KEY
from gearshift.scheduler.daemon import LEADER_HEALTH
from gearshift.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.helpers import scheduler_config, wait_until

C = common_pb2
S = scheduler_pb2
READY_S = 90.0
TAKEOVER_LIMIT_S = 5.0  # issue 46: 2 s wanted, 5 s at most


def _spec(name: str) -> C.JobSpec:
    """A job no worker will take (there are none): it stays queued."""
    return C.JobSpec(
        name=name,
        entrypoint=C.Entrypoint(module="gearshift.examples.mlp"),
        num_ests=1,
        global_batch_size=8,
        total_steps=10,
        dataset=C.DatasetSpec(size=100, shard_size=10),
    )


@pytest.fixture
def schedulers(tmp_path: Path, postgres_db: str) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    """The leader and the standby, started together: the first to take the lock leads."""
    args = ["--database-url", postgres_db, "--log-format", "text"]
    # Rounds decided in the scheduler's own process: a decision process each would only
    # cost the start and the stop seconds of CPU.
    args += scheduler_config(tmp_path, round={"decisionProcess": False})
    started: list[DaemonProcess] = []
    try:
        for name in ("scheduler-a", "scheduler-b"):
            started.append(start_daemon(name, args, run_dir=tmp_path, module="gearshift.scheduler"))
        wait_all(started, READY_S)  # a leader is ready once it serves writes
        leading = ["serving writes" in d.log_path.read_text() for d in started]
        assert sum(leading) == 1, [d.log_tail() for d in started]
        leader, standby = started if leading[0] else started[::-1]
        assert "standby:" in standby.log_path.read_text()
        yield leader, standby
    finally:
        for daemon in started:
            daemon.stop()


def _leads(daemon: DaemonProcess) -> bool:
    """Whether the daemon's health check answers SERVING for the leader's name."""
    with grpc.insecure_channel(daemon.address) as channel:
        request = health_pb2.HealthCheckRequest(service=LEADER_HEALTH)
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=10)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def _metadata(pairs: object) -> dict[str, str]:
    return {key: value for key, value in pairs or ()}  # type: ignore[attr-defined]


def test_a_standby_reads_redirects_writes_and_takes_over(
    schedulers: tuple[DaemonProcess, DaemonProcess],
    capsys: pytest.CaptureFixture[str],
) -> None:
    leader, standby = schedulers
    with Client(leader.address, timeout=10) as on_leader:
        queued = on_leader.submit(_spec("queued"))
        assert on_leader.get(queued.job_id) and on_leader.standby_leader is None

    assert _leads(leader) and not _leads(standby)  # the leader's readiness, for a probe
    # The same through the command a TLS readiness probe runs.
    health = ["health", "--service", LEADER_HEALTH, "--timeout", "10"]
    assert cli.main([*health, leader.address]) == 0
    assert cli.main([*health, standby.address]) == 1

    # The SDK and the CLI say when a standby answered, naming the leader.
    with Client(standby.address, timeout=10) as on_standby:
        assert on_standby.get(queued.job_id).spec.name == "queued"
        assert on_standby.standby_leader == leader.address
    capsys.readouterr()
    for command in (["job", queued.job_id], ["jobs"]):
        assert cli.main([*command, "--address", standby.address, "--rpc-timeout", "10"]) == 0
        printed = capsys.readouterr()
        assert "answered by a standby scheduler" in printed.err, command
        assert printed.err.strip().endswith(f"the leader is {leader.address}"), printed.err
        assert queued.job_id in printed.out
    assert cli.main(["job", queued.job_id, "--address", leader.address]) == 0
    assert "standby" not in capsys.readouterr().err

    # Reads on the standby: the leader's data, marked as a standby's, naming the leader.
    with grpc.insecure_channel(standby.address) as raw:
        jobs = scheduler_pb2_grpc.JobServiceStub(raw)
        job, call = jobs.GetJob.with_call(S.GetJobRequest(job_id=queued.job_id), timeout=10)
        assert job.state == C.JOB_STATE_QUEUED and job.spec.name == "queued"
        said = _metadata(call.initial_metadata())
        assert said[STANDBY_KEY] == "1" and said[LEADER_KEY] == leader.address
        listed = jobs.ListJobs(S.ListJobsRequest(), timeout=10)
        assert [j.job_id for j in listed.jobs] == [queued.job_id]
        cluster = jobs.GetClusterState(S.GetClusterStateRequest(), timeout=10)
        assert cluster.policy  # built from the store
        # A write, on a channel that does not follow: refused, naming the leader.
        with pytest.raises(grpc.RpcError) as refused:
            jobs.SubmitJob(S.SubmitJobRequest(spec=_spec("refused")), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        details = refused.value.details() or ""
        assert "standby" in details and leader.address in details
        assert _metadata(refused.value.trailing_metadata())[LEADER_KEY] == leader.address
        # A watch on the standby follows the leader's events from the store.
        events = iter(jobs.WatchJob(S.WatchJobRequest(job_id=queued.job_id), timeout=30))
        assert next(events).type == S.JOB_EVENT_TYPE_SUBMITTED

        # Writes through a client given both addresses, the standby first: on the leader.
        both_addresses = f"{standby.address},{leader.address}"
        with Client(both_addresses, timeout=10) as both:
            sent = both.submit(_spec("sent-on"), idempotency_key="sent-on")
            assert both.cancel(queued.job_id).state == C.JOB_STATE_CANCELLED
        # A worker's calls (its daemon's channel is the same): registered on the leader.
        with connect(both_addresses, timeout=10) as channel:
            registry = scheduler_pb2_grpc.WorkerRegistryStub(channel)
            registry.RegisterWorker(
                S.RegisterWorkerRequest(
                    worker_id="w1",
                    address="127.0.0.1:9",
                    devices=[C.DeviceGroup(accelerator_type="cpu", count=1)],
                )
            )
            assert not registry.Heartbeat(S.HeartbeatRequest(worker_id="w1")).reregister
        assert next(events).type == S.JOB_EVENT_TYPE_CANCELLED  # seen by the standby's watch
    with Client(leader.address, timeout=10) as on_leader:
        assert on_leader.get(sent.job_id).spec.name == "sent-on"

    # The leader killed: the standby takes over and serves writes.
    leader.kill()
    killed = time.monotonic()
    with Client(standby.address, timeout=2) as on_standby:
        taken: list[str] = []

        def submitted() -> bool:
            try:
                taken.append(on_standby.submit(_spec("after"), idempotency_key="after").job_id)
            except GearshiftError:
                return False
            return True

        wait_until(submitted, 30, "a submission served by the new leader")
        takeover = time.monotonic() - killed
        assert on_standby.get(sent.job_id).state == C.JOB_STATE_QUEUED  # nothing lost
        assert on_standby.standby_leader is None  # it leads now
    print(f"takeover: first submission served {takeover:.2f} s after the SIGKILL")
    assert takeover < TAKEOVER_LIMIT_S, takeover
    assert "serving writes" in standby.log_path.read_text()
    assert _leads(standby)
    with grpc.insecure_channel(standby.address) as raw:
        _, call = scheduler_pb2_grpc.JobServiceStub(raw).GetJob.with_call(
            S.GetJobRequest(job_id=taken[0]), timeout=10
        )
        assert STANDBY_KEY not in _metadata(call.initial_metadata())  # it leads now
