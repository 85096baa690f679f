"""Resource-sensitivity curves, slopes and minRes (gearshift.common.rubick.sensitivity)."""

from __future__ import annotations

import pytest

from gearshift.common.rubick.model import (
    Config,
    Env,
    ForwardSample,
    Params,
    Workload,
    fits,
    throughput,
)
from gearshift.common.rubick.plans import Plan, Resources, Zero
from gearshift.common.rubick.sensitivity import best_plan, cpu_curve, gpu_curve, min_res, slopes

ENV = Env(b_inter=10.0)
PARAMS = Params(k_bwd=2.0, k_sync=2.0, k_opt=0.05, k_opt_off=4.0, k_off=3.0, k_swap=2.0, k_const=10)
GPT = Workload(
    "gpt", 1500.0, 16, 1024 * 1600 * 48, 48, (ForwardSample(8, 570.0), ForwardSample(1, 75.0))
)
LLAMA = Workload(
    "llama7b", 6426.0, 16, 4096 * 4096 * 32, 32, (ForwardSample(2, 1497.0), ForwardSample(1, 750.0))
)


@pytest.mark.parametrize("wl", [GPT, LLAMA], ids=["gpt", "llama"])
def test_gpu_curve_never_falls_and_slopes_are_marginal_gains(wl: Workload) -> None:
    curve = gpu_curve(wl, PARAMS, 16, cpus_per_gpu=4, gpus_per_node=8, env=ENV)
    values = [p.throughput for p in curve]
    assert values == sorted(values) and values[-1] > values[0] > 0
    s = slopes(curve)
    assert all(x >= 0 for x in s) and s[-1] == 0
    assert s[0] == pytest.approx(values[1] - values[0])
    for p in curve:  # the choice behind each point is real: resources up to the amount
        assert p.choice is not None and p.choice.resources.gpus <= p.amount
        assert p.choice.throughput == p.throughput


def test_cpu_curve_rises_while_offload_is_best() -> None:
    curve = cpu_curve(LLAMA, PARAMS, (1,), 8, env=ENV)
    values = [p.throughput for p in curve]
    assert values == sorted(values) and values[-1] > values[0]
    assert all(p.choice is not None and p.choice.plan.zero is Zero.OFFLOAD for p in curve)


def test_an_oom_plan_is_never_chosen() -> None:
    """With memory ignored, plain DP would win on one GPU; it does not fit, so Offload wins."""
    res = Resources((1,), 4)
    dp = Plan(dp=1, ga=16)
    assert not fits(LLAMA, dp)
    choice = best_plan(LLAMA, PARAMS, res, ENV)
    assert choice is not None and choice.plan.zero is Zero.OFFLOAD
    assert throughput(PARAMS, LLAMA, Config(dp, res), ENV) > choice.throughput
    for p in gpu_curve(LLAMA, PARAMS, 16, cpus_per_gpu=4, gpus_per_node=8, env=ENV):
        assert p.choice is not None and fits(LLAMA, p.choice.plan)
    assert best_plan(LLAMA, PARAMS, res, Env(gpu_memory_gb=8.0)) is None  # nothing fits


@pytest.mark.parametrize(
    ("wl", "original"),
    [
        (GPT, Config(Plan(dp=8, gc=True), Resources((8,), 4))),
        (GPT, Config(Plan(dp=16, zero=Zero.OFFLOAD), Resources((8, 8), 8))),
        (LLAMA, Config(Plan(pp=2, tp=4, dp=2, micro_batches=2), Resources((8, 8), 2))),
        (LLAMA, Config(Plan(dp=4, zero=Zero.OFFLOAD, gc=True), Resources((4,), 6))),
    ],
)
def test_min_res_is_at_most_requested_and_matches_original(wl: Workload, original: Config) -> None:
    target = throughput(PARAMS, wl, original, ENV)
    mr = min_res(wl, PARAMS, original, gpus_per_node=8, env=ENV)
    assert mr.found and mr.target == pytest.approx(target)
    assert mr.gpus <= original.resources.gpus
    assert mr.cpus_per_gpu <= original.resources.cpus_per_gpu
    assert mr.choice.throughput >= target * (1 - 1e-9)
    assert mr.choice.resources.gpus == mr.gpus and fits(wl, mr.choice.plan)
    # minimal: one GPU fewer cannot match it with any feasible plan
    if mr.gpus > 1:
        fewer = gpu_curve(
            wl,
            PARAMS,
            mr.gpus - 1,
            cpus_per_gpu=original.resources.cpus_per_gpu,
            gpus_per_node=8,
            env=ENV,
        )
        assert fewer[-1].throughput < target


def test_min_res_saves_resources_when_a_better_plan_exists() -> None:
    """A user's offload plan on 16 GPUs: fewer GPUs with a better plan do as well."""
    original = Config(Plan(dp=16, zero=Zero.OFFLOAD), Resources((8, 8), 8))
    mr = min_res(GPT, PARAMS, original, gpus_per_node=8, env=ENV)
    assert mr.gpus < 16


def test_min_res_keeps_an_infeasible_original() -> None:
    original = Config(Plan(dp=1), Resources((1,), 4))
    mr = min_res(LLAMA, PARAMS, original, gpus_per_node=8, env=ENV)
    assert not mr.found and mr.gpus == 1 and mr.choice.plan == original.plan
