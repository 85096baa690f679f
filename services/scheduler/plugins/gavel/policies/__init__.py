"""Gavel's scheduling policies, one module each, behind one interface (base.Policy).

`make_policy(name)` accepts Gearshift's names and the reference
implementation's (`max_min_fairness`, `max_min_fairness_perf`, `fifo`,
`finish_time_fairness_perf`, `min_total_duration`, ...), so Gavel users can
switch. In Gavel's naming a bare name is heterogeneity-agnostic and `_perf` is
heterogeneity-aware; `_packed` adds space sharing.
"""

from __future__ import annotations

from collections.abc import Callable

from gearshift.common.errors import ValidationError
from gearshift.scheduler.plugins.gavel.policies.allox import AlloX
from gearshift.scheduler.plugins.gavel.policies.base import (
    Allocation,
    Policy,
    PolicyError,
    PolicyInput,
)
from gearshift.scheduler.plugins.gavel.policies.cvx import load_cvxpy
from gearshift.scheduler.plugins.gavel.policies.fifo import Fifo, QueueFifo
from gearshift.scheduler.plugins.gavel.policies.fifo_packed import PackedFifo
from gearshift.scheduler.plugins.gavel.policies.finish_time_fairness import FinishTimeFairness
from gearshift.scheduler.plugins.gavel.policies.gandiva import Gandiva
from gearshift.scheduler.plugins.gavel.policies.isolated import Isolated
from gearshift.scheduler.plugins.gavel.policies.makespan import Makespan
from gearshift.scheduler.plugins.gavel.policies.max_min_fairness import MaxMinFairness
from gearshift.scheduler.plugins.gavel.policies.max_sum_throughput import MaxSumThroughput
from gearshift.scheduler.plugins.gavel.policies.min_total_cost import MinTotalCost
from gearshift.scheduler.plugins.gavel.policies.shortest_job_first import ShortestJobFirst
from gearshift.scheduler.plugins.gavel.policies.water_filling import WaterFilling

__all__ = [
    "Allocation",
    "Policy",
    "PolicyError",
    "PolicyInput",
    "describe",
    "elastic_refusal",
    "make_policy",
    "policy_names",
    "traits",
]

Factory = Callable[[int], Policy]

