"""Rubick's profiling run (gearshift.worker.profiling.rubick_run) on the digits CNN: each
configuration mapped onto Rubick's runs (ESTs per process = GA, GC, threads = CPUs per GPU,
global batch per run) with positive times, the process's random generators and thread count
put back; a job's rank 0 profiling itself (`--profile-rubick`) stores its runs in a real
Brain (PostgreSQL) that fits them and trains to the digest of the same job unprofiled;
`gearshift profile --rubick` stores and fits; check (c)'s plumbing (fit on 7, finite errors
on the rest; the figures are bench/rubick.py --real's); bad input exits 2 naming the flag."""

from __future__ import annotations

import pickle
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.rubick import fit_indices, holdout
from gearshift.client.cli import main
from gearshift.client.spec import load_spec
from gearshift.common.channel import connect
from gearshift.common.facts import EXIT_BAD_INPUT
from gearshift.common.profiles import profile_key
from gearshift.v1 import brain_pb2, brain_pb2_grpc
from gearshift.worker.profiling import rubick_run
from gearshift.worker.profiling.rubick_run import Point, grid, measure
from gearshift.worker.runtime.job import load_job
from tests.conftest import DaemonFactory

REPO = Path(__file__).resolve().parents[2]
DIGITS = "gearshift.examples.digits_cnn"
TIMEOUT_S = 240
JOB = """\
name: digits-rubick
entrypoint:
  module: gearshift.examples.digits_cnn
  config: {lr: 0.05}
num_ests: 2
global_batch_size: 16
total_steps: 5
dataset: {name: digits, size: 1797, shard_size: 32, seed: 1}
"""


def test_runs_map_onto_rubick_and_the_process_is_left_alone() -> None:
    points = grid([4, 8], [1, 2], [False, True], [1])
    torch.set_num_threads(2)
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    before = (torch.get_rng_state(), random.getstate(), pickle.dumps(np.random.get_state()))
    profile = measure(DIGITS, {"lr": 0.05}, points, global_batch=16, warmup=1, steps=2)
    assert torch.equal(torch.get_rng_state(), before[0])
    assert random.getstate() == before[1]
    assert pickle.dumps(np.random.get_state()) == before[2]
    assert torch.get_num_threads() == 2
    assert torch.are_deterministic_algorithms_enabled() is was_deterministic

    assert [t.point for t in profile.runs] == points
    assert all(t.iteration_ms > 0 and t.cpu_ms > 0 and len(t.step_ms) == 2 for t in profile.runs)
    assert sorted(profile.forward_ms) == [(4, 1), (8, 1)]
    assert profile.params == sum(
        p.numel() for p in load_job(DIGITS, {"lr": 0.05}).model.parameters()
    )
    request = profile.request(1)
    assert request.workload.global_batch == 16
    assert [f.samples_per_gpu for f in request.workload.forward] == [4, 8]
    mapped = [
        (r.plan.dp, r.plan.ga, r.plan.gc, list(r.resources.placement), r.resources.cpus_per_gpu,
         r.global_batch) for r in request.runs
    ]  # fmt: skip
    assert mapped == [(1, p.ests, p.gc, [1], 1, p.global_batch) for p in points]
    assert request.runs[0].iteration_seconds == pytest.approx(profile.runs[0].iteration_ms / 1e3)
    with pytest.raises(ValueError, match="no run at 2 thread"):
        profile.request(2)

    # Check (c)'s plumbing: fit on 7 spread over the grid, errors on the one left.
    assert fit_indices(8) == [0, 1, 2, 4, 5, 6, 7]
    fitted, errors, chosen = holdout(request)
    assert len(chosen) == 7 and len(errors) == 1
    assert np.isfinite(fitted.rmsle) and np.all(np.isfinite(errors)) and np.all(errors >= 0)


