"""DLRover's resource planner (plain functions): Table 1 of the paper, sampling, OOM handling,
hot and idle PS, initial plans from history."""

from __future__ import annotations

import pytest

from gearshift.brain.dlrover import (
    GIB,
    MIB,
    Budget,
    NodeGroup,
    PastJob,
    PlanDefaults,
    PsMetrics,
    PsReplacement,
    ResourcePlan,
    Role,
    Source,
    Stage,
    adjust_plan,
    busy_ps_plan,
    handle_oom,
    hot_ps,
    initial_plan,
    optimize_counts,
    optimize_plan,
    plan_from_dict,
    plan_to_dict,
    sample_plan,
)

BUDGET = Budget(cpu_total=200, cpu_max_per_node=32)


@pytest.mark.parametrize(
    "case",
    [
        # Table 1: Wide & Deep and xDeepFM, C_total = 200 cores.
        (2.5, 5.7, 12.0, 24, 3.0, 8),
        (19.4, 3.1, 6.2, 8, 20.0, 2),
    ],
)
def test_table_1(case: tuple[float, float, float, int, float, int]) -> None:
    w_hat, s_hat, sampled, workers, worker_cores, ps = case
    plan = optimize_plan(
        BUDGET,
        PsMetrics(worker_cores_needed=w_hat, ps_cores_per_worker=s_hat, steps_per_second=sampled),
    )
    assert plan.stage is Stage.OPTIMIZE and plan.source is Source.OPTIMIZER
    assert (plan.workers.count, plan.workers.cpu_cores) == (workers, worker_cores)
    assert (plan.ps.count, plan.ps.cpu_cores) == (ps, 16.0)
    # One sampled worker's rate, scaled by the number of workers.
    assert plan.predicted_steps_per_second == pytest.approx(sampled * workers)
    assert plan.workers.total_cores + plan.ps.total_cores <= BUDGET.cpu_total


def test_optimize_counts_follows_the_formula() -> None:
    # N_w = floor(min(C/(ŵ+ŝ), s_total/ŝ)), s_total = C - N_w ŵ, N_ps = floor(s_total / 16).
    assert optimize_counts(2.5, 5.7, 200) == (24, 140.0, 8)
    n_w, s_total, n_ps = optimize_counts(19.4, 3.1, 200)
    assert (n_w, n_ps) == (8, 2) and s_total == pytest.approx(44.8)
    # PS-bound: ŝ large, so s_total/ŝ limits the workers below C/(ŵ+ŝ).
    n_w, s_total, n_ps = optimize_counts(1.0, 10.0, 100, ps_cores=16)
    assert n_w == 9 and s_total == pytest.approx(91.0) and n_ps == 5
    with pytest.raises(ValueError, match="must be > 0"):
        optimize_counts(0.0, 1.0, 100)


def test_optimize_sizes_memory_from_observed_use() -> None:
    current = sample_plan(BUDGET)
    plan = optimize_plan(
        BUDGET,
        PsMetrics(2.5, 5.7, worker_memory_bytes_used=1000 * MIB, ps_memory_bytes_used=8 * GIB),
        current,
    )
    assert plan.workers.memory_bytes == 1200 * MIB  # observed x 1.2 headroom
    # One sampled PS used 8 GiB; spread over 8 PS with headroom: 1.2 GiB each.
    assert plan.ps.memory_bytes == pytest.approx(8 * GIB * 1.2 / 8, rel=1e-3)


def test_sample_plan_is_one_worker_at_cmax() -> None:
    plan = sample_plan(BUDGET, PlanDefaults(sample_ps_count=2))
    assert (plan.workers.count, plan.workers.cpu_cores) == (1, 32)
    assert (plan.ps.count, plan.ps.cpu_cores) == (2, 16)
    assert plan.workers.memory_bytes == 4 * GIB and plan.source is Source.DEFAULT


def test_busy_ps_in_sampling_gets_more_cores_then_more_ps() -> None:
    current = sample_plan(BUDGET)
    assert busy_ps_plan(BUDGET, PsMetrics(ps_cores_used=(10.0,)), current) is None
    busier = busy_ps_plan(BUDGET, PsMetrics(ps_cores_used=(15.5,)), current)
    assert busier is not None and busier.ps.cpu_cores == 32 and busier.ps.count == 1
    at_max = busy_ps_plan(BUDGET, PsMetrics(ps_cores_used=(31.0,)), busier)
    assert at_max is not None and at_max.ps.count == 2 and at_max.ps.cpu_cores == 32


def test_oom_doubles_worker_memory_or_ps_count() -> None:
    current = sample_plan(BUDGET)
    worker = handle_oom(current, Role.WORKER, Stage.SAMPLE)
    assert worker.workers.memory_bytes == 8 * GIB and worker.ps == current.ps
    ps = handle_oom(current, Role.PS, Stage.SAMPLE)
    assert ps.ps.count == 2 * current.ps.count and ps.workers == current.workers
    assert "OOM" in worker.reason and "OOM" in ps.reason


def _running(workers: int, ps: int, ps_cores: float = 16.0) -> ResourcePlan:
    return ResourcePlan(
        Stage.OPTIMIZE,
        NodeGroup(workers, 3.0, 2 * GIB),
        NodeGroup(ps, ps_cores, 4 * GIB),
        Source.OPTIMIZER,
        "",
    )


