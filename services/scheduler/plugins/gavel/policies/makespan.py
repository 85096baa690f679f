"""Minimize makespan (Gavel section 4.2): minimize max_m steps_m / throughput(m, X).

The objective is quasi-convex, not an LP as written; with u = 1 / makespan it
becomes one LP: maximize u subject to throughput(m, X) >= steps_m * u for every
job (Gavel's reference bisects on the makespan instead; the LP gives the same
optimum in one solve). Coefficients are rescaled by the longest isolated
duration so that u is of order 1. Elastic: the same LP over configuration rows
(policies.configs), a job's fastest configuration setting its scale. With space
sharing (Gavel's `min_total_duration_packed`) the rows of X are job combinations
(base.Combos) and a job's throughput sums its share of each.
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


class Makespan(Policy):
    """The smallest time in which every active job can finish."""

    name: str = "makespan"
    problem_class: ClassVar[ProblemClass] = "lp"
    has_elastic_form: ClassVar[bool] = True

    def __init__(self, *, space_sharing: bool = False) -> None:
        self.space_sharing = space_sharing

    @staticmethod
    def _factor(inp: PolicyInput, best: FloatArray) -> tuple[FloatArray, IntArray]:
        """(scale / steps per job, runnable job indices)."""
        steps = np.maximum(inp.steps_remaining, 1e-9)
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
