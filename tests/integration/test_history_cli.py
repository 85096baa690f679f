"""`gearshift history` against a real Brain: the jobs of a model type, newest first, one job's
samples, JSON for scripts, and bad input refused before any call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gearshift.client.cli import main
from gearshift.common.channel import connect
from gearshift.v1 import brain_pb2, brain_pb2_grpc, common_pb2
from tests.conftest import DaemonFactory

B = brain_pb2


def spec(name: str, model_type: str, tenant: str) -> common_pb2.JobSpec:
    return common_pb2.JobSpec(
        name=name,
        model_type=model_type,
        tenant=tenant,
        entrypoint=common_pb2.Entrypoint(module="gearshift.examples.mlp"),
        num_ests=2,
        global_batch_size=16,
        total_steps=100,
        dataset=common_pb2.DatasetSpec(name="d", size=1000, shard_size=10),
    )


def test_history_lists_a_model_types_jobs_and_one_jobs_samples(
    daemons: DaemonFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    brain = daemons("brain", ["--database-url", f"sqlite:///{tmp_path / 'b.db'}"])
    with connect(brain.address) as channel:
        stub = brain_pb2_grpc.BrainStub(channel)
        jobs = [("job-r1", "resnet", "a"), ("job-r2", "resnet", "b"), ("job-b1", "bert", "a")]
        for number, (job_id, model, tenant) in enumerate(jobs):
            for kind in (B.JOB_EVENT_KIND_SUBMITTED, B.JOB_EVENT_KIND_STARTED):
                stub.ReportJobEvent(
                    B.ReportJobEventRequest(
                        event_id=f"{job_id}-{kind}",
                        job_id=job_id,
                        kind=kind,
                        time=1_000_000.0 + 10 * number + kind,
                        spec=spec(job_id, model, tenant),
                    )
                )
        stub.ReportJobEvent(
            B.ReportJobEventRequest(
                event_id="r1-done",
                job_id="job-r1",
                kind=B.JOB_EVENT_KIND_FAILED,
                exit_reason="rank 0 failed (exit code 1)",
            )
        )
        stub.ReportSamples(
            B.ReportSamplesRequest(
                batch_id="s",
                job_id="job-r1",
                samples=[
                    B.RuntimeSample(
                        time=1_000_100.0 + i,
                        step=i,
                        samples_per_second=40.0 + i,
                        accelerator_type="cpu",
                        device_count=1,
                    )
                    for i in range(1, 4)
                ],
            )
        )

    base = ["history", "--brain", brain.address]
    assert main([*base, "resnet"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:5] == ["JOB", "NAME", "MODEL", "TYPE", "TENANT"]
    assert [line.split()[0] for line in table[1:]] == ["job-r2", "job-r1"]  # newest first
    assert "rank 0 failed (exit code 1)" in table[2] and "failed" in table[2]

    assert main([*base, "--status", "running", "--json"]) == 0
    running = json.loads(capsys.readouterr().out)
    assert sorted(r["job_id"] for r in running) == ["job-b1", "job-r2"]
    assert main([*base, "--tenant", "a", "--limit", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2  # header and the newest of a's

    assert main([*base, "--job", "job-r1"]) == 0
    detail = capsys.readouterr().out
    assert "samples: 3, steps 1-3, mean 42.0 samples/s" in detail
    assert "exit: rank 0 failed (exit code 1)" in detail

    assert main([*base, "--status", "lost"]) == 2
    assert "--status: 'lost': one of submitted" in capsys.readouterr().err
    assert main([*base, "--job", "job-none"]) == 3
    assert "job-none" in capsys.readouterr().err
    assert main([*base, "nothing"]) == 0
    assert capsys.readouterr().out.strip() == "no jobs recorded"
