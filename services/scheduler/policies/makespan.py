"""Minimize makespan (Gavel section 4.2): minimize max_m steps_m / throughput(m, X).

The objective is quasi-convex, not an LP as written; with u = 1 / makespan it
becomes one LP: maximize u subject to throughput(m, X) >= steps_m * u for every
job (Gavel's reference bisects on the makespan instead; the LP gives the same
optimum in one solve). Coefficients are rescaled by the longest isolated
duration so that u is of order 1.
"""

from __future__ import annotations

from typing import ClassVar

import cvxpy as cp
import numpy as np

from gearshift.scheduler.policies import solvers
from gearshift.scheduler.policies.base import (
    Allocation,
    Policy,
    PolicyInput,
    ProblemClass,
    scaled_throughputs,
    validity_constraints,
)


class Makespan(Policy):
    """The smallest time in which every active job can finish."""

    name: str = "makespan"
    problem_class: ClassVar[ProblemClass] = "lp"

    def solve(self, inp: PolicyInput) -> Allocation:
        steps = np.maximum(inp.steps_remaining, 1e-9)
        best = inp.throughputs.max(axis=1)
        runnable = best > 0
        scale = float(np.max(steps[runnable] / best[runnable])) if runnable.any() else 1.0
        x = cp.Variable((inp.num_jobs, inp.num_types))
        u = cp.Variable()
        rate = scaled_throughputs(x, inp.throughputs, scale / steps)
        constraints = validity_constraints(x, inp)
        if runnable.any():
            constraints.append(rate[np.flatnonzero(runnable)] >= u)
        solvers.solve(cp.Problem(cp.Maximize(u), constraints), "lp", what=self.name)
        return Allocation.singles(inp, np.asarray(x.value, dtype=np.float64))
