"""Sia's workloads in the simulator (gearshift.scheduler.sim.sia_trace): the artifact's counting
checked by hand on a miniature artifact written for these tests (tests/data/sia: one model, two
GPU types, step times linear in nodes, replicas and local batch)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gearshift.common.errors import ValidationError
from gearshift.scheduler.config.configuration import load
from gearshift.scheduler.config.settings import settings_of
from gearshift.scheduler.plugins.stages import allocator_for
from gearshift.scheduler.sim.sia_model import completion_seconds, micro_step
from gearshift.scheduler.sim.sia_trace import (
    load_sia_workload,
    read_constants,
    read_step_table,
    read_validation,
)
from gearshift.scheduler.sim.simulate import main
from gearshift.scheduler.sim.simulator import SimulationResult, simulate_pipeline
from gearshift.scheduler.types import Config

DATA = Path(__file__).resolve().parents[1] / "data" / "sia"
TOY = DATA / "traces" / "toy"
WORKLOAD = "tiny/workload-1"


def test_constants_come_from_the_artifacts_python_files() -> None:
    c = read_constants(DATA)
    assert c.cluster == {"fast": 4, "slow": 4}
    assert c.epochs == {"fast/toy": 2, "slow/toy": 2}
    assert c.restart == {"toy": 40.0} and c.default_restart == 30.0
    assert c.slowdowns == {"toy": 2.0}


def seconds(kind: str, devices: int, batch: int) -> float:
    per_node = read_constants(DATA).per_node[kind]
    return completion_seconds(
        read_step_table(TOY, kind),
        read_validation(TOY, 2),
        2,
        devices=devices,
        per_node=per_node,
        batch_size=batch,
        slowdown=2.0,
    )


def test_completion_time_by_hand() -> None:
    # Progress marks: min over the tables = 0, 8, 18. At B = 32 (scale 2 over B0 = 16) the
    # gain is (1+1)/(1/2+1) = 4/3 in epoch 0 and 1 in epoch 1: 8 * 3/4 + 10 = 16 steps.
    # 2 fast GPUs, one node: local batch 16, a step 0.05 + 0.16 + 0.02 = 0.23 s, calibration 2.
    assert seconds("fast", 2, 32) == pytest.approx(16 * 0.23 * 2.0)
    # One GPU above B0 accumulates at least once: 2 micro-steps of 16, 0.22 s each, no sync.
    assert seconds("fast", 1, 32) == pytest.approx(16 * 0.44 * 2.0)
    # 3 slow GPUs: placement 3 was never profiled, so the (nodes, replicas, local batch) grid
    # interpolates; ceil(32/3) = 11 is clipped to int(32/3) = 10 (the largest validated batch),
    # so the job runs batch 30, whose gain is interpolated between 16 and 32.
    step, sync = micro_step(read_step_table(TOY, "slow"), (3,), 10)
    assert (step, sync) == pytest.approx((2 * (0.05 + 0.10 + 0.03), 0.02))
    gain0 = 2 / (1 / (30 / 16) + 1)
    assert seconds("slow", 3, 32) == pytest.approx((8 / gain0 + 10) * step * 2.0)
    # Local batch 4 is below every profiled one: the tables do not reach.
    assert seconds("slow", 4, 16) == float("inf")


def run_alone(job: int, cluster: dict[str, int]) -> SimulationResult:
    w = load_sia_workload(DATA, WORKLOAD, cluster)
    settings = settings_of(load(None))
    return simulate_pipeline(
        w.jobs[job : job + 1],
        w.cluster,
        w.table,
        allocator_for(settings),
        round_seconds=60.0,
        restart_prior=w.restart_prior,
        charge_first_start=True,
        elastic=True,
    )


def test_one_job_alone_finishes_when_the_artifact_says() -> None:
    """The default profile gives a lone job its fastest configuration: its JCT is the artifact's
    restart delay (first start charged) plus its time alone there."""
    two_fast = run_alone(0, {"fast": 2})
    assert two_fast.jobs[0].jct == pytest.approx(40.0 + seconds("fast", 2, 32), rel=1e-6)
    assert two_fast.jobs[0].restart_seconds_lost == pytest.approx(40.0)
    # 3 devices for 3 ESTs of batch 32 on a type whose node holds 4.
    three_slow = run_alone(2, {"slow": 3})
    assert three_slow.jobs[0].jct == pytest.approx(40.0 + seconds("slow", 3, 32), rel=1e-6)


def test_two_devices_for_three_ests_run_at_the_artifacts_rate() -> None:
    """2 devices do not divide 3 ESTs: the table cancels the EST model's imbalance."""
    result = run_alone(2, {"slow": 2})
    assert result.jobs[0].jct == pytest.approx(40.0 + seconds("slow", 2, 32), rel=1e-6)