_POLICIES: dict[str, tuple[Factory, str]] = {
    # Gearshift names.
    "las": (lambda s: MaxMinFairness(), "LAS / max-min fairness, heterogeneity-aware"),
    "las_agnostic": (
        lambda s: MaxMinFairness(heterogeneity_aware=False),
        "LAS, heterogeneity-agnostic (every type alike)",
    ),
    "las_packed": (
        lambda s: MaxMinFairness(space_sharing=True),
        "LAS, heterogeneity-aware, with space sharing (pairs of jobs on a device)",
    ),
    "max_sum_throughput": (lambda s: MaxSumThroughput(), "maximize total throughput"),
    "max_sum_throughput_packed": (
        lambda s: MaxSumThroughput(space_sharing=True),
        "maximize total throughput, with space sharing (pairs of jobs on a device)",
    ),
    "finish_time_fairness_packed": (
        lambda s: FinishTimeFairness(space_sharing=True),
        "Gavel: finish-time fairness, heterogeneity-aware, with space sharing",
    ),
    "makespan_packed": (
        lambda s: Makespan(space_sharing=True, bisect=True),
        "minimize the time to finish every active job, with space sharing (Gavel's "
        "bisection: a feasible point within 5% of the optimum)",
    ),
    "finish_time_fairness": (
        lambda s: FinishTimeFairness(),
        "finish-time fairness (Themis), heterogeneity-aware",
    ),
    "makespan": (lambda s: Makespan(), "minimize the time to finish every active job"),
    "fifo_lp": (lambda s: Fifo(), "FIFO as the paper's LP, heterogeneity-aware"),
    "fifo_strict": (
        lambda s: QueueFifo(seed=s, reference_bookkeeping=False),
        "FIFO queue, random type with room, strict order",
    ),
    "sjf": (lambda s: ShortestJobFirst(), "shortest job first (lexicographic)"),
    "min_total_cost": (lambda s: MinTotalCost(), "most normalized throughput per dollar"),
    "min_total_cost_slo": (lambda s: MinTotalCost(slos=True), "min total cost subject to SLOs"),
    "hierarchical": (
        lambda s: WaterFilling(),
        "hierarchical max-min fairness by water filling (entities, fairness or FIFO inside)",
    ),
    # The reference implementation's names.
    "max_min_fairness_water_filling": (
        lambda s: WaterFilling(heterogeneity_aware=False),
        "Gavel: water-filling max-min fairness, heterogeneity-agnostic",
    ),
    "fifo": (lambda s: QueueFifo(seed=s), "Gavel: FIFO queue, heterogeneity-agnostic"),
    "fifo_perf": (
        lambda s: QueueFifo(heterogeneity_aware=True, seed=s),
        "Gavel: FIFO queue on the fastest type with room",
    ),
    "finish_time_fairness_agnostic": (
        lambda s: FinishTimeFairness(heterogeneity_aware=False),
        "finish-time fairness, heterogeneity-agnostic",
    ),
    "isolated": (lambda s: Isolated(), "Gavel: equal share of every type"),
    "fifo_packed": (
        lambda s: PackedFifo(),
        "Gavel: FIFO queue on the fastest type with room, waiting jobs paired with placed "
        "ones (space sharing)",
    ),
    "max_sum_throughput_normalized_by_cost_packed_SLOs": (
        lambda s: MaxSumThroughput(space_sharing=True, per_dollar=True, slos=True),
        "Gavel: steps/s per dollar summed, with space sharing, every job kept on pace for "
        "its SLO while all can be (Gavel's code, not the paper's cost ratio)",
    ),
    "gandiva": (
        lambda s: Gandiva(seed=s),
        "Gavel's Gandiva baseline: random pairs of jobs share devices while their "
        "normalized throughput is at least 1, the cluster split equally (space sharing)",
    ),
    "allox": (
        lambda s: AlloX(),
        "Gavel's AlloX baseline: one-device jobs matched to devices, least total "
        "completion time (Hungarian method)",
    ),
}
# The reference implementation's names for the policies above: one policy, two names.
_ALIASES: dict[str, str] = {
    "max_min_fairness": "las_agnostic",
    "max_min_fairness_perf": "las",
    "max_min_fairness_packed": "las_packed",
    "max_min_fairness_water_filling_perf": "hierarchical",
    "finish_time_fairness_perf": "finish_time_fairness",
    "max_sum_throughput_perf": "max_sum_throughput",
    "max_sum_throughput_normalized_by_cost_perf": "min_total_cost",
    "max_sum_throughput_normalized_by_cost_perf_SLOs": "min_total_cost_slo",
    "min_total_duration": "makespan",
    "min_total_duration_perf": "makespan",
    "min_total_duration_packed": "makespan_packed",
}
# Gavel's `finish_time_fairness` is its agnostic variant; Gearshift's bare name is the
# heterogeneity-aware one, and the agnostic one is spelled out. Elastic modes
# (`easyscale`, `yarn_cs`) are chosen with the simulator's --elastic flag.


def policy_names() -> list[str]:
    return sorted([*_POLICIES, *_ALIASES])


def _factory(name: str) -> Factory:
    """The factory behind `name` or behind the name it is an alias of (KeyError: neither)."""
    return _POLICIES[_ALIASES.get(name, name)][0]


def describe(name: str) -> str:
    target = _ALIASES.get(name)
    if target is not None:
        return f"Gavel's name for {target}: {_POLICIES[target][1]}"
    return _POLICIES[name][1]


def traits(name: str) -> tuple[bool, bool]:
    """(has an elastic form, shares devices) of the policy called `name`, without loading
    cvxpy: the plugin registry reads them when it is imported."""
    policy = _factory(name)(0)
    return policy.has_elastic_form, bool(getattr(policy, "space_sharing", False))


def elastic_refusal(name: str) -> str | None:
    """Why the policy called `name` cannot allocate elastic jobs (None: it can): the one
    message the plugin registry and make_allocator both give, naming the policy and the
    elastic mode."""
    policy = _factory(name)(0)
    if not policy.has_elastic_form:
        return f"{name!r} has no elastic form: {policy.no_elastic_form_because}"
    if getattr(policy, "space_sharing", False):
        return (
            f"{name!r} shares devices (space sharing) and elastic allocation does not: "
            "elastic rows are one job's configurations of whole devices, and pairs are "
            "measured only at one equal scale factor, so the two do not compose; share "
            f"devices with elastic: false, or choose {name.removesuffix('_packed')!r} to be "
            "elastic"
        )
    return None


def make_policy(name: str, *, seed: int = 0, field: str = "policy") -> Policy:
    """The policy called `name`; ValidationError (naming `field`) lists the known names."""
    if _ALIASES.get(name, name) not in _POLICIES:
        known = ", ".join(policy_names())
        raise ValidationError(field, f"unknown policy {name!r}; one of: {known}")
    policy = _factory(name)(seed)
    policy.name = name
    if policy.problem_class != "greedy":
        # cvxpy is a lazy module (policies.cvx): load it here, in the thread that makes the
        # policy, since a lazy module's first load is not thread-safe before Python 3.12.3.
        load_cvxpy()
    return policy
