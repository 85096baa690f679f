"""The paper's worked examples (Gavel sections 4.1 and 4.3), solved by the policies."""

from __future__ import annotations

import numpy as np
import pytest

from gearshift.scheduler.plugins.gavel.policies import make_policy
from gearshift.scheduler.plugins.gavel.policies.base import PolicyInput
from gearshift.scheduler.plugins.gavel.policies.max_min_fairness import MaxMinFairness
from gearshift.scheduler.plugins.gavel.policies.solvers import solvers_for
from gearshift.scheduler.plugins.gavel.policies.water_filling import WaterFilling

# Rows: jobs 0-2; columns: (V100, K80) throughputs, cluster of 1 V100 + 1 K80.
LAS_THROUGHPUTS = [[40.0, 10.0], [12.0, 4.0], [100.0, 50.0]]


def las_example() -> PolicyInput:
    return PolicyInput.create(["0", "1", "2"], ["v100", "k80"], LAS_THROUGHPUTS, [1, 1])


def test_las_worked_example() -> None:
    inp = las_example()
    allocation = MaxMinFairness().allocate(inp)
    expected = np.array([[0.455, 0.0], [0.455, 0.091], [0.091, 0.909]])
    assert np.allclose(allocation.fractions, expected, atol=2e-3)
    # Every job gets ~1.091x what an equal time share of each type would give it.
    equal = np.array(LAS_THROUGHPUTS).sum(axis=1) / 3
    normalized = allocation.effective_throughputs(inp) / equal
    assert np.allclose(normalized, 12 / 11, atol=2e-3)


def test_agnostic_las_ignores_speed_and_is_worse_for_the_worst_job() -> None:
    inp = las_example()
    aware = MaxMinFairness().allocate(inp)
    agnostic = MaxMinFairness(heterogeneity_aware=False).allocate(inp)
    # Agnostic: equal time; every job gets 2/3 of a device's time in total.
    assert np.allclose(agnostic.fractions.sum(axis=1), 2 / 3, atol=1e-3)
    equal = np.array(LAS_THROUGHPUTS).sum(axis=1) / 3
    worst = (aware.effective_throughputs(inp) / equal).min()
    worst_agnostic = (agnostic.effective_throughputs(inp) / equal).min()
    assert worst > worst_agnostic + 0.05


def test_weights_scale_the_fair_share() -> None:
    inp = PolicyInput.create(["a", "b"], ["v100"], [[1.0], [1.0]], [1], priority_weights=[2, 1])
    x = MaxMinFairness().allocate(inp).fractions.ravel()
    assert x == pytest.approx([2 / 3, 1 / 3], abs=1e-3)


def test_scale_factor_counts_devices() -> None:
    # A 2-device job occupies twice the cluster per unit of time, so a 1-device job gets
    # twice its time: equal device-time (1 device x 1.0 = 2 devices x 0.5).
    inp = PolicyInput.create(["a", "b"], ["v100"], [[1.0], [1.0]], [2], scale_factors=[1, 2])
    x = MaxMinFairness().allocate(inp).fractions.ravel()
    assert x == pytest.approx([1.0, 0.5], abs=1e-3)


@pytest.mark.parametrize("entities", [False, True])
def test_water_filling_worked_example(entities: bool) -> None:
    """Weights 3, 1, 1, 1 on 4 identical GPUs: first job 1 is capped at a full GPU (1.0) while
    jobs 2-4 are at 1/3; job 1 is the bottleneck; the next iteration gives jobs 2-4 full GPUs."""
    ids = ["1", "2", "3", "4"]
    if entities:
        inp = PolicyInput.create(
            ids,
            ["v100"],
            [[1.0]] * 4,
            [4],
            entities=ids,
            entity_weights={"1": 3, "2": 1, "3": 1, "4": 1},
        )
    else:
        inp = PolicyInput.create(ids, ["v100"], [[1.0]] * 4, [4], priority_weights=[3, 1, 1, 1])
    policy = WaterFilling()
    allocation = policy.allocate(inp)
    first, second = policy.iterations
    assert first.frozen == (0,)
    assert first.guaranteed[0] == pytest.approx(1.0, abs=1e-4)
    for job in (1, 2, 3):
        assert first.guaranteed[job] == pytest.approx(1 / 3, abs=1e-4)
    assert second.frozen == (1, 2, 3)
    assert allocation.fractions.ravel() == pytest.approx([1, 1, 1, 1], abs=1e-4)


