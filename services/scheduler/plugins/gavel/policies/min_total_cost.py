"""Minimize total cost, optionally subject to SLOs (Gavel section 4.2).

Objective: maximize (sum_m throughput(m, X) / best_m) / (sum_m sum_j cost_j *
scale_factor_m * X[m, j]): normalized throughput bought per dollar. Raw steps/s
of different jobs are not commensurable, so each job's throughput is divided by
its speed on its fastest type (best_m). With SLOs, every job with a deadline
must keep throughput(m, X) >= steps_m / seconds to its deadline.

The objective is linear-fractional, not convex as written. The Charnes-Cooper
transformation makes it one LP: Y = s * X, s >= 0, the denominator fixed to 1,
every constraint on X multiplied by s:
  maximize sum_m throughput(m, Y) / best_m
  s.t. sum cost_j sf_m Y[m, j] = 1;  0 <= Y <= s;  sum_j Y[m, j] <= s;
       sum_m sf_m Y[m, j] <= N_j s;  throughput(m, Y) >= (steps_m / deadline_m) s,
then X = Y / s. When the SLOs cannot all be met the SLO constraints are dropped
(logged), as Gavel does. Costs are the input's dollars per device-hour of each
type (`--prices`; Gavel's public cloud prices by default).

Elastic (policies.configs): the same transformation over configuration rows; a
row costs its devices times their prices, and best_m is the job's fastest
configuration's rate.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import ClassVar, TypeVar

import numpy as np

from gearshift.scheduler.plugins.gavel.policies import solvers
from gearshift.scheduler.plugins.gavel.policies.base import (
    Allocation,
    Policy,
    PolicyError,
    PolicyInput,
    ProblemClass,
    scaled_throughputs,
)
from gearshift.scheduler.plugins.gavel.policies.configs import ConfigProblem, ElasticAllocation
from gearshift.scheduler.plugins.gavel.policies.cvx import cp

log = logging.getLogger("gearshift.scheduler.policies")
T = TypeVar("T")


class MinTotalCost(Policy):
    """Most normalized throughput per dollar, optionally meeting SLOs."""

    name: str = "min_total_cost"
    problem_class: ClassVar[ProblemClass] = "lp"
    has_elastic_form: ClassVar[bool] = True

    def __init__(self, *, slos: bool = False) -> None:
        self.slos = slos
        if slos:
            self.name = "min_total_cost_slo"

    def _solve(self, inp: PolicyInput, with_slos: bool) -> Allocation:
        m, n = inp.num_jobs, inp.num_types
        best = np.maximum(inp.throughputs.max(axis=1), 1e-12)
        y = cp.Variable((m, n))
        s = cp.Variable(nonneg=True)
        sf = inp.scale_factors
        cost = cp.sum(cp.multiply(np.outer(sf, inp.costs), y))
        rate = scaled_throughputs(y, inp.throughputs, np.ones(m))
        constraints = [
            y >= 0,
            y <= s,
            cp.sum(y, axis=1) <= s,
            sf @ y <= inp.num_workers * s,
            cost == 1,
        ]
        if with_slos:
            constraints.extend(_slo_constraints(inp, rate, s))
        objective = cp.Maximize(cp.sum(scaled_throughputs(y, inp.throughputs, 1.0 / best)))
        solvers.solve(cp.Problem(objective, constraints), "lp", what=self.name)
        scale = float(s.value) if s.value is not None else 0.0
        if scale <= 1e-12:
            raise PolicyError(f"{self.name}: degenerate Charnes-Cooper scale {scale}")
        return Allocation.singles(inp, np.asarray(y.value, dtype=np.float64) / scale)

    def _solve_elastic(self, inp: PolicyInput, with_slos: bool) -> ElasticAllocation:
        assert inp.configs is not None
        m = inp.num_jobs
        best = np.maximum(inp.configs.best_rates(m), 1e-12)
        problem = ConfigProblem(m, inp.num_workers, inp.configs)
        s = cp.Variable(nonneg=True)
        constraints = [*problem.validity(scale=s), problem.cost(inp.costs) == 1]
        if with_slos:
            constraints.extend(_slo_constraints(inp, problem.throughput(), s))
        objective = cp.Maximize(cp.sum(problem.throughput(1.0 / best)))
        solvers.solve(cp.Problem(objective, constraints), "lp_vertex", what=self.name)
        scale = float(s.value) if s.value is not None else 0.0
        if scale <= 1e-12:
            raise PolicyError(f"{self.name}: degenerate Charnes-Cooper scale {scale}")
        value = np.asarray(problem.x.value, dtype=np.float64) / scale
        return ElasticAllocation.from_rows(inp.job_ids, inp.worker_types, inp.configs, value)

    def solve(self, inp: PolicyInput) -> Allocation:
        return with_slos_if_possible(self.slos, lambda slos: self._solve(inp, with_slos=slos))

    def solve_elastic(self, inp: PolicyInput) -> ElasticAllocation:
        return with_slos_if_possible(
            self.slos, lambda slos: self._solve_elastic(inp, with_slos=slos)
        )


def _slo_constraints(inp: PolicyInput, rate: cp.Expression, s: cp.Variable) -> list[cp.Constraint]:
    """throughput(m, Y) >= (steps_m / seconds to its deadline) * s for jobs with an SLO."""
    out: list[cp.Constraint] = []
    for i in range(inp.num_jobs):
        deadline = float(inp.deadlines[i])
        if math.isfinite(deadline):
            need = float(inp.steps_remaining[i]) / max(deadline, 1e-9)
            out.append(rate[i] >= need * s)
    return out


def with_slos_if_possible(slos: bool, solve: Callable[[bool], T]) -> T:
    """With SLOs when asked and they can all be met; else without them (logged), as Gavel's
    SLO policies do."""
    if not slos:
        return solve(False)
    try:
        return solve(True)
    except PolicyError as exc:
        log.warning("SLOs cannot all be met; ignoring them", extra={"error": str(exc)})
        return solve(False)
