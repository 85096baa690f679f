"""Every policy returns a valid allocation, and each optimizes what it claims to."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from gearshift.common.errors import ValidationError
from gearshift.scheduler.plugins.gavel.policies import make_policy, policy_names
from gearshift.scheduler.plugins.gavel.policies.base import Allocation, PolicyInput
from gearshift.scheduler.plugins.gavel.policies.fifo import Fifo, QueueFifo
from gearshift.scheduler.plugins.gavel.policies.finish_time_fairness import FinishTimeFairness
from gearshift.scheduler.plugins.gavel.policies.isolated import isolated_share
from gearshift.scheduler.plugins.gavel.policies.makespan import Makespan
from gearshift.scheduler.plugins.gavel.policies.max_min_fairness import MaxMinFairness
from gearshift.scheduler.plugins.gavel.policies.max_sum_throughput import MaxSumThroughput
from gearshift.scheduler.plugins.gavel.policies.min_total_cost import MinTotalCost
from gearshift.scheduler.plugins.gavel.policies.shortest_job_first import ShortestJobFirst

TYPES = ["k80", "p100", "v100"]


def instance(
    seed: int, jobs: int = 12, colocated: bool = False, one_device: bool = False
) -> PolicyInput:
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.5, 4.0, size=(jobs, 1))
    speedup = rng.uniform(1.0, 6.0, size=(jobs, 1))
    throughputs = np.hstack([base, base * np.sqrt(speedup), base * speedup])
    scale = rng.choice([1, 1, 1, 2, 4], size=jobs).astype(float)
    if one_device:
        scale[:] = 1.0
    pairs = {}
    if colocated:
        for a in range(jobs):
            for b in range(a + 1, jobs):
                if scale[a] == scale[b]:
                    share = rng.uniform(0.4, 0.8, size=(3, 2))
                    pairs[(a, b)] = share * np.stack([throughputs[a], throughputs[b]], axis=1)
    return PolicyInput.create(
        [f"j{i}" for i in range(jobs)],
        TYPES,
        throughputs,
        [4, 4, 4],
        scale_factors=scale,
        priority_weights=rng.choice([1.0, 2.0], size=jobs),
        steps_remaining=rng.uniform(1e3, 1e5, size=jobs),
        times_since_start=rng.uniform(0, 3600, size=jobs),
        deadlines=[math.inf] * jobs,
        costs=[0.9, 1.4, 2.5],
        colocated=pairs,
    )


def assert_valid(inp: PolicyInput, allocation: Allocation) -> None:
    x = allocation.fractions
    assert np.all(x >= -1e-6) and np.all(x <= 1 + 1e-6)
    per_job = allocation.job_totals()
    for job in inp.job_ids:
        assert sum(per_job[job].values()) <= 1 + 1e-5, job
    index = {j: i for i, j in enumerate(inp.job_ids)}
    used = np.zeros(inp.num_types)
    for combo, row in zip(allocation.combos, x, strict=True):
        used += inp.scale_factors[index[combo[0]]] * row
    assert np.all(used <= inp.num_workers + 1e-4), used


# Gavel's FIFO queue under its own names keeps the reference's bookkeeping, which can
# over-commit a type; the round mechanism then time-shares it (tests/unit/test_sched_mechanism.py).
OVERCOMMITTING = {"fifo", "fifo_perf"}


@pytest.mark.parametrize("name", sorted(set(policy_names()) - OVERCOMMITTING))
def test_every_policy_is_valid(name: str) -> None:
    # AlloX refuses jobs on several devices (tests/unit/test_gavel_baselines.py).
    inp = instance(1, colocated=name.endswith("packed"), one_device=name == "allox")
    assert_valid(inp, make_policy(name, seed=3).allocate(inp))


def test_reference_fifo_overcommits_like_gavel() -> None:
    # The reference assigns a drawn job to the last type of its list (v100 here) while
    # another type still has room, so v100 holds more than it has.
    inp = PolicyInput.create(["a", "b", "c"], TYPES, [[1.0, 1.0, 1.0]] * 3, [2, 2, 1])
    x = make_policy("fifo", seed=0).allocate(inp).fractions
    assert x[:, 2].sum() >= 2.0  # at least two jobs on the one v100
    assert x.sum(axis=1).tolist() == [1.0, 1.0, 1.0]


def test_unknown_policy_names_the_field() -> None:
    with pytest.raises(ValidationError, match="--policy: unknown policy 'nope'"):
        make_policy("nope", field="--policy")


def test_empty_cluster_or_no_jobs() -> None:
    empty = PolicyInput.create([], TYPES, np.zeros((0, 3)), [4, 4, 4])
    assert make_policy("las").allocate(empty).fractions.shape == (0, 3)
    none = PolicyInput.create(["a"], TYPES, [[1, 2, 3]], [0, 0, 0])
    assert make_policy("las").allocate(none).fractions.sum() == 0


def min_normalized(inp: PolicyInput, allocation: Allocation) -> float:
    levels = (
        allocation.effective_throughputs(inp) * inp.scale_factors / inp.equal_share_throughputs()
    )
    return float((levels / inp.priority_weights).min())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_las_beats_the_others_at_its_own_objective(seed: int) -> None:
    inp = instance(seed)
    best = min_normalized(inp, MaxMinFairness().allocate(inp))
    for other in (MaxMinFairness(heterogeneity_aware=False), MaxSumThroughput()):
        assert best >= min_normalized(inp, other.allocate(inp)) - 1e-4
    # Sharing incentive: at least as good as an equal split of every type.
    iso = Allocation.singles(inp, isolated_share(inp))
    assert best >= min_normalized(inp, iso) - 1e-4


def test_space_sharing_is_never_worse() -> None:
    inp = instance(4, colocated=True)
    packed = min_normalized(inp, MaxMinFairness(space_sharing=True).allocate(inp))
    alone = min_normalized(inp, MaxMinFairness().allocate(inp))
    assert packed >= alone - 1e-4


def test_max_sum_throughput_has_the_most_throughput() -> None:
    inp = instance(5)
    total = MaxSumThroughput().allocate(inp).effective_throughputs(inp).sum()
    for name in ("las", "makespan", "fifo_lp", "isolated"):
        assert total >= make_policy(name).allocate(inp).effective_throughputs(inp).sum() - 1e-4


def makespan(inp: PolicyInput, allocation: Allocation) -> float:
    rate = allocation.effective_throughputs(inp)
    return float(np.max(inp.steps_remaining / np.maximum(rate, 1e-12)))


def test_makespan_policy_finishes_first() -> None:
    inp = instance(6)
    best = makespan(inp, Makespan().allocate(inp))
    for name in ("las", "max_sum_throughput", "finish_time_fairness"):
        assert best <= makespan(inp, make_policy(name).allocate(inp)) * (1 + 1e-4)


def max_rho(inp: PolicyInput, allocation: Allocation) -> float:
    """Themis's rho for jobs that have run nothing yet: no isolated time accrued, so the
    denominator is steps / isolated throughput alone (Gavel's cumulative isolated time)."""
    rate = np.maximum(allocation.effective_throughputs(inp), 1e-12)
    iso = (inp.throughputs * isolated_share(inp)).sum(axis=1)
    t = inp.times_since_start
    return float(np.max((t + inp.steps_remaining / rate) / (inp.steps_remaining / iso)))


def test_finish_time_fairness_minimizes_the_worst_rho() -> None:
    inp = instance(7)
    best = max_rho(inp, FinishTimeFairness().allocate(inp))
    for name in ("las", "max_sum_throughput", "isolated"):
        assert best <= max_rho(inp, make_policy(name).allocate(inp)) + 1e-4
    # Sharing incentive: jobs that have not waited do no worse than an isolated 1/M share.
    fresh = dataclasses.replace(inp, times_since_start=np.zeros(inp.num_jobs))
    assert max_rho(fresh, FinishTimeFairness().allocate(fresh)) <= 1.0 + 1e-4


def cost_ratio(inp: PolicyInput, allocation: Allocation) -> float:
    best = inp.throughputs.max(axis=1)
    value = float((allocation.effective_throughputs(inp) / best).sum())
    spent = float((inp.scale_factors[:, None] * allocation.fractions * inp.costs).sum())
    return value / spent


def test_min_total_cost_buys_the_most_per_dollar() -> None:
    inp = instance(8)
    best = cost_ratio(inp, MinTotalCost().allocate(inp))
    for name in ("las", "max_sum_throughput", "makespan"):
        assert best >= cost_ratio(inp, make_policy(name).allocate(inp)) - 1e-4


def test_cost_with_slos_meets_every_deadline() -> None:
    base = instance(9, jobs=6)
    deadlines = np.full(6, math.inf)
    deadlines[:2] = base.steps_remaining[:2] / (base.throughputs[:2].max(axis=1) * 0.5)
    inp = PolicyInput.create(
        base.job_ids,
        TYPES,
        base.throughputs,
        base.num_workers,
        scale_factors=base.scale_factors,
        steps_remaining=base.steps_remaining,
        deadlines=deadlines,
        costs=base.costs,
    )
    rate = MinTotalCost(slos=True).allocate(inp).effective_throughputs(inp)
    need = base.steps_remaining[:2] / deadlines[:2]
    assert np.all(rate[:2] >= need * (1 - 1e-4))
    # Without SLOs the cheapest allocation ignores them (here: it is slower for job 0 or 1).
    free = MinTotalCost().allocate(inp).effective_throughputs(inp)
    assert np.any(free[:2] < need * (1 - 1e-3))


def test_shortest_job_gets_its_fastest_allocation() -> None:
    inp = instance(10)
    x = ShortestJobFirst().allocate(inp).fractions
    best_time = inp.steps_remaining / inp.throughputs.max(axis=1)
    shortest = int(np.argmin(best_time))
    rate = inp.throughputs[shortest] @ x[shortest]
    assert rate == pytest.approx(inp.throughputs[shortest].max(), rel=1e-6)


def test_fifo_lp_serves_the_oldest_job_on_its_fastest_type() -> None:
    inp = instance(11)
    x = Fifo().allocate(inp).fractions
    assert x[0, int(np.argmax(inp.throughputs[0]))] == pytest.approx(1.0, abs=1e-3)


def test_fifo_queue_is_sticky_and_strict() -> None:
    inp = PolicyInput.create(
        ["a", "b", "c"], ["v100"], [[1.0], [1.0], [1.0]], [2], scale_factors=[1, 2, 1]
    )
    strict = QueueFifo(heterogeneity_aware=True, reference_bookkeeping=False)
    x = strict.allocate(inp).fractions.ravel()
    # a fits; b (2 devices) does not fit beside it, and c may not pass b.
    assert x.tolist() == [1.0, 0.0, 0.0]
    held = PolicyInput.create(
        ["a", "b", "c"],
        ["v100"],
        [[1.0], [1.0], [1.0]],
        [2],
        scale_factors=[1, 2, 1],
        previous={"a": {"v100": 1.0}},
    )
    assert strict.allocate(held).fractions.ravel().tolist() == [1.0, 0.0, 0.0]
    done = PolicyInput.create(
        ["b", "c"],
        ["v100"],
        [[1.0], [1.0]],
        [2],
        scale_factors=[2, 1],
        previous={"a": {"v100": 1.0}},
    )
    assert strict.allocate(done).fractions.ravel().tolist() == [1.0, 0.0]
