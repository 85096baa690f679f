"""Least attained service / max-min fairness, weighted (Gavel section 4.1).

Heterogeneity-aware: maximize min_m  throughput(m, X) / throughput(m, X_equal)
* scale_factor[m] / w_m, where X_equal gives every job each type in proportion to
its count. Multiplying by the scale factor makes a job on k devices count k
times its time (a 1-device job gets k times the time of a k-device job of
equal speed). Heterogeneity-agnostic (the LAS baseline): the same problem with
every throughput set to 1, i.e. max-min over time shares. With space sharing
the rows of X are job combinations (singles and equal-scale-factor pairs) and a
job's throughput sums its share of each combination.

min() of linear functions is concave but not an LP objective as written; the
solved LP is the standard epigraph form: maximize t subject to
scaled_throughput(m, X) >= t for every m, plus the validity constraints.
Without space sharing, interchangeable jobs share a row (base.Groups).
"""

from __future__ import annotations

from typing import ClassVar

import cvxpy as cp
import numpy as np

from gearshift.scheduler.policies import solvers
from gearshift.scheduler.policies.base import (
    Allocation,
    Combos,
    FloatArray,
    Groups,
    Policy,
    PolicyInput,
    ProblemClass,
    grouped_validity,
    job_speed_matrix,
    scaled_throughputs,
    validity_constraints,
)


def fairness_factors(inp: PolicyInput, speeds: FloatArray, weights: FloatArray) -> FloatArray:
    """scale_factor / (w * throughput(m, X_equal)): what turns throughput into the LAS metric."""
    base = inp.equal_share_throughputs(speeds)
    return np.where(weights > 0, inp.scale_factors / (np.maximum(weights, 1e-12) * base), 0.0)


class MaxMinFairness(Policy):
    """LAS over X; see the module docstring for the formulation."""

    name: str = "las"
    problem_class: ClassVar[ProblemClass] = "lp"

    def __init__(self, *, heterogeneity_aware: bool = True, space_sharing: bool = False) -> None:
        self.heterogeneity_aware = heterogeneity_aware
        self.space_sharing = space_sharing

    def solve(self, inp: PolicyInput) -> Allocation:
        speeds = job_speed_matrix(inp, self.heterogeneity_aware)
        if not self.space_sharing:
            return self._solve_grouped(inp, speeds)
        combos = Combos.build(inp, speeds, self.space_sharing and self.heterogeneity_aware)
        factor = fairness_factors(inp, speeds, inp.priority_weights)
        x = cp.Variable((len(combos.rows), inp.num_types))
        t = cp.Variable()
        runnable = (speeds.sum(axis=1) > 0) & (inp.priority_weights > 0)
        score = scaled_throughputs(x, speeds, factor, combos)
        constraints = validity_constraints(x, inp, combos)
        if runnable.any():
            constraints.append(score[np.flatnonzero(runnable)] >= t)
        solvers.solve(cp.Problem(cp.Maximize(t), constraints), "lp", what=self.name)
        value = np.asarray(x.value, dtype=np.float64)
        return combos.allocation(inp, value)

    def _solve_grouped(self, inp: PolicyInput, speeds: FloatArray) -> Allocation:
        factor = fairness_factors(inp, speeds, inp.priority_weights)
        groups = Groups.build(
            [
                (tuple(speeds[i]), inp.scale_factors[i], inp.priority_weights[i])
                for i in range(inp.num_jobs)
            ]
        )
        rows = groups.first
        x = cp.Variable((len(groups), inp.num_types))
        t = cp.Variable()
        score = cp.sum(cp.multiply(speeds[rows] * factor[rows, None], x), axis=1)
        runnable = (speeds[rows].sum(axis=1) > 0) & (inp.priority_weights[rows] > 0)
        constraints = grouped_validity(x, inp, groups)
        if runnable.any():
            constraints.append(score[np.flatnonzero(runnable)] >= t)
        solvers.solve(cp.Problem(cp.Maximize(t), constraints), "lp", what=self.name)
        value = groups.expand(np.asarray(x.value, dtype=np.float64), inp.num_jobs)
        return Allocation.singles(inp, value)
