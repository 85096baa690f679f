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

Elastic (policies.configs): the same max-min over configuration rows, a job's
level being throughput(m, x) / (w_m * its rate on an equal share of ONE device),
the equal share weighting each type by its count - for a rigid job exactly
Gavel's level. Max-min fixes only the lowest level, and a vertex may leave
devices idle that nobody's minimum needs, so a second LP keeps every level at
least `fair_share` x t* (`LasShares`) and, among those allocations, spends the
rest (`surplus`):
- "speedup" (the default profile's): Sia's normalized goodput (policies.speedup),
  so that devices go by each job's speedup over its own baseline - types by
  comparative advantage across jobs. With `fair_share` 0.8 it lowered the average
  JCT on Sia's Philly workloads from 0.787 to 0.695 h and on Gavel's and the
  generated traces by 1-4%, with fewer rescales (docs/results/sia.md);
- "shortest": sum_m throughput(m, x) / steps_m - the rates at which the jobs
  approach their ends - so that it goes where it shortens jobs most (on Gavel's
  traces this lowers both the average JCT and the worst finish-time-fairness ratio
  against the sum of levels).
With `fair_share` 0 the first LP is skipped: the objective is Sia's alone.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gearshift.scheduler.plugins.gavel.policies import solvers
from gearshift.scheduler.plugins.gavel.policies.base import (
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
from gearshift.scheduler.plugins.gavel.policies.configs import (
    ConfigProblem,
    ElasticAllocation,
    row_signatures,
)
from gearshift.scheduler.plugins.gavel.policies.cvx import cp
from gearshift.scheduler.plugins.gavel.policies.speedup import speedup_values
from gearshift.scheduler.types import LasShares


def fairness_factors(inp: PolicyInput, speeds: FloatArray, weights: FloatArray) -> FloatArray:
    """scale_factor / (w * throughput(m, X_equal)): what turns throughput into the LAS metric."""
    base = inp.equal_share_throughputs(speeds)
    return np.where(weights > 0, inp.scale_factors / (np.maximum(weights, 1e-12) * base), 0.0)


class MaxMinFairness(Policy):
    """LAS over X; see the module docstring for the formulation."""

    name: str = "las"
    problem_class: ClassVar[ProblemClass] = "lp"
    has_elastic_form: ClassVar[bool] = True

    def __init__(
        self,
        *,
        heterogeneity_aware: bool = True,
        space_sharing: bool = False,
        shares: LasShares | None = None,
    ) -> None:
        self.heterogeneity_aware = heterogeneity_aware
        self.space_sharing = space_sharing
        self.shares = shares or LasShares()

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

    def solve_elastic(self, inp: PolicyInput) -> ElasticAllocation:
        configs = inp.configs
        assert configs is not None
        speeds = job_speed_matrix(inp, self.heterogeneity_aware)
        factor = fairness_factors(inp, speeds, inp.priority_weights)
        signatures = row_signatures(configs, inp.num_jobs)
        problem = ConfigProblem(
            inp.num_jobs,
            inp.num_workers,
            configs,
            group_keys=[(sig, float(f)) for sig, f in zip(signatures, factor, strict=True)],
        )
        level = problem.throughput(factor)
        best = configs.best_rates(inp.num_jobs)[problem.first]
        runnable = np.flatnonzero((best > 0) & (factor[problem.first] > 0))
        validity = problem.validity()
        if runnable.size == 0:
            return ElasticAllocation.empty(inp.worker_types, inp.job_ids)
        floor: list[cp.Constraint] = []
        if self.shares.fair_share > 0:
            t = cp.Variable()
            solvers.solve(
                cp.Problem(cp.Maximize(t), [*validity, level[runnable] >= t]),
                "lp_vertex",
                what=self.name,
            )
            floor = [level[runnable] >= float(t.value) * (1 - 1e-6) * self.shares.fair_share]
        solvers.solve(
            cp.Problem(cp.Maximize(self._surplus(inp, problem, runnable)), [*validity, *floor]),
            "lp_vertex",
            what=f"{self.name} (second stage)",
        )
        return problem.allocation(inp.job_ids, inp.worker_types)

    def _surplus(
        self, inp: PolicyInput, problem: ConfigProblem, runnable: np.ndarray
    ) -> cp.Expression:
        """What the second LP maximizes over the groups that may run (module docstring)."""
        if self.shares.surplus == "speedup":
            value = speedup_values(problem, inp.priority_weights)
            return np.where(np.isin(problem.row_group, runnable), value, 0.0) @ problem.x
        # Members of a group share their rows, so a group's term is its rate times the sum of
        # its members' 1 / steps left (scaled by the longest job, for the solver).
        steps = np.maximum(inp.steps_remaining, 1e-9)
        inverse = steps.max() / steps
        weight = np.array([inverse[list(members)].sum() for members in problem.members])
        return weight[runnable] @ problem.throughput()[runnable]
