"""Rubick's Eq. 1, its memory estimate and its RMSLE fit (gearshift.common.rubick.model)."""

from __future__ import annotations

import numpy as np
import pytest

from gearshift.common.rubick.model import (
    Config,
    Env,
    ForwardSample,
    Params,
    Workload,
    fit,
    fits,
    iter_time,
    iter_time_from_terms,
    overlap,
    relative_errors,
    terms,
)
from gearshift.common.rubick.plans import Plan, Resources, Zero

ENV = Env(b_intra=400.0, b_inter=10.0, b_pcie=32.0)
WL = Workload(
    name="synthetic",
    params_m=1000.0,
    global_batch=64,
    seq_hid_layers=1024 * 2048 * 24,
    layers=24,
    forward=(ForwardSample(64, 640.0), ForwardSample(8, 80.0)),
)
PARAMS = Params(k_bwd=2.0, k_sync=2.0, k_opt=0.05, k_opt_off=4.0, k_off=3.0, k_swap=2.0, k_const=10)


def cfg(plan: Plan, placement: tuple[int, ...], cpus: int = 1) -> Config:
    return Config(plan, Resources(placement, cpus))


def test_overlap_spans_sum_to_max() -> None:
    assert overlap(1.0, 3.0, 4.0) == pytest.approx(7.0)
    assert overlap(2.0, 3.0, 4.0) == pytest.approx(5.0)
    assert overlap(100.0, 3.0, 4.0) == pytest.approx(4.0, rel=1e-2)
    assert overlap(1e4, 1e6, 2e6) == pytest.approx(2e6)  # no overflow at large k
    assert overlap(2.0, 0.0, 0.0) == 0.0


def test_eq1_by_hand_dp_across_nodes() -> None:
    """DP on 2 nodes x 4 GPUs: every term of Eq. 1 written out."""
    plan = Plan(dp=8)
    fwd = 80.0  # 8 samples per GPU: the profiled point
    bwd = 2.0 * fwd
    t_dp = 1000 * 2 * 7 / 8 * 2 / 10.0  # V_dp * bytes / B_inter
    expect = fwd + (bwd**2 + t_dp**2) ** 0.5 + 0.05 * 1000 + 10
    assert iter_time(PARAMS, WL, cfg(plan, (4, 4)), ENV) == pytest.approx(expect)
    # on one node NVLink carries it, 40x faster
    t_dp_intra = t_dp * 10.0 / 400.0
    expect_intra = fwd + (bwd**2 + t_dp_intra**2) ** 0.5 + 50 + 10
    assert iter_time(PARAMS, WL, cfg(plan, (8,)), ENV) == pytest.approx(expect_intra)


def test_eq1_ga_gc_zero_offload_by_hand() -> None:
    fwd = 80.0 / 2  # GA 2: 4 samples per step, scaled linearly from the profiled 8
    bwd = 2.0 * fwd + fwd  # GC recomputes the forward
    t_dp = 1000 * 2 * 7 / 8 * 2 / 400.0
    t_off = 1000 * 2 / (8 * 32.0)
    t_opt = 4.0 * 1000 / (8 * 3)
    t_cc = 2 * fwd + 1 * bwd + (bwd**2 + t_dp**2) ** 0.5
    t_oo = (t_dp**3 + t_off**3) ** (1 / 3) + (t_opt**2 + t_off**2) ** 0.5
    plan = Plan(dp=8, ga=2, gc=True, zero=Zero.OFFLOAD)
    got = iter_time(PARAMS, WL, cfg(plan, (8,), cpus=3), ENV)
    assert got == pytest.approx(t_cc + t_oo + 10)


def test_eq1_3d_by_hand() -> None:
    """PP 2 x TP 4 x DP 2 on 2 nodes of 8: TP inside nodes, PP across, DP inside."""
    plan = Plan(dp=2, tp=4, pp=2, micro_batches=4)
    micro = 640.0 * (64 / (2 * 4 * 4)) / 64  # per-GPU work 2 samples: scaled from the 8
    fwd = micro / 2 * (4 + 2 - 1)
    bwd = 2.0 * fwd
    t_dp = 1000 * 2 * 1 / 2 / (4 * 2) * 2 / 400.0
    sh_l = 1024 * 2048 * 24
    t_tp = 8 * 3 * 64e-6 * sh_l / (2 * 4) * 2 / 400.0
    t_pp = 2 * 2 * 64e-6 * (sh_l / 24) / (2 * 4) * 2 / 10.0
    t_opt = 0.05 * 1000 / (4 * 2)
    expect = fwd + (bwd**2 + t_dp**2) ** 0.5 + t_tp + t_pp + t_opt + 10
    assert iter_time(PARAMS, WL, cfg(plan, (8, 8)), ENV) == pytest.approx(expect)


def test_zero_dp_splits_the_optimizer_step() -> None:
    plain = iter_time(PARAMS, WL, cfg(Plan(dp=8), (8,)), ENV)
    zero = iter_time(PARAMS, WL, cfg(Plan(dp=8, zero=Zero.DP), (8,)), ENV)
    assert plain - zero == pytest.approx(0.05 * 1000 * (1 - 1 / 8))


def test_offload_gets_faster_with_cpus() -> None:
    times = [
        iter_time(PARAMS, WL, cfg(Plan(dp=2, zero=Zero.OFFLOAD), (2,), c), ENV)
        for c in (1, 2, 4, 8)
    ]
    assert times == sorted(times, reverse=True) and times[0] > times[-1]


