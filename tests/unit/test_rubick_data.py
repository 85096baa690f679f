"""Rubick's shared measurements: loaders, and check (b) against the paper's Table 2."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gearshift.common.rubick import artifact_model
from gearshift.common.rubick.data import load_history, load_model, plan_from_code, profiled_models
from gearshift.common.rubick.model import PARAM_NAMES, Params, Terms
from gearshift.common.rubick.plans import Plan, Zero
from gearshift.common.rubick.table2 import (
    AUTHORS_ENV,
    PAPER_MAX,
    PAPER_MEAN,
    Variant,
    authors_forward,
    single_node_points,
    table2,
)
from gearshift.common.rubick.validation import FIT_RUNS, fit_runs, validate

FITTABLE = ("bert", "gpt2", "roberta", "t5", "vit")


def test_plan_codes() -> None:
    assert plan_from_code("248", 64) == Plan(pp=2, tp=4, dp=8, micro_batches=2)
    assert plan_from_code("zero-offload", 4) == Plan(dp=4, zero=Zero.OFFLOAD)
    assert plan_from_code("gc", 2) == Plan(dp=2, gc=True)
    with pytest.raises(ValueError, match="needs 16 GPUs"):
        plan_from_code("242", 4)


def test_loaders_read_profiles_and_placements(rubick_data: Path) -> None:
    assert set(FITTABLE) < set(profiled_models(rubick_data))
    bert = load_model(rubick_data, "bert")
    assert len(bert.profiled) == 7 and bert.workload.params_m == pytest.approx(320.7186, rel=1e-5)
    assert len(bert.placements) == 72
    # the profile's runs are placement runs too, with the same time (ms vs s in the files)
    by_config = {m.config: m.iter_ms for m in bert.placements}
    for run in bert.profiled:
        assert by_config[run.config] == pytest.approx(run.iter_ms, rel=0.02)
    history = load_history(rubick_data)["bert"]
    assert history.k_bwd == pytest.approx(1.776250735)
    # by name, not position: the file orders k_const before k_off and k_swap
    assert (history.k_off, history.k_swap, history.k_const) == pytest.approx(
        (37.288983, 26.22188111, 15.25746464)
    )


def test_fit_runs_are_seven_single_node_with_three_offload(rubick_data: Path) -> None:
    for model in FITTABLE:
        runs = fit_runs(load_model(rubick_data, model))
        assert len(runs) == FIT_RUNS, model
        assert all(len(m.config.resources.placement) == 1 for m in runs)
        assert sum(m.config.plan.zero is Zero.OFFLOAD for m in runs) >= 3


def test_llama_profiles_are_too_small_to_fit(rubick_data: Path) -> None:
    """The shipped LLaMA profiles hold 3 ZeRO-Offload runs: no 7-parameter fit."""
    for model in ("llama7b", "llama30b"):
        report = validate(load_model(rubick_data, model))
        assert report.fit is None and "needs 7" in report.note


def test_table2_errors(rubick_data: Path) -> None:
    """Check (b) in the authors' set-up (gearshift.common.rubick.table2): Eq. 1 as built,
    fitted on the profile rows, predicts the 16 single-node points. roberta and vit are
    within Table 2's mean <= 7.42% and max <= 10.44%; bert misses, and this asserts the
    figure docs/papers/rubick.md reports for it."""
    for model in ("roberta", "vit"):
        report = table2(load_model(rubick_data, model))
        assert len(report.points) == 16, model
        assert report.errors.mean() <= PAPER_MEAN, (model, report.errors.mean())
        assert report.errors.max() <= PAPER_MAX, (model, report.errors.max())
    bert = table2(load_model(rubick_data, "bert"))
    assert bert.errors.mean() == pytest.approx(0.0769, abs=0.003)
    assert bert.errors.max() == pytest.approx(0.1357, abs=0.005)
    # beyond the paper, labelled apart: multi-node rows at the default 100 GB/s network
    assert len(bert.multi_node) == 56 and bert.multi_node_errors.mean() > 0.2


def test_table2_reads_the_forward_times_as_the_authors_do(rubick_data: Path) -> None:
    """roberta's 1-GPU DP, ZeRO-DP and Offload rows get the 2-GPU forward (240 ms), its
    1-GPU GC row the whole 480 ms; profile rows keep their own measured forward."""
    data = load_model(rubick_data, "roberta")
    fwd = {m.config.plan.label: authors_forward(data, m) for m in single_node_points(data)}
    assert fwd["dp1"] == fwd["zero-dp1"] == fwd["zero-offload1"] == pytest.approx(240.0)
    assert fwd["dp1+gc"] == pytest.approx(480.0) and fwd["dp8"] == pytest.approx(60.0)
    assert [m.forward_ms for m in data.profiled][:2] == [60.0, 120.0]
    assert AUTHORS_ENV["roberta"].comm_bytes == 4.0


def test_artifact_variant_recovers_the_artifacts_fit(rubick_data: Path) -> None:
    """The artifact's Eq. 1 with its joint fit (T_cc, T_opt, iteration time) lands on
    history.csv's parameters; on vit's 16 points its max misses Table 2 by 0.01 points."""
    report = table2(load_model(rubick_data, "vit"), Variant.ARTIFACT)
    ours, theirs = report.fit.params.array(), load_history(rubick_data)["vit"].array()
    kept = [i for i, name in enumerate(PARAM_NAMES) if name != "k_opt"]  # ~0 in both
    assert ours[kept] == pytest.approx(theirs[kept], rel=0.01)
    assert report.errors.mean() == pytest.approx(0.0333, abs=0.002)
    assert report.errors.max() == pytest.approx(0.1045, abs=0.002)


def test_artifact_form_of_eq1_by_hand() -> None:
    """fwd 100, k_bwd 2 -> bwd 200; T_dp 100 with k_sync 1 adds up: 300; offload adds
    k_off 5 + T_off 40 to T_cc and T_opt 30 + k_swap 7 + T_off 40 = 77; GC doubles fwd."""
    one = np.ones(1)
    tm = Terms(
        fwd=100 * one, ga=one, gc=0 * one, t_dp=100 * one, t_tp_pp=0 * one,
        p_over_x=10 * one, p_over_dc=10 * one, t_off=40 * one, offload=one,
    )  # fmt: skip
    params = Params(k_bwd=2, k_sync=1, k_opt=0, k_opt_off=3, k_off=5, k_swap=7, k_const=1)
    got = artifact_model.parts(params, tm)
    assert got.tcc[0] == pytest.approx(345) and got.topt[0] == pytest.approx(77)
    assert got.iter_ms[0] == pytest.approx(100 + 345 + 77 + 1)
    plain = replace(tm, offload=0 * one, t_off=0 * one, gc=one)
    assert artifact_model.iter_time_from_terms(params, plain)[0] == pytest.approx(200 + 300 + 7 + 1)