def test_hot_ps_detection() -> None:
    defaults = PlanDefaults()
    assert hot_ps([15.0, 6.0, 5.0, 7.0], 16.0, defaults) == [0]
    assert hot_ps([15.0, 14.8, 15.2, 15.1], 16.0, defaults) == []  # all busy, none hot
    assert hot_ps([10.0, 3.0], 16.0, defaults) == []  # not busy
    assert hot_ps([15.0], 16.0, defaults) == [0]  # a single busy PS


def test_hot_ps_replacement_uses_the_paper_formula() -> None:
    # s = min((ŝ_hot / ŝ_total) * ŝ * N_w, C_max): 15/39 * 5.7 * 24 = 52.6 -> C_max 32.
    current = _running(24, 4)
    plan = adjust_plan(BUDGET, PsMetrics(2.5, 5.7, ps_cores_used=(15.0, 8.0, 8.0, 8.0)), current)
    assert plan.ps_replacements == (PsReplacement(0, 32.0),)
    # Uncapped: 15/75 * 5.7 * 24 = 27.36 -> 28 cores.
    plan = adjust_plan(
        BUDGET,
        PsMetrics(
            2.5,
            5.7,
            ps_cores_used=(15.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0),
        ),
        _running(24, 13),
    )
    assert plan.ps_replacements == (PsReplacement(0, 28.0),)
    assert plan.stage is Stage.ADJUST and "hot PS" in plan.reason


def test_idle_ps_adds_workers_within_the_budget() -> None:
    # 8 workers x 3 + 2 PS x 16 = 56 cores; PS use 12 of 32: ŝ = 1.5 per worker,
    # s_total/ŝ = 21 workers; 200 cores leave room for 48 more -> 21 workers.
    current = _running(8, 2)
    plan = adjust_plan(
        BUDGET, PsMetrics(2.5, 3.1, ps_cores_used=(6.0, 6.0), steps_per_second=40.0), current
    )
    assert plan.workers.count == 21 and plan.ps == current.ps
    assert plan.predicted_steps_per_second == pytest.approx(40.0 / 8 * 21)
    # A tight budget caps the workers: 60 cores - 32 PS = 28 -> 9 workers of 3 cores.
    tight = adjust_plan(Budget(60, 32), PsMetrics(2.5, 3.1, ps_cores_used=(6.0, 6.0)), current)
    assert tight.workers.count == 9


def test_adjust_keeps_a_balanced_plan() -> None:
    current = _running(8, 2)
    plan = adjust_plan(
        BUDGET,
        PsMetrics(2.5, 3.1, ps_cores_used=(12.0, 12.5), worker_memory_bytes_used=GIB),
        current,
    )
    assert plan.workers.count == 8 and plan.ps_replacements == ()
    assert plan.workers.memory_bytes == math_ceil_mib(GIB * 1.2)
    assert "kept" in plan.reason


def math_ceil_mib(value: float) -> int:
    return -(-int(value) // MIB) * MIB


def test_initial_plan_without_history_is_the_sampling_plan() -> None:
    plan = initial_plan(BUDGET, [], "model type 'wd'")
    assert plan.stage is Stage.INITIAL and plan.source is Source.DEFAULT
    assert plan.workers.count == 1 and "no similar job" in plan.reason


def test_initial_plan_weights_recent_jobs_more() -> None:
    newest = PastJob(
        "b",
        200.0,
        NodeGroup(20, 3.0, 2 * GIB),
        NodeGroup(6, 16.0, 4 * GIB),
        worker_memory_peak=GIB,
        steps_per_second=200.0,
    )
    older = PastJob(
        "a", 100.0, NodeGroup(8, 4.0, 2 * GIB), NodeGroup(2, 16.0, 4 * GIB), steps_per_second=40.0
    )
    plan = initial_plan(BUDGET, [newest, older], "model type 'wd', dataset 'criteo'")
    # Weights 1 and 1/2: workers (20 + 4) / 1.5 = 16, PS (6 + 1) / 1.5 = 4.67 -> 5.
    assert plan.workers.count == 16 and plan.ps.count == 5
    assert plan.workers.cpu_cores == 4.0  # (3 + 2) / 1.5 = 3.33 -> 4
    assert plan.source is Source.HISTORY and "b" in plan.reason
    # Memory: newest from its observed peak (1.2 GiB), older from its configuration (2 GiB).
    assert plan.workers.memory_bytes == math_ceil_mib((1.2 * GIB + 0.5 * 2 * GIB) / 1.5)
    # Per-worker rate 10 and 5, weighted: 25/3, times 16 workers.
    assert plan.predicted_steps_per_second == pytest.approx((10 + 0.5 * 5) / 1.5 * 16)


def test_initial_plan_is_cut_to_the_budget() -> None:
    big = PastJob("x", 1.0, NodeGroup(40, 8.0, GIB), NodeGroup(4, 16.0, GIB))
    plan = initial_plan(Budget(100, 16), [big], "model type 'x'")
    assert plan.workers.count == 4  # (100 - 64) / 8
    assert plan.workers.total_cores + plan.ps.total_cores <= 100
    assert "fit C_total" in plan.reason


def test_plan_dict_round_trip() -> None:
    plan = adjust_plan(
        BUDGET, PsMetrics(2.5, 5.7, ps_cores_used=(15.0, 8.0, 8.0, 8.0)), _running(24, 4)
    )
    assert plan_from_dict(plan_to_dict(plan)) == plan