def test_jobs_never_span_two_types() -> None:
    """One fast and one slow GPU: a two-GPU job would mix them if it could; it takes one."""
    w = load_sia_workload(DATA, WORKLOAD, {"fast": 1, "slow": 1})
    seen: list[Config] = []
    simulate_pipeline(
        w.jobs[:1],
        w.cluster,
        w.table,
        allocator_for(settings_of(load(None))),
        restart_prior=w.restart_prior,
        elastic=True,
        on_round=lambda _now, configs: seen.extend(configs.values()),
    )
    assert seen and all(len(config) == 1 for config in seen)
    assert w.jobs[0].total_steps == 16


def copy_data(tmp_path: Path) -> Path:
    target = tmp_path / "sia"
    shutil.copytree(DATA, target)
    return target


@pytest.mark.parametrize(
    ("edit", "named", "says"),
    [
        (
            lambda d: (d / "traces/toy/scalability-slow.csv").unlink(),
            "scalability-slow.csv",
            "cannot read",
        ),
        (
            lambda d: (d / "workloads/tiny/workload-1.csv").write_text(
                "name,time,application,num_replicas,batch_size\nj,0,toy,two,32\n"
            ),
            "workload-1.csv:2 column num_replicas",
            "integer",
        ),
        (
            lambda d: (d / "traces/toy/placements-fast.csv").write_text(
                "placement,local_bsz,step\n1,8,0.1\n"
            ),
            "placements-fast.csv:1",
            "missing columns: step_time, sync_time",
        ),
        (
            lambda d: (d / "traces/toy/validation-32.csv").write_text(
                "progress,iteration,metric,grad_sqr,grad_var\n9,5,0.5,x,1\n9,5,0.5,1,1\n"
            ),
            "validation-32.csv:2 column grad_sqr",
            "not a number",
        ),
        (
            lambda d: (d / "workloads/tiny/workload-1.csv").write_text(
                "name,time,application,num_replicas,batch_size\nj,0,toy,2,64\n"
            ),
            "workload-1.csv:2 column batch_size",
            "outside the validated batch sizes [16, 32]",
        ),
        (
            lambda d: (d / "workloads/tiny/workload-1.csv").write_text(
                "name,time,application,num_replicas,batch_size\nj,0,resnet,2,32\n"
            ),
            "workload-1.csv:2 column application",
            "no traces/resnet/",
        ),
    ],
)
def test_bad_input_names_the_file_and_what_is_wrong(
    tmp_path: Path, edit: object, named: str, says: str
) -> None:
    data = copy_data(tmp_path)
    edit(data)  # type: ignore[operator]
    with pytest.raises(ValidationError) as err:
        load_sia_workload(data, WORKLOAD)
    assert named in str(err.value) and says in str(err.value)


def test_simulate_cli_runs_a_sia_workload(capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--trace-format", "sia", "--sia-data", str(DATA), "--workload", WORKLOAD]
    assert main([*common, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_jobs"] == 3
    assert all(job["restart_seconds_lost"] >= 40.0 for job in out["jobs"])
    assert main([*common[:-1], f"{WORKLOAD},{WORKLOAD}"]) == 0
    text = capsys.readouterr().out
    assert "workload: tiny/workload-1" in text and "POOLED" in text
    assert main(["--trace-format", "sia", "--workload", WORKLOAD]) == 2
    assert "--sia-data" in capsys.readouterr().err
    assert main(["--trace", "x", "--sia-data", str(DATA)]) == 2
    assert main([*common, "--write-trace", "x.trace"]) == 2
    assert "--write-trace" in capsys.readouterr().err
