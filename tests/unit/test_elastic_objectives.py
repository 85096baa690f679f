"""Every elastic objective on a case small enough to solve by hand (issue 48 point 5), and the
refusals: the objectives without an elastic form, and space sharing with an elastic one.

Each case writes its configuration rows out (devices -> steps/s), so the optimum in the
docstring follows from the rows alone, not from the EST planner's predictions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from gearshift.common.errors import ValidationError
from gearshift.scheduler.plugins.allocators import make_allocator
from gearshift.scheduler.plugins.gavel.policies import elastic_refusal, make_policy, policy_names
from gearshift.scheduler.plugins.gavel.policies.base import PolicyInput
from gearshift.scheduler.plugins.gavel.policies.configs import Configurations, ElasticAllocation
from gearshift.scheduler.plugins.registry import Point, plugin
from gearshift.scheduler.types import config_of

Rows = Sequence[tuple[Mapping[str, int], float]]


def elastic_input(
    capacity: Mapping[str, int], jobs: Mapping[str, Rows], **extra: object
) -> PolicyInput:
    """An elastic input from each job's rows; a job's one-device rate on a type is its
    one-device row there (0 without one), its most devices its largest row."""
    types = sorted(capacity)
    per_job = [[(config_of(dict(c)), r) for c, r in rows] for rows in jobs.values()]
    one = [
        [next((r for c, r in rows if dict(c) == {t: 1}), 0.0) for t in types]
        for rows in jobs.values()
    ]
    most = [max(sum(c.values()) for c, _ in rows) for rows in jobs.values()]
    return PolicyInput.create(
        list(jobs),
        types,
        one,
        [capacity[t] for t in types],
        configs=Configurations.build(types, per_job),
        max_devices=most,
        **extra,  # type: ignore[arg-type]
    )


def rates(inp: PolicyInput, result: ElasticAllocation) -> dict[str, float]:
    """Each job's steps/s under `result`."""
    assert inp.configs is not None
    x = np.array(
        [
            result.shares[inp.job_ids[int(m)]].get(c, 0.0)
            for m, c in zip(inp.configs.job, inp.configs.configs, strict=True)
        ]
    )
    return dict(zip(inp.job_ids, inp.configs.throughputs(x, inp.num_jobs), strict=True))


def used(result: ElasticAllocation, kind: str) -> float:
    return sum(d[kind] for d in result.device_shares().values())


LINEAR3 = [({"v100": 1}, 1.0), ({"v100": 2}, 2.0), ({"v100": 3}, 3.0)]
LINEAR2 = [({"v100": 1}, 1.0), ({"v100": 2}, 2.0)]
ONE = [({"v100": 1}, 1.0)]


def test_max_sum_throughput_by_hand() -> None:
    """3 V100s. a scales 1, 2 then 2.4 steps/s on 1, 2, 3 devices; b runs on one at 1.
    Steps/s per device: a's 3-device row 0.8, every other row 1. The sum is at most 3
    (3 devices at 1 per device), reached only without a's 3-device row: a on 2, b on 1."""
    a = [({"v100": 1}, 1.0), ({"v100": 2}, 2.0), ({"v100": 3}, 2.4)]
    inp = elastic_input({"v100": 3}, {"a": a, "b": ONE})
    result = make_policy("max_sum_throughput").allocate_elastic(inp)
    got = rates(inp, result)
    assert sum(got.values()) == pytest.approx(3.0, abs=1e-5)
    assert got == pytest.approx({"a": 2.0, "b": 1.0}, abs=1e-5)
    assert result.shares["a"] == pytest.approx({config_of({"v100": 2}): 1.0}, abs=1e-5)


def test_makespan_by_hand() -> None:
    """3 V100s. a has 1,200 steps and scales linearly to 3 devices; b has 300 steps on one.
    1,500 device-seconds of work on 3 devices end no sooner than 500 s, and 500 s is
    reached: a at 2.4 steps/s, b at 0.6 (2.4 + 0.6 = 3 devices), both done at 500 s."""
    inp = elastic_input({"v100": 3}, {"a": LINEAR3, "b": ONE}, steps_remaining=[1200, 300])
    got = rates(inp, make_policy("makespan").allocate_elastic(inp))
    assert max(1200 / got["a"], 300 / got["b"]) == pytest.approx(500.0, rel=1e-4)
    assert got == pytest.approx({"a": 2.4, "b": 0.6}, abs=1e-4)


