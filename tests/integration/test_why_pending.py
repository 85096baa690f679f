"""A waiting job says why, through the real scheduler process over gRPC (PostgreSQL, a
worker played by an in-process WorkerAgent): GetJob carries the reason and the queue
position, the reason is one REASON event however many rounds it holds, and `gearshift job`
prints the `why:` line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gearshift.common.channel import connect
from gearshift.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.conftest import DaemonFactory
from tests.helpers import wait_until
from tests.integration.test_sched_service import (
    WAIT,
    FakeWorker,
    cpus,
    events,
    job_state,
    kinds,
    scheduler,
    spec,
    workers,
)

C = common_pb2
S = scheduler_pb2
__all__ = ["workers"]  # the fixture


def test_a_pending_job_says_why_once_and_the_cli_prints_it(
    daemons: DaemonFactory, tmp_path: Path, postgres_db: str, workers: list[FakeWorker]
) -> None:
    address = scheduler(daemons, tmp_path, postgres_db)
    workers.append(FakeWorker("w1", address, cpus(1)))
    with connect(address) as channel:
        jobs = scheduler_pb2_grpc.JobServiceStub(channel)
        first = jobs.SubmitJob(S.SubmitJobRequest(spec=spec("first", 2, max_devices=1))).job
        wait_until(
            lambda: job_state(jobs, first.job_id) == C.JOB_STATE_RUNNING, WAIT, "the first job runs"
        )
        second = jobs.SubmitJob(S.SubmitJobRequest(spec=spec("second", 2, max_devices=1))).job
        wait_until(
            lambda: (
                jobs.GetJob(S.GetJobRequest(job_id=second.job_id)).reason.code == "no_free_device"
            ),
            WAIT,
            "the second job's reason",
        )
        seen = jobs.GetClusterState(S.GetClusterStateRequest()).round
        wait_until(
            lambda: jobs.GetClusterState(S.GetClusterStateRequest()).round >= seen + 3,
            WAIT,
            "three more rounds",
        )
        job = jobs.GetJob(S.GetJobRequest(job_id=second.job_id))
        assert job.reason.message == "no free device of an accepted type (cpu: 0 free)"
        assert job.reason.facts["free"] == "cpu: 0 free"
        assert job.reason.since > 0 and job.queue_position == 1
        assert kinds(events(jobs, second.job_id)).count("REASON") == 1
        listed = jobs.ListJobs(S.ListJobsRequest()).jobs
        assert {j.job_id: j.queue_position for j in listed} == {
            first.job_id: 0,
            second.job_id: 1,
        }
    shown = subprocess.run(
        [sys.executable, "-m", "gearshift.client.cli", "job", second.job_id, "--address", address],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "why:        no free device of an accepted type (cpu: 0 free)" in shown.stdout
    listed_cli = subprocess.run(
        [sys.executable, "-m", "gearshift.client.cli", "jobs", "--address", address],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert "QUEUE" in listed_cli[0].split()
    row = next(line for line in listed_cli if line.startswith(second.job_id))
    assert "#1" in row.split()
