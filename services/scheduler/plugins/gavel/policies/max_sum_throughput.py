"""Maximize total throughput (Gavel section 4.2): maximize sum_m throughput(m, X). LP.

Throughputs are summed as measured (steps/s), as in the paper and Gavel's
`max_sum_throughput_perf`; jobs whose steps are cheap therefore weigh more.
Elastic: the same sum over configuration rows (policies.configs).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gearshift.scheduler.plugins.gavel.policies import solvers
from gearshift.scheduler.plugins.gavel.policies.base import (
    Allocation,
    Policy,
    PolicyInput,
    ProblemClass,
    scaled_throughputs,
    validity_constraints,
)
from gearshift.scheduler.plugins.gavel.policies.configs import ConfigProblem, ElasticAllocation
from gearshift.scheduler.plugins.gavel.policies.cvx import cp


class MaxSumThroughput(Policy):
    """max sum_m throughput(m, X) subject to the validity constraints."""

    name: str = "max_sum_throughput"
    problem_class: ClassVar[ProblemClass] = "lp"
    has_elastic_form: ClassVar[bool] = True

    def solve(self, inp: PolicyInput) -> Allocation:
        x = cp.Variable((inp.num_jobs, inp.num_types))
        total = cp.sum(scaled_throughputs(x, inp.throughputs, np.ones(inp.num_jobs)))
        solvers.solve(
            cp.Problem(cp.Maximize(total), validity_constraints(x, inp)), "lp", what=self.name
        )
        return Allocation.singles(inp, np.asarray(x.value, dtype=np.float64))

    def solve_elastic(self, inp: PolicyInput) -> ElasticAllocation:
        assert inp.configs is not None
        problem = ConfigProblem(inp.num_jobs, inp.num_workers, inp.configs)
        total = cp.sum(problem.throughput())
        solvers.solve(
            cp.Problem(cp.Maximize(total), problem.validity()), "lp_vertex", what=self.name
        )
        return problem.allocation(inp.job_ids, inp.worker_types)