def test_finish_time_fairness_by_hand() -> None:
    """3 V100s, 300 steps each; a scales linearly to 3 devices, b to 2; b has waited 150 s.
    Isolated share: 3/2 devices each (within both maxima), 1.5 steps/s, so each
    denominator is 300 / 1.5 = 200 s (no isolated time accrued yet). rho_a = 1.5 / r_a,
    rho_b = (150 + 300 / r_b) / 200 = 0.75 + 1.5 / r_b, with r_a + r_b <= 3 and r_b <= 2.
    At r_a = 1, r_b = 2 both are 1.5; any other split raises one of them: min max = 1.5."""
    inp = elastic_input(
        {"v100": 3},
        {"a": LINEAR3, "b": LINEAR2},
        steps_remaining=[300, 300],
        times_since_start=[0, 150],
    )
    got = rates(inp, make_policy("finish_time_fairness").allocate_elastic(inp))
    assert got == pytest.approx({"a": 1.0, "b": 2.0}, abs=1e-3)
    rho = max(1.5 / got["a"], 0.75 + 1.5 / got["b"])
    assert rho == pytest.approx(1.5, rel=1e-3)


COST_ROWS = {
    # a: 1 step/s on one K80, 1.5 on two, 2 on a V100 (its best: normalized by 2).
    "a": [({"k80": 1}, 1.0), ({"k80": 2}, 1.5), ({"v100": 1}, 2.0)],
    # b: 0.5 on a K80, 1 on a V100 (its best).
    "b": [({"k80": 1}, 0.5), ({"v100": 1}, 1.0)],
}
PRICES = [1.0, 3.0]  # k80, v100 ($ per device-hour; types sorted)


def test_min_total_cost_by_hand() -> None:
    """1 V100 ($3/h), 2 K80s ($1/h). Normalized throughput per dollar of each row: a on a
    K80 (1/2) / 1 = 0.5, a on two K80s (1.5/2) / 2 = 0.375, a on the V100 (2/2) / 3 =
    0.33; b on a K80 (0.5/1) / 1 = 0.5, b on the V100 1/3. A ratio of sums is at most its
    best term: 0.5, reached with the K80 rows only and the V100 left idle."""
    inp = elastic_input({"v100": 1, "k80": 2}, COST_ROWS, costs=PRICES)
    result = make_policy("min_total_cost").allocate_elastic(inp)
    got = rates(inp, result)
    normalized = got["a"] / 2.0 + got["b"] / 1.0
    dollars = used(result, "k80") * 1.0 + used(result, "v100") * 3.0
    assert dollars > 0
    assert normalized / dollars == pytest.approx(0.5, rel=1e-4)
    assert used(result, "v100") == pytest.approx(0.0, abs=1e-6)
    assert result.shares["a"].get(config_of({"k80": 2}), 0.0) == pytest.approx(0.0, abs=1e-6)


def test_min_total_cost_with_slos_by_hand() -> None:
    """The same cluster and rows; b must do 100 steps in 100 s, which only the V100 does
    (1 step/s), so b takes it whole: normalized 1 for $3. a adds a K80 (0.5 for $1, better
    than the running 1/3): (1 + 0.5) / (3 + 1) = 0.375. Trading that K80 for two
    ((1 + 0.75 z + 0.5 (1 - z)) / (4 + z)) only lowers it: optimum 0.375, a on one K80."""
    inp = elastic_input(
        {"v100": 1, "k80": 2},
        COST_ROWS,
        costs=PRICES,
        steps_remaining=[1e6, 100],
        deadlines=[float("inf"), 100.0],
    )
    result = make_policy("min_total_cost_slo").allocate_elastic(inp)
    got = rates(inp, result)
    assert got["b"] == pytest.approx(1.0, abs=1e-5)  # the SLO: 100 steps in 100 s
    assert result.shares["a"] == pytest.approx({config_of({"k80": 1}): 1.0}, abs=1e-5)
    normalized = got["a"] / 2.0 + got["b"] / 1.0
    dollars = used(result, "k80") * 1.0 + used(result, "v100") * 3.0
    assert normalized / dollars == pytest.approx(0.375, rel=1e-4)


