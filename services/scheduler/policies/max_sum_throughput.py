"""Maximize total throughput (Gavel section 4.2): maximize sum_m throughput(m, X). LP.

Throughputs are summed as measured (steps/s), as in the paper and Gavel's
`max_sum_throughput_perf`; jobs whose steps are cheap therefore weigh more.
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


class MaxSumThroughput(Policy):
    """max sum_m throughput(m, X) subject to the validity constraints."""

    name: str = "max_sum_throughput"
    problem_class: ClassVar[ProblemClass] = "lp"

    def solve(self, inp: PolicyInput) -> Allocation:
        x = cp.Variable((inp.num_jobs, inp.num_types))
        total = cp.sum(scaled_throughputs(x, inp.throughputs, np.ones(inp.num_jobs)))
        solvers.solve(
            cp.Problem(cp.Maximize(total), validity_constraints(x, inp)), "lp", what=self.name
        )
        return Allocation.singles(inp, np.asarray(x.value, dtype=np.float64))
