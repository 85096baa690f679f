"""Finish-time fairness (Themis; Gavel section 4.2): minimize max_m rho(m, X), with

    rho(m, X) = (t_m + steps_m / throughput(m, X)) / (t_m + steps_m / throughput(m, X_iso)),

t_m the time since the job arrived and X_iso the isolated share (1/M of the
cluster). The denominator is a constant and steps / throughput is convex in X
(inv_pos of an affine function), so the problem is convex as written: minimize r
subject to (t_m + steps_m * inv_pos(throughput(m, X))) / D_m <= r. It needs the
conic solver (inv_pos becomes second-order cones). Heterogeneity-agnostic:
every throughput set to 1.
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
    job_speed_matrix,
    scaled_throughputs,
    validity_constraints,
)
from gearshift.scheduler.policies.isolated import isolated_share


class FinishTimeFairness(Policy):
    """min max rho; see the module docstring."""

    name: str = "finish_time_fairness"
    problem_class: ClassVar[ProblemClass] = "conic"

    def __init__(self, *, heterogeneity_aware: bool = True) -> None:
        self.heterogeneity_aware = heterogeneity_aware

    def solve(self, inp: PolicyInput) -> Allocation:
        speeds = job_speed_matrix(inp, self.heterogeneity_aware)
        iso = np.maximum((speeds * isolated_share(inp)).sum(axis=1), 1e-12)
        steps = np.maximum(inp.steps_remaining, 0.0)
        elapsed = np.maximum(inp.times_since_start, 0.0)
        denom = elapsed + steps / iso
        runnable = np.flatnonzero((speeds.sum(axis=1) > 0) & (denom > 0))
        x = cp.Variable((inp.num_jobs, inp.num_types))
        r = cp.Variable()
        constraints = validity_constraints(x, inp)
        if runnable.size:
            rate = scaled_throughputs(x, speeds, np.ones(inp.num_jobs))[runnable]
            d = denom[runnable]
            constraints.append(
                elapsed[runnable] / d + cp.multiply(steps[runnable] / d, cp.inv_pos(rate)) <= r
            )
        solvers.solve(cp.Problem(cp.Minimize(r), constraints), "conic", what=self.name)
        return Allocation.singles(inp, np.asarray(x.value, dtype=np.float64))
