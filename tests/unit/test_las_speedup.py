"""Elastic LAS's two stages: the fair floor (`fair_share`) and what the rest goes to
(`surplus`: Sia's normalized goodput, or the jobs nearest their end), solved by hand."""

from __future__ import annotations

import numpy as np
import pytest

from gearshift.scheduler.plugins.gavel.policies.base import PolicyInput
from gearshift.scheduler.plugins.gavel.policies.configs import ConfigProblem, Configurations
from gearshift.scheduler.plugins.gavel.policies.max_min_fairness import MaxMinFairness
from gearshift.scheduler.plugins.gavel.policies.speedup import speedup_values
from gearshift.scheduler.types import Config, LasShares

A100: Config = (("a100", 1),)
T4: Config = (("t4", 1),)


def one_device_jobs(
    rates: dict[str, dict[str, float]], steps: dict[str, float] | None = None
) -> PolicyInput:
    """Jobs of one EST each (one device at most) on one A100 and one T4."""
    types = ["a100", "t4"]
    ids = list(rates)
    rows = [[(((t, 1),), r) for t, r in sorted(rates[j].items())] for j in ids]
    return PolicyInput.create(
        ids,
        types,
        [[rates[j][t] for t in types] for j in ids],
        [1, 1],
        configs=Configurations.build(types, rows),
        max_devices=[1] * len(ids),
        steps_remaining=[(steps or {}).get(j, 1.0) for j in ids],
    )


def test_speedup_values_by_hand() -> None:
    """One job at 1, 2 and 4 steps/s: speedups 1, 2, 4 over its slowest row, values
    lambda - s^-0.5 (lambda 1.1, Sia's); a row that does not run is worth nothing; a weight
    of 2 doubles them."""
    configs = Configurations.build(
        ["t4"],
        [[((("t4", 1),), 1.0), ((("t4", 2),), 2.0), ((("t4", 4),), 4.0), ((("t4", 3),), 0.0)]],
    )
    problem = ConfigProblem(1, np.array([4.0]), configs)
    values = speedup_values(problem, np.array([2.0]), admit=1.1)
    assert values == pytest.approx([2 * 0.1, 2 * (1.1 - 2**-0.5), 2 * 0.6, 0.0])
    with pytest.raises(ValueError, match="power must be < 0"):
        speedup_values(problem, np.array([1.0]), power=0.5)


def test_types_go_by_comparative_advantage() -> None:
    """a runs 2.4x faster on the A100 than on the T4, b 1.1x. Sia's values: a on the A100
    and b on the T4 are worth (2 - 2.4^-0.5) + 1 = 2.355, the swap 1 + (2 - 1.1^-0.5) =
    2.047: a takes the A100, though b is nearer its end."""
    inp = one_device_jobs(
        {"a": {"a100": 2.4, "t4": 1.0}, "b": {"a100": 1.1, "t4": 1.0}},
        steps={"a": 1e6, "b": 1e3},
    )
    speedup = MaxMinFairness(shares=LasShares(0.0, "speedup")).allocate_elastic(inp).shares
    assert speedup["a"] == pytest.approx({A100: 1.0}) and speedup["b"] == pytest.approx({T4: 1.0})
    # Spent on the jobs nearest their end, b's 1.1 x 1,000 outweighs a's 2.4: b takes it.
    shortest = MaxMinFairness(shares=LasShares(0.0, "shortest")).allocate_elastic(inp).shares
    assert shortest["b"] == pytest.approx({A100: 1.0}) and shortest["a"] == pytest.approx({T4: 1.0})


@pytest.mark.parametrize("fair_share", [1.0, 0.8, 0.5])
def test_every_job_keeps_its_share_of_the_fair_level(fair_share: float) -> None:
    """Three jobs on one A100 and one T4: a and c gain 4x from the A100, b 1.2x. Equal
    shares weigh each type 1/2: units 2.5, 1.1 and 2.5 steps/s. Max-min by hand: b takes
    the T4 whole (level 1/1.1 = 0.909) and a and c split the A100 (level 2/2.5 = 0.8), so
    t* = 0.8. Every job's level stays at or above fair_share x t*, whatever the surplus."""
    inp = one_device_jobs(
        {
            "a": {"a100": 4.0, "t4": 1.0},
            "b": {"a100": 1.2, "t4": 1.0},
            "c": {"a100": 4.0, "t4": 1.0},
        }
    )
    shares = MaxMinFairness(shares=LasShares(fair_share, "speedup")).allocate_elastic(inp)
    assert inp.configs is not None
    x = np.array(
        [
            shares.shares[inp.job_ids[int(m)]].get(c, 0.0)
            for m, c in zip(inp.configs.job, inp.configs.configs, strict=True)
        ]
    )
    levels = inp.configs.throughputs(x, 3) / np.array([2.5, 1.1, 2.5])
    assert levels.min() >= fair_share * 0.8 - 1e-4
    used = shares.device_shares()
    assert sum(u["a100"] for u in used.values()) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize(
    ("fair_share", "surplus", "message"),
    [(1.5, "speedup", "fair_share must be within"), (0.8, "fastest", "surplus must be")],
)
def test_bad_shares_are_refused(fair_share: float, surplus: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LasShares(fair_share, surplus)  # type: ignore[arg-type]


def test_a_newcomer_runs_before_a_running_job_grows() -> None:
    """Two jobs of 2 ESTs on two T4s, equal speeds: each on one T4 is worth 2 x (2 - 1) =
    2, one on both 2 - 2^-0.5 = 1.29. At Sia's lambda 1.1 the same comparison is 0.2
    against 0.39: one job would take both devices and the other wait."""
    types = ["t4"]
    rows = [[((("t4", 1),), 1.0), ((("t4", 2),), 2.0)]] * 2
    inp = PolicyInput.create(
        ["a", "b"], types, [[1.0], [1.0]], [2], configs=Configurations.build(types, rows),
        max_devices=[2, 2],
    )  # fmt: skip
    shares = MaxMinFairness(shares=LasShares(0.0, "speedup")).allocate_elastic(inp).shares
    for job in ("a", "b"):
        assert shares[job] == pytest.approx({(("t4", 1),): 1.0}), shares
    problem = ConfigProblem(2, np.array([2.0]), inp.configs)  # type: ignore[arg-type]
    sia = speedup_values(problem, np.ones(2), admit=1.1)
    assert 2 * sia[0] < sia[1]  # Sia's: one job on both T4s is worth more
