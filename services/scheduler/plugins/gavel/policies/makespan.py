"""Minimize makespan (Gavel section 4.2): minimize max_m steps_m / throughput(m, X).

The objective is quasi-convex, not an LP as written; with u = 1 / makespan it
becomes one LP: maximize u subject to throughput(m, X) >= steps_m * u for every
job. Coefficients are rescaled by the longest isolated duration so that u is of
order 1. Elastic: the same LP over configuration rows (policies.configs), a job's
fastest configuration setting its scale. With space sharing (Gavel's
`min_total_duration_packed`) the rows of X are job combinations (base.Combos) and
a job's throughput sums its share of each.

`bisect=True` is Gavel's own procedure, which the packed form uses: Gavel bisects
on the makespan T (from [100 s, 10^6 s], a decade higher while nothing is
feasible) until the bounds are within 5%, and keeps the point its interior-point
solver returns for the last feasible T with no objective (a feasibility
problem), every pair of jobs a row even where the pair runs nowhere. That point
lies inside the feasible set, up to 5% slower than the optimum, with time spread
over many combinations, where the LP's answer sits on the optimal face; with
pairs the two pack very differently (-9.2% average JCT on Gavel's 59 one-device
jobs). Feasibility is monotone in T, so the bisection's end point follows from
the LP's optimum (`bisection_end`): one LP and one feasibility solve, not a
dozen.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gearshift.scheduler.plugins.gavel.policies import solvers
from gearshift.scheduler.plugins.gavel.policies.base import (
    Allocation,
    Combos,
    FloatArray,
    IntArray,
    Policy,
    PolicyInput,
    ProblemClass,
    scaled_throughputs,
    validity_constraints,
)
from gearshift.scheduler.plugins.gavel.policies.configs import ConfigProblem, ElasticAllocation
from gearshift.scheduler.plugins.gavel.policies.cvx import cp


def steps_of(inp: PolicyInput) -> FloatArray:
    """Steps left per job, never 0 (a finished job still has a row until it is removed)."""
    return np.maximum(inp.steps_remaining, 1e-9)


def bisection_end(
    optimum: float, low: float = 100.0, high: float = 1e6, tolerance: float = 1.05
) -> float:
    """The makespan Gavel's bisection settles on when every T >= `optimum` is feasible: halve
    [low, high] until high < tolerance x low, moving up a decade while nothing was feasible."""
    found = None
    while found is None:
        top = high
        while tolerance * low < high:
            middle = (low + high) / 2.0
            if middle >= optimum:
                found = high = middle
            else:
                low = middle
        low, high = top, top * 10.0
    return found


class Makespan(Policy):
    """The smallest time in which every active job can finish."""

    name: str = "makespan"
    problem_class: ClassVar[ProblemClass] = "lp"
    has_elastic_form: ClassVar[bool] = True

    def __init__(self, *, space_sharing: bool = False, bisect: bool = False) -> None:
        self.space_sharing = space_sharing
        self.bisect = bisect

    @staticmethod
    def _factor(inp: PolicyInput, best: FloatArray) -> tuple[FloatArray, IntArray]:
        """(scale / steps per job, runnable job indices)."""
        steps = steps_of(inp)
        runnable = best > 0
        scale = float(np.max(steps[runnable] / best[runnable])) if runnable.any() else 1.0
        return scale / steps, np.flatnonzero(runnable)

    def solve(self, inp: PolicyInput) -> Allocation:
        factor, runnable = self._factor(inp, inp.throughputs.max(axis=1))
        combos = Combos.build(inp, inp.throughputs, self.space_sharing)
        x = cp.Variable((len(combos.rows), inp.num_types))
        u = cp.Variable()
        rate = scaled_throughputs(x, inp.throughputs, factor, combos)
        constraints = validity_constraints(x, inp, combos)
        if runnable.size:
            constraints.append(rate[runnable] >= u)
        solvers.solve(cp.Problem(cp.Maximize(u), constraints), "lp", what=self.name)
        if self.bisect and runnable.size and float(u.value) > 0:
            # rate_m * factor_m >= u with factor = scale / steps: the makespan is scale / u.
            scale = float(np.max(factor * steps_of(inp)))
            return self._feasible_point(inp, runnable, scale / float(u.value))
        return combos.allocation(inp, np.asarray(x.value, dtype=np.float64))

    def _feasible_point(self, inp: PolicyInput, runnable: IntArray, optimum: float) -> Allocation:
        """The interior point for Gavel's last feasible makespan (see the module docstring)."""
        combos = Combos.build(inp, inp.throughputs, self.space_sharing, every_pair=True)
        x = cp.Variable((len(combos.rows), inp.num_types))
        rate = scaled_throughputs(x, inp.throughputs, np.ones(inp.num_jobs), combos)
        due = steps_of(inp) / bisection_end(optimum)
        constraints = [*validity_constraints(x, inp, combos), rate[runnable] >= due[runnable]]
        solvers.solve(cp.Problem(cp.Minimize(0), constraints), "lp", what=self.name)
        return combos.allocation(inp, np.asarray(x.value, dtype=np.float64))

    def solve_elastic(self, inp: PolicyInput) -> ElasticAllocation:
        assert inp.configs is not None
        factor, runnable = self._factor(inp, inp.configs.best_rates(inp.num_jobs))
        problem = ConfigProblem(inp.num_jobs, inp.num_workers, inp.configs)
        u = cp.Variable()
        rate = problem.throughput(factor)
        constraints = [*problem.validity(), rate[runnable] >= u]
        solvers.solve(cp.Problem(cp.Maximize(u), constraints), "lp_vertex", what=self.name)
        return problem.allocation(inp.job_ids, inp.worker_types)
