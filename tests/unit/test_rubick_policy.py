"""Rubick's Algorithm 1 and its break-down variants on the paper's traces (shared data)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gearshift.common.errors import ValidationError
from gearshift.common.gavel import JobKey
from gearshift.common.rubick.perf import PerfSource, load_perf
from gearshift.common.rubick.plans import Plan, consolidated
from gearshift.scheduler.plugins.rubick.rubick_policy import (
    CpuShare,
    make_curve,
    make_rubick,
    share_cpus,
)
from gearshift.scheduler.round.placement import place
from gearshift.scheduler.sim.rubick_gavel import gavel_table, job_type, run_gavel
from gearshift.scheduler.sim.rubick_sim import ARTIFACT_OVERHEADS, simulate_rubick
from gearshift.scheduler.sim.rubick_trace import (
    RubickJob,
    generate_rubick_workload,
    read_rubick_trace,
)
from gearshift.scheduler.sim.simulate import main
from gearshift.scheduler.types import Device, Target

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "rubick"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"no Rubick data at {DATA}")


@pytest.fixture(scope="module")
def perf() -> PerfSource:
    return load_perf(DATA, "fit")  # the CLI's call, so that it finds the cache


def test_curve_is_monotone_with_slopes() -> None:
    c = make_curve((0.0, 0.0, 1.0, 0.5, 1.5))
    assert c.value == (0.0, 0.0, 1.0, 1.0, 1.5)
    assert c.least == (0, 0, 2, 2, 4)
    assert c.up[0] == pytest.approx(0.5)  # 0 -> 2 GPUs: +1.0 over 2
    assert c.down[4] == pytest.approx(0.25)  # 4 -> 2 GPUs: -0.5 over 2


def test_bad_trace_names_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "t.csv"
    bad.write_text(
        "name,submission_time,duration,application,num_gpus,num_cpus,bandwidth,exec_plan,"
        "steps,is_sla\nvit-0,0,10,vit,2,16,0,zero-dp,5,0\nvit-1,5,10,vit,x,16,0,zero-dp,5,0\n"
    )
    with pytest.raises(ValidationError, match=r"t\.csv:3 column num_gpus"):
        read_rubick_trace(bad)
    bad.write_text("name,duration\nx,1\n")
    with pytest.raises(ValidationError, match="missing columns"):
        read_rubick_trace(bad)


@needs_data
def test_breakdown_order_and_2x_on_base_trace(perf: PerfSource) -> None:
    jobs = read_rubick_trace(DATA / "workloads" / "workload-base.csv", perf)
    jct = {
        v: simulate_rubick(jobs, perf, make_rubick(perf, v)).result.average_jct
        for v in ("rubick", "rubick_r", "rubick_e", "rubick_n")
    }
    assert jct["rubick"] < jct["rubick_r"] < jct["rubick_e"] < jct["rubick_n"]
    assert jct["rubick_n"] >= 2 * jct["rubick"]


@needs_data
def test_generated_workload_is_seeded_and_runs(perf: PerfSource) -> None:
    a = generate_rubick_workload(perf, 40, 30.0, tenants={"A": 64, "B": 0}, seed=3)
    assert a == generate_rubick_workload(perf, 40, 30.0, tenants={"A": 64, "B": 0}, seed=3)
    assert {j.guaranteed for j in a} == {True, False}
    run = simulate_rubick(a, perf, make_rubick(perf, "rubick", quotas={"A": 64}))
    assert len(run.result.jobs) == 40


@needs_data
def test_guaranteed_jobs_never_below_request_on_mt(perf: PerfSource) -> None:
    jobs = read_rubick_trace(DATA / "workloads" / "workload-mt.csv", perf)
    run = simulate_rubick(jobs, perf, make_rubick(perf, "rubick", quotas={"A": 64}))
    worst = [run.worst_ratio[j] for j, g in run.guaranteed.items() if g]
    assert min(worst) >= 1 - 1e-6


def test_place_follows_the_workers_a_target_names() -> None:
    devices = [Device(w, i, "a800") for w in ("n0", "n1") for i in range(4)]
    spread = Target("j", (("a800", 2),), {"a800": (1, 1)}, workers=(("n0", 1), ("n1", 1)))
    got = place({"j": spread}, devices, {})["j"]
    assert sorted(d.worker_id for d, _ in got) == ["n0", "n1"]  # not consolidated on one
    packed = Target("j", (("a800", 2),), {"a800": (1, 1)}, workers=(("n1", 2),))
    moved = place({"j": packed}, devices, {"j": got})["j"]  # held devices do not match
    assert [d.worker_id for d, _ in moved] == ["n1", "n1"]
    assert (devices[4], 1) in moved  # the device it held there is kept


@needs_data
def test_gavel_baselines_run_on_rubick_jobs_from_the_same_numbers(perf: PerfSource) -> None:
    jobs = generate_rubick_workload(perf, 12, 30.0, tenants={"B": 0}, seed=5)
    table = gavel_table(jobs, perf)
    for job in jobs:
        ms = perf.iter_ms(job.application, job.plan, consolidated(job.gpus, 8), 8)
        assert ms is not None
        assert table.throughput(JobKey(job_type(job), job.gpus), "a800") == pytest.approx(1e3 / ms)
    for name, elastic in (("max_min_fairness_perf", False), ("las", True)):
        run = run_gavel(jobs, perf, name, elastic=elastic)
        assert len(run.result.jobs) == len(jobs)


@needs_data
def test_quotas_put_guaranteed_jobs_first_under_gavels_policies(perf: PerfSource) -> None:
    jobs = generate_rubick_workload(perf, 24, 60.0, tenants={"A": 8, "B": 0}, seed=3)
    assert any(j.guaranteed for j in jobs) and not all(j.guaranteed for j in jobs)
    plain = run_gavel(jobs, perf, "las", elastic=True, nodes=2)
    quotas = run_gavel(jobs, perf, "las", elastic=True, nodes=2, quotas={"A": 8, "B": 0})
    assert quotas.result.policy.endswith("+quotas") and not plain.result.policy.endswith("quotas")
    assert len(quotas.result.jobs) == len(jobs)
    # guaranteed jobs go first: they gain on best-effort ones (the average need not fall:
    # an admitted job runs at its full request, however it scales)
    ratio = quotas.average_jct(True) / quotas.average_jct(False)
    assert ratio < plain.average_jct(True) / plain.average_jct(False)


def _saturating(c: int) -> float:
    return c / (c + 1)  # 2 -> 0.667, 3 -> 0.75, 4 -> 0.8, 5 -> 0.833


def test_cpu_reclaim_takes_from_the_gentlest_slope_above_its_min_res() -> None:
    """By hand, one node, 4 GPUs each. (1) No free core: the ZeRO-Offload job (rate
    c/(c+1): slope (0.75 - 0.667)/4 = 0.021 per core at 2 cores per GPU) reclaims one core
    per GPU from the best-effort job, whose speed does not read cores (slope 0), down to its
    minRes of 1; at 3 it would need 4 more and nobody is above minRes: 3 and 1."""
    off = CpuShare("off", {"n": 4}, 2, 1, _saturating, taker=True)
    be = CpuShare("be", {"n": 4}, 2, 1, lambda c: 1.0)
    free = {"n": 0}
    assert share_cpus([off, be], free) == {"off": 3, "be": 1} and free == {"n": 0}
    # (2) 4 free cores first (2 -> 3), then the guaranteed job gives its one core per GPU
    # above its minRes of 2 (3 -> 4); then it is at its minRes: 4 and 2.
    g = CpuShare("g", {"n": 4}, 3, 2, lambda c: 1.0)
    free = {"n": 4}
    assert share_cpus([off, g], free) == {"off": 4, "g": 2} and free == {"n": 0}
    # (3) A victim whose slope down (1/4 per core) exceeds the taker's keeps its cores; so
    # does one the 0.97 rule holds (victim=False).
    steep = CpuShare("steep", {"n": 4}, 2, 1, float)  # c cores: speed c
    held = CpuShare("held", {"n": 4}, 2, 1, lambda c: 1.0, victim=False)
    free = {"n": 0}
    assert share_cpus([off, steep, held], free) == {} and free == {"n": 0}
    # (4) A victim on two nodes gives a core per GPU on both: the taker on node a gets
    # 2 -> 3 (4 cores on a) and node b keeps the 2 cores freed there.
    wide = CpuShare("wide", {"a": 4, "b": 2}, 2, 1, lambda c: 1.0)
    off_a = CpuShare("off", {"a": 4}, 2, 1, _saturating, taker=True)
    free = {"a": 0, "b": 0}
    assert share_cpus([off_a, wide], free) == {"off": 3, "wide": 1}
    assert free == {"a": 0, "b": 2}


def _vit(name: str, at: float, gpus: int, steps: int, *, guaranteed: bool = False) -> RubickJob:
    return RubickJob(
        name, at, 0.0, "vit", gpus, gpus, "ga", Plan(dp=gpus), steps, guaranteed,
        "A" if guaranteed else "B",
    )  # fmt: skip


@needs_data
def test_artifact_clock_rounds_at_ticks_and_frees_gpus_at_them(perf: PerfSource) -> None:
    """--overheads rubick-artifact on one 8-GPU node: a arrives at 10 s, is placed at the
    60 s tick and starts 260 s later; b (arrived at 20 s) gets the node at the tick after
    a ends, not when it ends, and pays 260 s too."""
    ms = perf.iter_ms("vit", Plan(dp=8), (8,), 1)
    assert ms is not None
    jobs = [_vit("a", 10.0, 8, 1000), _vit("b", 20.0, 8, 1000)]
    costs = ARTIFACT_OVERHEADS
    run = simulate_rubick(
        jobs,
        perf,
        make_rubick(perf, "rubick_n"),
        nodes=1,
        rescale_seconds=costs.rescale_seconds,
        start_seconds=costs.start_seconds,
        tick_seconds=costs.tick_seconds,
    )
    a, b = run.result.jobs
    assert a.start_time == 60.0 and a.finish_time == pytest.approx(320.0 + ms)
    tick = 60.0 * math.ceil(a.finish_time / 60.0)
    assert b.start_time == tick and b.finish_time == pytest.approx(tick + 260.0 + ms)
    event = simulate_rubick(jobs, perf, make_rubick(perf, "rubick_n"), nodes=1).result.jobs
    assert event[0].finish_time == pytest.approx(10.0 + ms)
    assert event[1].start_time == pytest.approx(event[0].finish_time)


@needs_data
def test_without_reclaim_a_guaranteed_job_waits_for_free_gpus(perf: PerfSource) -> None:
    """The artifact's reclaim loop never runs: with reclaim off, a guaranteed job does not
    take GPUs from a running best-effort one; with it on, it starts on arrival."""
    jobs = [_vit("be", 0.0, 8, 20000), _vit("guar", 100.0, 4, 1000, guaranteed=True)]
    starts = {}
    for reclaim in (True, False):
        policy = make_rubick(perf, "rubick", quotas={"A": 8}, reclaim=reclaim)
        be, guar = simulate_rubick(jobs, perf, policy, nodes=1).result.jobs
        starts[reclaim] = (guar.start_time, be.finish_time)
    assert starts[True][0] == 100.0
    assert starts[False][0] == pytest.approx(starts[False][1])


@needs_data
def test_rubick_artifact_overheads_on_the_cli(
    perf: PerfSource, capsys: pytest.CaptureFixture[str]
) -> None:
    """--overheads rubick-artifact runs Rubick's traces on the artifact's clock; it sets the
    start and restart costs itself, so giving them too is an error naming the flag. (Here,
    not in test_simulator_cli: `perf` has already fitted the models in this process.)"""
    common = ["--workload", "rubick", "--generate", "6", "--rubick-data", str(DATA)]
    artifact = [*common, "--overheads", "rubick-artifact", "--policy", "rubick_n", "--json"]
    assert main(artifact) == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert report["policy"] == "rubick_n" and report["average_jct_seconds"] >= 260
    assert main([*artifact, "--rescale-seconds", "78"]) == 2
    assert "--rescale-seconds: --overheads rubick-artifact sets it" in capsys.readouterr().err
