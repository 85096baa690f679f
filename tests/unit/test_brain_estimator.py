"""The throughput estimator (plain functions): smoothing, pooling, low-rank completion, and the
matrix-completion estimator on Gavel's measured throughputs with entries hidden."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gearshift.brain.estimator import (
    Column,
    build_model,
    complete_matrix,
    hidden_entry_errors,
    pool_history,
    reference_matrix,
    smooth_samples,
)
from gearshift.brain.references import as_rows, gavel_references, model_type_of


def test_smoothing_weighs_recent_samples_more() -> None:
    estimate = smooth_samples([10.0, 10.0, 10.0, 20.0])
    assert estimate is not None
    assert 12.5 < estimate.steps_per_second < 20.0  # above the plain mean of 12.5
    assert estimate.relative_error > 0.1
    steady = smooth_samples([5.0] * 10)
    assert steady is not None and steady.steps_per_second == pytest.approx(5.0)
    assert steady.relative_error == pytest.approx(0.01)  # the floor
    one = smooth_samples([3.0])
    assert one is not None and one.relative_error == pytest.approx(0.2)
    assert smooth_samples([0.0, -1.0]) is None


def test_pooled_history_error_is_the_spread_across_jobs() -> None:
    pooled = pool_history([8.0, 10.0, 12.0])
    assert pooled is not None
    assert pooled.steps_per_second == pytest.approx(10.0)
    assert pooled.relative_error == pytest.approx(0.2)  # sample std 2 / mean 10
    assert pool_history([]) is None


def test_completion_recovers_a_low_rank_matrix() -> None:
    rng = np.random.default_rng(7)
    truth = rng.normal(size=(30, 2)) @ rng.normal(size=(2, 12))
    observed = truth.copy()
    hidden = rng.random(truth.shape) < 0.3
    observed[hidden] = np.nan
    completed = complete_matrix(observed, rank=2, tol=1e-9, max_iter=3000)
    assert np.max(np.abs(completed[hidden] - truth[hidden])) < 1e-3
    # Rank 1 cannot: the test can fail.
    rough = complete_matrix(observed, rank=1)
    assert np.max(np.abs(rough[hidden] - truth[hidden])) > 0.1


def test_model_types_of_gavel_jobs() -> None:
    assert model_type_of("ResNet-18 (batch size 16)") == "resnet-18-bs16"
    assert model_type_of("LM (batch size 80)") == "lm-bs80"
    assert model_type_of("CycleGAN") == "cyclegan"


@pytest.fixture(scope="module")
def gavel_rows(gavel_data: Path) -> dict[str, dict[Column, float]]:
    return as_rows(gavel_references(gavel_data / "simulation_throughputs.json"))


def test_gavel_reference_matrix(gavel_rows) -> None:
    names, columns, matrix = reference_matrix(gavel_rows)
    assert len(names) == 26
    # k80/p100/v100 at 1, 2, 4, 8 devices, and unconsolidated at 2, 4, 8.
    assert len(columns) == 21
    assert Column("v100_unconsolidated", 1) not in columns
    assert math.exp(matrix[names.index("a3c"), columns.index(Column("v100", 1))]) == pytest.approx(
        7.176, abs=1e-3
    )


def test_prediction_sources_and_interpolation(gavel_rows) -> None:
    truth = gavel_rows["transformer-bs64"]
    known = {c: truth[c] for c in (Column("v100", 1), Column("k80", 1), Column("p100", 2))}
    held_out = {k: v for k, v in gavel_rows.items() if k != "transformer-bs64"}
    model = build_model(held_out, calibrate=False)
    for target in (Column("v100", 2), Column("v100", 4), Column("p100", 4), Column("k80", 8)):
        guess = model.predict(known, target)
        assert guess is not None and not guess.interpolated and len(guess.nearest) == 3
        assert guess.steps_per_second == pytest.approx(truth[target], rel=0.3)
        assert "transformer-bs64" not in guess.nearest
    # A count between the reference columns is interpolated, with a larger error.
    between = model.predict(known, Column("v100", 3))
    assert between is not None and between.interpolated
    assert guess is not None
    assert between.relative_error > guess.relative_error
    low, high = (model.predict(known, Column("v100", n)) for n in (2, 4))
    assert low is not None and high is not None
    assert min(low.steps_per_second, high.steps_per_second) <= between.steps_per_second
    assert between.steps_per_second <= max(low.steps_per_second, high.steps_per_second)
    # Unknown accelerator types or no usable fingerprint: no completion.
    assert model.predict(known, Column("t4", 1)) is None
    assert model.predict({Column("t4", 1): 3.0}, Column("v100", 1)) is None


def _baseline_errors(rows, fraction: float, seeds: int = 3) -> float:
    """Column mean plus the row's offset (a rank-0 model), hiding entries the same way."""
    _, _, matrix = reference_matrix(rows)
    errors = []
    for i in range(matrix.shape[0]):
        present = np.flatnonzero(np.isfinite(matrix[i]))
        if present.size < 2:
            continue
        column_mean = np.nanmean(np.delete(matrix, i, axis=0), axis=0)
        keep = min(max(round(fraction * present.size), 1), present.size - 1)
        for seed in range(seeds):
            order = np.random.default_rng([seed, i, keep]).permutation(present)
            offset = np.mean(matrix[i, order[:keep]] - column_mean[order[:keep]])
            for j in order[keep:]:
                guess, truth = math.exp(column_mean[j] + offset), math.exp(matrix[i, j])
                errors.append(abs(guess - truth) / truth)
    return float(np.mean(errors))


@pytest.mark.slow
def test_estimator_on_gavel_with_entries_hidden(gavel_rows, capsys) -> None:
    """Leave each reference job out, show 25/50/75% of its row, predict the rest."""
    model = build_model(gavel_rows, calibrate=False)
    fractions = (0.25, 0.5, 0.75)
    results, _ = hidden_entry_errors(model, fractions=fractions, seeds=3)
    with capsys.disabled():
        for fraction in fractions:
            r = results[fraction]
            print(
                f"\nestimator, {fraction:.0%} of a row known: mean relative error "
                f"{r.mean:.3f}, median {r.median:.3f} over {r.count} hidden entries "
                f"(baseline column mean + row offset: {_baseline_errors(gavel_rows, fraction):.3f})"
            )
    for fraction in fractions:
        r = results[fraction]
        assert r.count >= 300
        assert r.mean < 0.3, (fraction, r)
        assert r.mean < 0.8 * _baseline_errors(gavel_rows, fraction), (fraction, r)
    assert results[0.25].median > results[0.75].median  # more known, better


@pytest.mark.slow
def test_calibrated_error_falls_with_more_known_entries(gavel_rows) -> None:
    model = build_model(gavel_rows)
    errors = dict(model.calibration)
    assert set(errors) == {1, 2, 4, 8, 16}
    assert errors[1] > errors[4] > errors[16]
    assert model.calibrated_error(3) == pytest.approx((errors[2] + errors[4]) / 2)
