"""Maximize total throughput (Gavel section 4.2): maximize sum_m throughput(m, X). LP.

Throughputs are summed as measured (steps/s), as in the paper and Gavel's
`max_sum_throughput_perf`; jobs whose steps are cheap therefore weigh more.
Elastic: the same sum over configuration rows (policies.configs). With space
sharing the rows of X are job combinations (base.Combos); Gavel's reference has
no packed form of this objective to compare with.

`per_dollar=True, slos=True` with space sharing is what Gavel's code runs as
`max_sum_throughput_normalized_by_cost_packed_SLOs` (its
`ThroughputNormalizedByCostSumWithPackingSLOs`): each job's steps/s on a type
divided by that type's price, summed, every pair of jobs a row; every job with a
deadline kept at throughput >= steps left / seconds to its deadline (a deadline
already past asks nothing), and the SLOs dropped when they cannot all be met.
That is not the paper's ratio of normalized throughput to cost (min_total_cost).
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
from gearshift.scheduler.plugins.gavel.policies.min_total_cost import with_slos_if_possible


class MaxSumThroughput(Policy):
    """max sum_m throughput(m, X) subject to the validity constraints."""

    name: str = "max_sum_throughput"
    problem_class: ClassVar[ProblemClass] = "lp"
    has_elastic_form: ClassVar[bool] = True

    def __init__(
        self, *, space_sharing: bool = False, per_dollar: bool = False, slos: bool = False
    ) -> None:
        self.space_sharing = space_sharing
        self.per_dollar = per_dollar
        self.slos = slos

    def solve(self, inp: PolicyInput) -> Allocation:
        if not self.per_dollar:
            return self._solve(inp, with_slos=False)
        return with_slos_if_possible(self.slos, lambda slos: self._solve(inp, with_slos=slos))

    def _solve(self, inp: PolicyInput, *, with_slos: bool) -> Allocation:
        combos = Combos.build(inp, inp.throughputs, self.space_sharing, every_pair=self.per_dollar)
        x = cp.Variable((len(combos.rows), inp.num_types))
        rate = scaled_throughputs(x, inp.throughputs, np.ones(inp.num_jobs), combos)
        constraints = validity_constraints(x, inp, combos)
        if self.per_dollar:
            weights = sum(r / np.maximum(inp.costs, 1e-12)[None, :] for r in combos.rates)
            total = cp.sum(cp.multiply(weights, x))
        else:
            total = cp.sum(rate)
        if with_slos:
            due = np.isfinite(inp.deadlines)
            ahead = due & (inp.deadlines > 0)  # a deadline already past asks nothing
            need = np.divide(
                inp.steps_remaining, inp.deadlines, out=np.zeros(inp.num_jobs), where=ahead
            )
            if due.any():
                constraints.append(rate[np.flatnonzero(due)] >= need[due])
        solvers.solve(cp.Problem(cp.Maximize(total), constraints), "lp", what=self.name)
        return combos.allocation(inp, np.asarray(x.value, dtype=np.float64))

    def solve_elastic(self, inp: PolicyInput) -> ElasticAllocation:
        assert inp.configs is not None
        problem = ConfigProblem(inp.num_jobs, inp.num_workers, inp.configs)
        total = cp.sum(problem.throughput())
        solvers.solve(
            cp.Problem(cp.Maximize(total), problem.validity()), "lp_vertex", what=self.name
        )
        return problem.allocation(inp.job_ids, inp.worker_types)