def test_hierarchical_entities_share_by_weight_and_fifo_inside() -> None:
    # Two entities, weights 2:1, six identical jobs, 3 GPUs: the cluster splits 2:1;
    # "research" is FIFO inside (its oldest job first), "product" is fair inside.
    ids = ["r1", "r2", "r3", "p1", "p2", "p3"]
    inp = PolicyInput.create(
        ids,
        ["v100"],
        [[1.0]] * 6,
        [3],
        entities=["research"] * 3 + ["product"] * 3,
        entity_weights={"research": 1.0, "product": 2.0},
        entity_policies={"research": "fifo", "product": "fairness"},
    )
    x = WaterFilling().allocate(inp).fractions.ravel()
    assert x[3:].sum() == pytest.approx(2.0, abs=1e-3)
    assert x[3:] == pytest.approx([2 / 3] * 3, abs=1e-3)
    assert x[:3] == pytest.approx([1.0, 0.0, 0.0], abs=1e-3)


def test_solvers_by_problem_class() -> None:
    assert solvers_for("lp")[0] == "CLARABEL"
    assert solvers_for("conic")[0] == "CLARABEL"
    assert solvers_for("milp")[0] == "HIGHS"
    assert make_policy("hierarchical").problem_class == "milp"
    assert make_policy("finish_time_fairness").problem_class == "conic"
    assert make_policy("las").problem_class == "lp"


def test_finish_time_fairness_denominator_is_the_isolated_time_accrued() -> None:
    """Themis's rho by hand. One V100; job a (10,000 steps at 1 step/s) arrived 20,000 s ago
    and has run nothing, job b just arrived. Isolated share: half the V100, so a's
    isolated finish is 10,000 / 0.5 = 20,000 s and t_iso = 0 (no steps done yet):
        rho_a = (20,000 + 10,000 / x) / 20,000 = 1 + 0.5 / x,   rho_b = 0.5 / (1 - x).
    Equal at x^2 = 0.5: a gets 0.707 of the V100. Dividing by the elapsed time instead
    (20,000 + 20,000) would give 2x^2 + x - 1 = 0: x = 0.5."""
    inp = PolicyInput.create(
        ["a", "b"],
        ["v100"],
        [[1.0], [1.0]],
        [1],
        steps_remaining=[10_000, 5_000],
        times_since_start=[20_000, 0],
    )
    x = make_policy("finish_time_fairness").allocate(inp).fractions.ravel()
    assert x[0] == pytest.approx(0.5**0.5, abs=2e-3)
    assert x[1] == pytest.approx(1 - 0.5**0.5, abs=2e-3)


def test_finish_time_fairness_counts_isolated_time_from_steps_done() -> None:
    """Gavel's ledger: after a runs 4,000 steps (isolated rate 0.5 step/s), t_iso = 8,000 s.
    Next allocation, 1,000 s later: rho_a = (21,000 + 6,000 / x) / (8,000 + 12,000)."""
    from scipy.optimize import brentq

    from gearshift.scheduler.plugins.gavel.policies.finish_time_fairness import FinishTimeFairness

    policy = FinishTimeFairness()
    policy.allocate(
        PolicyInput.create(
            ["a", "b"],
            ["v100"],
            [[1.0], [1.0]],
            [1],
            steps_remaining=[10_000, 5_000],
            times_since_start=[20_000, 0],
        )
    )
    later = PolicyInput.create(
        ["a", "b"],
        ["v100"],
        [[1.0], [1.0]],
        [1],
        steps_remaining=[6_000, 5_000],
        times_since_start=[21_000, 1_000],
    )
    x = policy.allocate(later).fractions.ravel()
    assert policy.isolated_time == pytest.approx({"a": 8_000.0, "b": 0.0})
    # rho_a = (21,000 + 6,000/x) / 20,000 and rho_b = (1,000 + 5,000/(1-x)) / 10,000 meet at
    # the optimum; its root, found numerically from that hand-written equation:
    want = brentq(
        lambda v: (21_000 + 6_000 / v) / 20_000 - (1_000 + 5_000 / (1 - v)) / 10_000, 1e-3, 0.999
    )
    assert x[0] == pytest.approx(want, abs=2e-3)
