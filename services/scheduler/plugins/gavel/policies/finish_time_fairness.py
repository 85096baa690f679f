"""Finish-time fairness (Themis; Gavel section 4.2): minimize max_m rho(m, X), with

    rho(m, X) = (t_m + steps_m / throughput(m, X)) / (t_iso_m + steps_m / throughput(m, X_iso)),

t_m the time since the job arrived, X_iso the isolated share (1/M of the
cluster) and t_iso_m the time the job would have needed in isolation for the
steps it has done so far. As in Gavel's reference (`_cumulative_isolated_time`)
t_iso_m grows at every allocation by (steps done since the last one) /
(isolated throughput at the last one), so the policy keeps that ledger between
calls: a job that waited 20,000 s without running has t_iso = 0, not 20,000.

The denominator is a constant and steps / throughput is convex in X (inv_pos of
an affine function), so the problem is convex as written: minimize r subject to
(t_m + steps_m * inv_pos(throughput(m, X))) / D_m <= r. It needs the conic
solver (inv_pos becomes second-order cones).

Heterogeneity-agnostic (Gavel's variant): every type counts as fast as the
job's mean throughput over the types it can run on, so steps / throughput stay
seconds.

With space sharing (Gavel's `finish_time_fairness_packed`) the rows of X are job
combinations (base.Combos), a job's throughput summing its share of each; the
isolated throughput stays the job's alone.

Elastic (policies.configs): throughput(m, x) over configuration rows; the
isolated share is 1/M of each type's devices, at most the job's maximum device
count, at its one-device rate per type.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gearshift.scheduler.plugins.gavel.policies import solvers
from gearshift.scheduler.plugins.gavel.policies.base import (
    Allocation,
    Combos,
    FloatArray,
    Policy,
    PolicyInput,
    ProblemClass,
    agnostic_throughputs,
    scaled_throughputs,
    validity_constraints,
)
from gearshift.scheduler.plugins.gavel.policies.configs import ConfigProblem, ElasticAllocation
from gearshift.scheduler.plugins.gavel.policies.cvx import cp
from gearshift.scheduler.plugins.gavel.policies.isolated import isolated_share


def isolated_rates(inp: PolicyInput, throughputs: FloatArray) -> FloatArray:
    """throughput(m, X_iso): 1/M of every type's devices (elastic: up to its maximum)."""
    if inp.configs is None:
        out = (throughputs * isolated_share(inp)).sum(axis=1)
    else:
        m = max(inp.num_jobs, 1)
        share = np.where(throughputs > 0, inp.num_workers[None, :] / m, 0.0)
        total = share.sum(axis=1, keepdims=True)
        limit = (inp.max_devices if inp.max_devices is not None else np.ones(m))[:, None]
        share = np.where(total > limit, share * limit / np.maximum(total, 1e-12), share)
        out = (throughputs * share).sum(axis=1)
    return np.maximum(np.asarray(out, dtype=np.float64), 1e-12)


class FinishTimeFairness(Policy):
    """min max rho; see the module docstring."""

    name: str = "finish_time_fairness"
    problem_class: ClassVar[ProblemClass] = "conic"
    has_elastic_form: ClassVar[bool] = True

    def __init__(self, *, heterogeneity_aware: bool = True, space_sharing: bool = False) -> None:
        self.heterogeneity_aware = heterogeneity_aware
        self.space_sharing = space_sharing
        self.isolated_time: dict[str, float] = {}
        self._last: dict[str, tuple[float, float]] = {}  # job -> (steps left, isolated rate)

    def _speeds(self, inp: PolicyInput) -> FloatArray:
        if self.heterogeneity_aware:
            return inp.throughputs
        return agnostic_throughputs(inp.throughputs)

    def _denominators(self, inp: PolicyInput, speeds: FloatArray) -> tuple[FloatArray, FloatArray]:
        """(steps left, t_iso + steps / isolated throughput) per job; updates the ledger."""
        iso = isolated_rates(inp, speeds)
        steps = np.maximum(inp.steps_remaining, 0.0)
        denom = np.zeros(inp.num_jobs)
        for i, job in enumerate(inp.job_ids):
            before = self._last.get(job)
            spent = self.isolated_time.get(job, 0.0)
            if before is not None:
                spent += max(before[0] - steps[i], 0.0) / before[1]
            self.isolated_time[job] = spent
            self._last[job] = (float(steps[i]), float(iso[i]))
            denom[i] = spent + steps[i] / iso[i]
        return steps, denom

    def _problem(
        self, inp: PolicyInput, rate: cp.Expression, steps: FloatArray, denom: FloatArray
    ) -> tuple[cp.Variable, list[cp.Constraint]]:
        elapsed = np.maximum(inp.times_since_start, 0.0)
        runnable = np.flatnonzero((inp.throughputs.sum(axis=1) > 0) & (denom > 0))
        r = cp.Variable()
        constraints: list[cp.Constraint] = []
        if runnable.size:
            d = denom[runnable]
            constraints.append(
                elapsed[runnable] / d + cp.multiply(steps[runnable] / d, cp.inv_pos(rate[runnable]))
                <= r
            )
        return r, constraints

    def solve(self, inp: PolicyInput) -> Allocation:
        speeds = self._speeds(inp)
        steps, denom = self._denominators(inp, speeds)
        combos = Combos.build(inp, speeds, self.space_sharing and self.heterogeneity_aware)
        x = cp.Variable((len(combos.rows), inp.num_types))
        rate = scaled_throughputs(x, speeds, np.ones(inp.num_jobs), combos)
        r, rho = self._problem(inp, rate, steps, denom)
        problem = cp.Problem(cp.Minimize(r), [*validity_constraints(x, inp, combos), *rho])
        solvers.solve(problem, "conic", what=self.name)
        return combos.allocation(inp, np.asarray(x.value, dtype=np.float64))

    def solve_elastic(self, inp: PolicyInput) -> ElasticAllocation:
        assert inp.configs is not None
        steps, denom = self._denominators(inp, self._speeds(inp))
        problem = ConfigProblem(inp.num_jobs, inp.num_workers, inp.configs)
        r, rho = self._problem(inp, problem.throughput(), steps, denom)
        solvers.solve(
            cp.Problem(cp.Minimize(r), [*problem.validity(), *rho]), "conic", what=self.name
        )
        return problem.allocation(inp.job_ids, inp.worker_types)
