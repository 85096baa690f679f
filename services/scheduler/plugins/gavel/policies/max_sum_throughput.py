"""Maximize total throughput (Gavel section 4.2): maximize sum_m throughput(m, X). LP.

Throughputs are summed as measured (steps/s), as in the paper and Gavel's
`max_sum_throughput_perf`; jobs whose steps are cheap therefore weigh more.
Elastic: the same sum over configuration rows (policies.configs). With space
sharing the rows of X are job combinations (base.Combos); Gavel's reference has
no packed form of this objective to compare with.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gearshift.scheduler.plugins.gavel.policies import solvers
from gearshift.scheduler.plugins.gavel.policies.base import (
    Allocation,
    Combos,
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

    def __init__(self, *, space_sharing: bool = False) -> None:
        self.space_sharing = space_sharing

    def solve(self, inp: PolicyInput) -> Allocation:
        combos = Combos.build(inp, inp.throughputs, self.space_sharing)
        x = cp.Variable((len(combos.rows), inp.num_types))
        total = cp.sum(scaled_throughputs(x, inp.throughputs, np.ones(inp.num_jobs), combos))
        solvers.solve(
            cp.Problem(cp.Maximize(total), validity_constraints(x, inp, combos)),
            "lp",
            what=self.name,
        )
        return combos.allocation(inp, np.asarray(x.value, dtype=np.float64))

    def solve_elastic(self, inp: PolicyInput) -> ElasticAllocation:
        assert inp.configs is not None
        problem = ConfigProblem(inp.num_jobs, inp.num_workers, inp.configs)
        total = cp.sum(problem.throughput())
        solvers.solve(
            cp.Problem(cp.Maximize(total), problem.validity()), "lp_vertex", what=self.name
        )
        return problem.allocation(inp.job_ids, inp.worker_types)