def test_hierarchical_by_hand() -> None:
    """4 V100s; tenant A (weight 3) has a, which runs on 1 device at most; tenant B (weight
    1) has b1 and b2 (fairness inside, 0.5 each), up to 4 devices each, every row 1 step/s
    per device. Iteration 1 raises t with a >= 3t, b1, b2 >= t/2: a's one device stops it
    at t = 1/3 (a = 1, b1 = b2 = 1/6), and a is frozen. Iteration 2 raises b1 and b2 alike
    over the 3 devices left: 1.5 each."""
    four = [({"v100": k}, float(k)) for k in range(1, 5)]
    inp = elastic_input(
        {"v100": 4},
        {"a": ONE, "b1": four, "b2": four},
        entities=["A", "B", "B"],
        entity_weights={"A": 3.0, "B": 1.0},
    )
    got = rates(inp, make_policy("hierarchical").allocate_elastic(inp))
    assert got == pytest.approx({"a": 1.0, "b1": 1.5, "b2": 1.5}, abs=1e-3)


def test_fifo_lp_by_hand() -> None:
    """2 V100s; a, b, c arrive in that order (weights 3/3, 2/3, 1/3); a runs on 1 device,
    b and c on 1 or 2 at 1 step/s per device (best 2). Value of a device: a 1 x 1/1 = 1,
    b 2/3 x 1/2 = 1/3, c 1/3 x 1/2 = 1/6. a takes one device, b the other, c waits."""
    inp = elastic_input({"v100": 2}, {"a": ONE, "b": LINEAR2, "c": LINEAR2})
    got = rates(inp, make_policy("fifo_lp").allocate_elastic(inp))
    assert got == pytest.approx({"a": 1.0, "b": 1.0, "c": 0.0}, abs=1e-5)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("fifo", "fifo_lp"),
        ("fifo_perf", "fifo_lp"),
        ("fifo_strict", "fifo_lp"),
        ("sjf", "fractional knapsack"),
        ("isolated", "yardstick"),
        ("fifo_packed", "fifo_lp"),
        ("allox", "one-device"),
    ],
)
def test_objectives_without_an_elastic_form_are_refused_with_the_reason(
    name: str, reason: str
) -> None:
    why = elastic_refusal(name)
    assert why is not None and "has no elastic form" in why and reason in why
    with pytest.raises(ValidationError, match=reason):
        make_allocator(name, elastic=True)
    entry = plugin(Point.ALLOCATE, name)
    assert entry is not None
    assert entry.refuse(entry.args.model_validate({"elastic": True})) == why


@pytest.mark.parametrize(
    "name",
    [
        "las_packed",
        "max_min_fairness_packed",
        "makespan_packed",
        "min_total_duration_packed",
        "max_sum_throughput_packed",
        "finish_time_fairness_packed",
    ],
)
def test_space_sharing_with_an_elastic_objective_is_refused_naming_both(name: str) -> None:
    """Before, make_allocator built an elastic LAS that silently dropped the pairs."""
    why = elastic_refusal(name)
    assert why is not None and "space sharing" in why and "elastic" in why and name in why
    with pytest.raises(ValidationError, match="space sharing"):
        make_allocator(name, elastic=True)
    entry = plugin(Point.ALLOCATE, name)
    assert entry is not None
    assert entry.refuse(entry.args.model_validate({"elastic": True})) == why
    assert entry.refuse(entry.args.model_validate({"elastic": False})) is None


def test_every_other_objective_has_an_elastic_form() -> None:
    elastic = {n for n in policy_names() if elastic_refusal(n) is None}
    assert {
        "las",
        "finish_time_fairness",
        "makespan",
        "max_sum_throughput",
        "min_total_cost",
        "min_total_cost_slo",
        "hierarchical",
        "fifo_lp",
    } <= elastic
    assert not {"fifo", "fifo_perf", "fifo_strict", "sjf", "isolated", "las_packed"} & elastic