def test_memory_llama7b_needs_offload_on_one_gpu() -> None:
    """Section 7.2: on one A800 only ZeRO-Offload trains LLaMA-2-7B."""
    llama = Workload("llama7b", 6426.0, 16, 4096 * 4096 * 32, 32, (ForwardSample(2, 1497.0),))
    assert not fits(llama, Plan(dp=1))
    assert not fits(llama, Plan(dp=1, zero=Zero.DP))
    assert fits(llama, Plan(dp=1, zero=Zero.OFFLOAD, ga=16, gc=True))
    assert fits(llama, Plan(dp=1, tp=8, ga=16, gc=True))


def test_forward_profile_drops_impossible_samples() -> None:
    """A forward time below that of less work (t5's 4 ms at 4 GPUs) is not used."""
    wl = Workload(
        "w", 100.0, 8, 1.0, 1, (ForwardSample(1, 54), ForwardSample(2, 4), ForwardSample(2, 91))
    )
    assert wl.forward_ms(2) == 91
    wl2 = Workload("w", 100.0, 8, 1.0, 1, (ForwardSample(1, 54), ForwardSample(2, 4)))
    assert wl2.forward_ms(2) == pytest.approx(108)


def test_fit_refuses_fewer_than_seven_runs() -> None:
    with pytest.raises(ValueError, match=">= 7"):
        fit(WL, [cfg(Plan(dp=8), (8,))] * 6, [100.0] * 6, ENV)


def _synthetic_configs() -> list[Config]:
    """30 configurations across every plan family; the first 7 are the profiling runs
    (one node, 3 of them ZeRO-Offload, as the paper asks)."""
    o = Zero.OFFLOAD
    first = [
        cfg(Plan(dp=8), (8,)),
        cfg(Plan(dp=2), (2,)),
        cfg(Plan(dp=4, gc=True), (4,)),
        cfg(Plan(dp=8, zero=Zero.DP), (8,)),
        cfg(Plan(dp=1, zero=o), (1,), 2),
        cfg(Plan(dp=4, zero=o), (4,), 8),
        cfg(Plan(dp=8, zero=o), (8,), 1),
    ]
    rest = [
        cfg(Plan(dp=1), (1,)),
        cfg(Plan(dp=4), (4,)),
        cfg(Plan(dp=16), (8, 8)),
        cfg(Plan(dp=8), (4, 4)),
        cfg(Plan(dp=4), (1, 1, 1, 1)),
        cfg(Plan(dp=2, ga=4), (2,)),
        cfg(Plan(dp=8, ga=2), (2, 2, 2, 2)),
        cfg(Plan(dp=8, gc=True), (8,)),
        cfg(Plan(dp=16, gc=True), (8, 8)),
        cfg(Plan(dp=2, zero=Zero.DP), (1, 1)),
        cfg(Plan(dp=16, zero=Zero.DP, ga=2), (8, 8)),
        cfg(Plan(dp=4, zero=Zero.DP), (4,)),
        cfg(Plan(dp=2, zero=o), (2,), 4),
        cfg(Plan(dp=8, zero=o), (8,), 6),
        cfg(Plan(dp=16, zero=o), (8, 8), 2),
        cfg(Plan(dp=4, zero=o, gc=True), (2, 2), 3),
        cfg(Plan(tp=4), (4,)),
        cfg(Plan(tp=8), (8,)),
        cfg(Plan(dp=2, tp=8), (8, 8)),
        cfg(Plan(pp=2, micro_batches=4), (1, 1)),
        cfg(Plan(pp=4, tp=2, micro_batches=8), (8,)),
        cfg(Plan(pp=2, tp=4, dp=2, micro_batches=4), (8, 8)),
        cfg(Plan(pp=2, tp=8, micro_batches=2), (8, 8)),
    ]
    return first + rest


@pytest.mark.parametrize("draw", range(5))
def test_synthetic_fit_predicts_unseen_configs(draw: int) -> None:
    """Check (a): parameters drawn, 30 configs from Eq. 1 with 3% noise, fit on 7, the other
    23 predicted within 5% on average."""
    rng = np.random.default_rng(1000 + draw)
    true = Params(
        k_bwd=rng.uniform(1.5, 2.5),
        k_sync=rng.uniform(1.2, 4.0),
        k_opt=rng.uniform(0.01, 0.1),
        k_opt_off=rng.uniform(1.0, 8.0),
        k_off=rng.uniform(1.2, 4.0),
        k_swap=rng.uniform(1.2, 4.0),
        k_const=rng.uniform(5.0, 30.0),
    )
    configs = _synthetic_configs()
    assert len(configs) == 30
    clean = iter_time_from_terms(true, terms(WL, configs, ENV))
    noisy = clean * (1 + rng.normal(0.0, 0.03, size=clean.shape))
    fitted = fit(WL, configs[:7], noisy[:7], ENV, seed=draw)
    errors = relative_errors(fitted.params, WL, configs[7:], noisy[7:], ENV)
    assert errors.mean() <= 0.05, (errors.mean(), fitted.params, true)


def test_fit_is_deterministic() -> None:
    configs = _synthetic_configs()[:7]
    y = iter_time_from_terms(PARAMS, terms(WL, configs, ENV))
    assert fit(WL, configs, y, ENV) == fit(WL, configs, y, ENV)
