"""Rubick's shared measurements: loaders, and check (b) against the paper's Table 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gearshift.common.rubick.data import load_history, load_model, plan_from_code, profiled_models
from gearshift.common.rubick.plans import Plan, Zero
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
    assert load_history(rubick_data)["bert"].k_bwd == pytest.approx(1.776250735)


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


@pytest.mark.xfail(
    strict=True,
    reason=(
        "the literal Eq. 1 does not reach Table 2 on the shipped runs: the data give no "
        "inter-node bandwidth (the paper's 100 GB/s RDMA under-prices multi-node rows 5-10x, "
        "and 2x4 GPUs run far faster than 4x2 - no single bottleneck B fits), ZeRO-Offload's "
        "optimizer time falls like d^-0.4 where k_opt_off*P/(d*c) says 1/d, and some rows "
        "contradict others (roberta DP on 1 GPU as fast as on 2). Figures: bench/rubick.py"
    ),
)
def test_table2_errors(rubick_data: Path) -> None:
    """Check (b): fit on 7 runs, predict the rest: mean <= 7.4%, max <= 10.4% per model."""
    for model in FITTABLE:
        report = validate(load_model(rubick_data, model))
        assert report.fit is not None
        errors = np.concatenate(list(report.errors.values()))
        assert errors.mean() <= 0.074, (model, errors.mean())
        assert errors.max() <= 0.104, (model, errors.max())