def test_default_grid_and_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    points = rubick_run.default_points(64, 4, gc=True, threads=[1])
    assert {p.batch_per_est for p in points} == {8, 16, 32}
    assert {p.ests for p in points} == {1, 2, 4} and len(points) == 18
    assert len(rubick_run.default_points(16, 2, gc=False, threads=[2])) == 6
    assert Point(8, 2, True, 1).label == "b8xk2+gc/t1"
    for argv, flag in (
        (["--global-batch", "16", "--batches", "0,4"], "--batches"),
        (["--global-batch", "16", "--batches", "4", "--ests", "x"], "--ests"),
        (["--global-batch", "16", "--batches", "4", "--threads", ""], "--threads"),
    ):
        assert rubick_run.main(["--job", DIGITS, *argv]) == EXIT_BAD_INPUT
        assert flag in capsys.readouterr().err
    argv = ["--job", "gearshift.examples.no_such", "--global-batch", "8", "--batches", "4"]
    assert rubick_run.main(argv) == EXIT_BAD_INPUT
    assert "cannot import module" in capsys.readouterr().err


def _train(directory: Path, *extra: str) -> str:
    cmd = [sys.executable, "-m", "gearshift.worker.run", "--job", DIGITS, "--ests", "2"]
    cmd += ["--procs", "1", "--steps", "4", "--batch-size", "16", "--log-every", "50"]
    cmd += ["--checkpoint-dir", str(directory / "ckpt"), *extra]
    done = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    found = re.findall(r"^digest sha256:([0-9a-f]{64})$", done.stdout, re.MULTILINE)
    assert found, done.stdout
    return done.stdout


def test_rank0_profiles_itself_into_the_brain(
    daemons: DaemonFactory, postgres_db: str, tmp_path: Path
) -> None:
    brain = daemons("brain", ["--database-url", postgres_db])
    plain = _train(tmp_path / "plain")
    job = "job-rubick-1"
    profiled = _train(
        tmp_path / "profiled", "--brain", brain.address, "--job-id", job, "--profile-rubick"
    )
    line = next(x for x in profiled.splitlines() if x.startswith("rubick profile of job"))
    # b = 16/2 = 8: per-EST batches 4, 8, 16 x ESTs 1, 2 x GC off, on.
    assert "12 runs" in line and "12 stored" in line, line
    digest = re.compile(r"^digest sha256:\w+$", re.MULTILINE)
    assert digest.findall(profiled) == digest.findall(plain)
    with connect(brain.address) as channel:
        stub = brain_pb2_grpc.BrainStub(channel)
        fitted = stub.FitModel(brain_pb2.FitModelRequest(job_id=job))
        predicted = stub.PredictPlan(
            brain_pb2.PredictPlanRequest(
                job_id=job,
                plan=brain_pb2.RubickPlan(dp=1, ga=2),
                resources=brain_pb2.RubickResources(placement=[1]),
            )
        )
    assert fitted.run_count == 12 and np.isfinite(fitted.rmsle)
    assert predicted.iteration_seconds > 0


def test_cli_profiles_stores_and_fits(
    daemons: DaemonFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    brain = daemons("brain", ["--database-url", f"sqlite:///{tmp_path / 'b.db'}"])
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    base = ["profile", "--rubick", str(job), "--brain", brain.address, "--steps", "2"]
    assert main([*base, "--batches", "4,8", "--ests", "1,2"]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split() == [
        "BATCH/EST", "ESTS", "GC", "THREADS", "WALL", "MS", "CPU", "MS"
    ]  # fmt: skip
    key = f"{profile_key(load_spec(job), 'cpu')}:t1"
    assert f"1 thread(s): stored and fitted for model key {key}" in printed
    assert "on 8 runs" in printed
    with connect(brain.address) as channel:
        fitted = brain_pb2_grpc.BrainStub(channel).FitModel(
            brain_pb2.FitModelRequest(model_key=key)
        )
    assert fitted.run_count == 8

    for extra, flag in (
        (["--ests", "0"], "--ests"),
        (["--job-id", "j", "--threads", "1,2"], "--threads"),
        (["--job-id", "j", "--model-key", "k"], "--job-id"),
    ):
        assert main([*base, *extra]) == EXIT_BAD_INPUT
        assert flag in capsys.readouterr().err
