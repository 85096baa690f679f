"""Hierarchical max-min fairness by water filling (Gavel section 4.3 and appendix A.1).

Entities (tenants) share the cluster in proportion to their weights; inside an
entity, jobs share by fairness (each job's weight in proportion to its own
priority weight) or FIFO (the entity's whole weight on its oldest job that can
still improve). A job's level is its LAS metric, throughput(m, X) /
throughput(m, X_equal) * scale_factor_m (heterogeneity-aware; with every
throughput 1 when agnostic).

Each iteration:
1. LP: maximize t subject to level_m / w_m >= t for every job with weight, and
   level_m >= its level after the previous iteration for every job (frozen
   jobs keep theirs), plus the validity constraints.
2. MILP: z_m binary, maximize sum z subject to the same constraints, level_m /
   w_m >= t* for jobs with weight, and level_m / w_m >= (1 + delta) t* where
   z_m = 1: the largest set of jobs that can all improve at once. Jobs with
   z_m = 0 are bottlenecked: they are frozen at their level and their weight
   moves to the entity's other jobs (fairness) or to its next job (FIFO).
Iterations end when every job is frozen; the result is Pareto efficient.

max-min is not an LP objective as written; step 1 is its epigraph form.

Scale. Jobs of a fairness entity with the same throughputs, scale factor and
priority weight are interchangeable, and a max-min problem has an optimum that
treats interchangeable jobs alike (average any optimum over their
permutations), so they share one row of X with a multiplicity in the capacity
constraint - as Gavel's own implementation groups jobs by type. With 26 job
types this keeps every LP and MILP small at thousands of jobs (bench/policies.py).
FIFO entities keep one row per job (their order breaks the symmetry).

Elastic (policies.configs): the same iterations over configuration rows, a
class's level being its throughput over configurations divided by its rate on
an equal share of one device (exactly Gavel's level for a rigid job).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from gearshift.scheduler.plugins.gavel.policies import solvers
from gearshift.scheduler.plugins.gavel.policies.base import (
    Allocation,
    FloatArray,
    Policy,
    PolicyInput,
    ProblemClass,
    job_speed_matrix,
)
from gearshift.scheduler.plugins.gavel.policies.configs import (
    ConfigProblem,
    ElasticAllocation,
    row_signatures,
)
from gearshift.scheduler.plugins.gavel.policies.cvx import cp

IMPROVEMENT = 1e-3  # delta: a job "can improve" when it can gain 0.1% more
TOLERANCE = 1e-5  # relative slack on levels carried between solvers


@dataclass(frozen=True)
class JobClasses:
    """Interchangeable jobs grouped: members[c] are the job indices of class c."""

    members: tuple[tuple[int, ...], ...]
    speeds: FloatArray
    scale_factors: FloatArray
    counts: FloatArray
    level_factor: FloatArray
    entities: tuple[str, ...]
    priority_weights: FloatArray

    @staticmethod
    def build(
        inp: PolicyInput,
        speeds: FloatArray,
        policies: Mapping[str, str],
        rows: Sequence[object] | None = None,
    ) -> JobClasses:
        """Classes of interchangeable jobs; `rows` (elastic) are the jobs' configuration
        signatures, which then decide who is alike instead of the speeds."""
        groups: dict[object, list[int]] = {}
        for i in range(inp.num_jobs):
            entity = inp.entities[i]
            key: object
            if policies.get(entity, "fairness") == "fifo":
                key = ("job", i)
            else:
                row = (
                    tuple(float(v) for v in speeds[i]) if rows is None else (rows[i], speeds[i, 0])
                )
                key = (entity, row, float(inp.scale_factors[i]), float(inp.priority_weights[i]))
            groups.setdefault(key, []).append(i)
        members = tuple(tuple(g) for g in groups.values())
        first = [g[0] for g in members]
        base = inp.equal_share_throughputs(speeds)
        return JobClasses(
            members=members,
            speeds=speeds[first],
            scale_factors=inp.scale_factors[first],
            counts=np.array([len(g) for g in members], dtype=np.float64),
            level_factor=(inp.scale_factors / base)[first],
            entities=tuple(inp.entities[i] for i in first),
            priority_weights=inp.priority_weights[first],
        )

    def __len__(self) -> int:
        return len(self.members)


def class_weights(
    classes: JobClasses,
    inp: PolicyInput,
    frozen: set[int],
    policies: Mapping[str, str],
) -> FloatArray:
    """Each unfrozen job's share of its entity's weight (per job, by class)."""
    weights = np.zeros(len(classes))
    per_entity: dict[str, list[int]] = {}
    for c, entity in enumerate(classes.entities):
        if c not in frozen:
            per_entity.setdefault(entity, []).append(c)
    for entity, cs in per_entity.items():
        total = float(inp.entity_weights.get(entity, 1.0))
        if policies.get(entity, "fairness") == "fifo":
            weights[min(cs, key=lambda c: classes.members[c][0])] = total  # oldest job
            continue
        own = np.array([max(float(classes.priority_weights[c]), 0.0) for c in cs])
        if own.sum() <= 0:
            own = np.ones(len(cs))
        jobs = float((own * classes.counts[cs]).sum())
        for c, share in zip(cs, own, strict=True):
            weights[c] = total * share / jobs
    return weights


@dataclass(frozen=True)
class Iteration:
    """What one water-filling iteration decided (kept for tests and logs)."""

    level: float  # t*: the max-min value of level / weight
    frozen: tuple[int, ...]  # job indices frozen by this iteration
    guaranteed: dict[int, float]  # job index -> t* x weight, the level it is promised
    x: FloatArray


class WaterFilling(Policy):
    """Hierarchical (or single-level) max-min fairness by water filling."""

    name: str = "hierarchical"
    problem_class: ClassVar[ProblemClass] = "milp"
    has_elastic_form: ClassVar[bool] = True

    def __init__(
        self,
        *,
        heterogeneity_aware: bool = True,
        entity_policies: Mapping[str, str] | None = None,
    ) -> None:
        self.heterogeneity_aware = heterogeneity_aware
        self.entity_policies = dict(entity_policies or {})
        self.iterations: list[Iteration] = []

    def solve(self, inp: PolicyInput) -> Allocation:
        speeds = job_speed_matrix(inp, self.heterogeneity_aware)
        policies = {**self.entity_policies, **inp.entity_policies}
        classes = JobClasses.build(inp, speeds, policies)
        shape = _RigidClasses(classes, inp)
        return Allocation.singles(inp, self._fill(inp, classes, policies, shape))

    def solve_elastic(self, inp: PolicyInput) -> ElasticAllocation:
        assert inp.configs is not None
        speeds = job_speed_matrix(inp, self.heterogeneity_aware)
        policies = {**self.entity_policies, **inp.entity_policies}
        rows = row_signatures(inp.configs, inp.num_jobs)
        classes = JobClasses.build(inp, speeds, policies, rows)
        shape = _ConfigClasses(classes, inp)
        value = self._fill(inp, classes, policies, shape)
        return ElasticAllocation.from_rows(inp.job_ids, inp.worker_types, inp.configs, value)

    def _fill(
        self,
        inp: PolicyInput,
        classes: JobClasses,
        policies: Mapping[str, str],
        shape: _RigidClasses | _ConfigClasses,
    ) -> FloatArray:
        """The water-filling iterations over either shape of X; returns its value per job."""
        k = len(classes)
        # Both problems are built once with parameters (cvxpy DPP), so every
        # iteration re-solves without compiling again.
        t = cp.Variable()
        z = cp.Variable(k, boolean=True)
        weight = cp.Parameter(k, nonneg=True)  # per-job weight; 0 for jobs not in the max-min
        floor = cp.Parameter(k, nonneg=True)  # level reached before (frozen jobs: theirs)
        need = cp.Parameter(k, nonneg=True)  # t* x weight: what the MILP must keep
        better = cp.Parameter(k, nonneg=True)  # (1 + delta) t* x weight
        active = cp.Parameter(k, nonneg=True)  # 1 for jobs in the max-min, else 0
        level = shape.level
        validity = [*shape.validity, level >= floor]
        lp = cp.Problem(cp.Maximize(t), [*validity, level >= cp.multiply(weight, t)])
        milp = cp.Problem(
            cp.Maximize(cp.sum(z)),
            [*validity, level >= need, level >= cp.multiply(better, z), z <= active],
        )
        frozen = {c for c in range(k) if classes.speeds[c].sum() <= 0}
        floors = np.zeros(k)
        x_value = np.zeros(shape.x.shape)
        self.iterations = []
        while len(frozen) < k and len(self.iterations) <= k:
            weights = class_weights(classes, inp, frozen, policies)
            on = np.array([c not in frozen and weights[c] > 0 for c in range(k)])
            if not on.any():
                break
            weight.value = np.where(on, weights, 0.0)
            floor.value = floors * (1 - TOLERANCE)
            solvers.solve(lp, shape.lp_class, what=f"{self.name} LP")
            t_star = float(t.value)
            x_value = np.asarray(shape.x.value, dtype=np.float64)
            need.value = np.where(on, weights * t_star * (1 - TOLERANCE), 0.0)
            better.value = np.where(on, weights * t_star * (1 + IMPROVEMENT), 0.0)
            active.value = on.astype(np.float64)
            solvers.solve(milp, "milp", what=f"{self.name} bottlenecks")
            improvable = np.asarray(z.value).reshape(-1) > 0.5
            current = shape.levels(x_value)
            stuck = [c for c in range(k) if on[c] and not improvable[c]]
            if not stuck:  # numerically everyone improves: freeze the lowest
                ratio = np.where(on, current / np.maximum(weights, 1e-300), np.inf)
                stuck = [int(c) for c in np.flatnonzero(ratio <= ratio.min() * (1 + IMPROVEMENT))]
            for c in stuck:
                frozen.add(c)
                floors[c] = t_star * weights[c]
            for c in range(k):
                if c not in frozen:
                    floors[c] = max(floors[c], float(current[c]))
            frozen_jobs = tuple(sorted(j for c in stuck for j in classes.members[c]))
            guaranteed = {
                j: t_star * float(weights[c]) for c in range(k) if on[c] for j in classes.members[c]
            }
            self.iterations.append(
                Iteration(t_star, frozen_jobs, guaranteed, shape.expand(x_value))
            )
        return shape.expand(x_value)


class _RigidClasses:
    """X over (class, type): Gavel's shape."""

    lp_class: ProblemClass = "lp"

    def __init__(self, classes: JobClasses, inp: PolicyInput) -> None:
        self.classes, self.inp = classes, inp
        self.x = cp.Variable((len(classes), inp.num_types))
        self.level = cp.sum(
            cp.multiply(classes.speeds * classes.level_factor[:, None], self.x), axis=1
        )
        self.validity = [
            self.x >= 0,
            cp.sum(self.x, axis=1) <= 1,
            (classes.counts * classes.scale_factors) @ self.x <= inp.num_workers,
        ]

    def levels(self, x: FloatArray) -> FloatArray:
        out: FloatArray = (self.classes.speeds * x).sum(axis=1) * self.classes.level_factor
        return out

    def expand(self, x: FloatArray) -> FloatArray:
        out = np.zeros((self.inp.num_jobs, self.inp.num_types))
        for c, members in enumerate(self.classes.members):
            out[list(members)] = x[c]
        return out


class _ConfigClasses:
    """x over configuration rows of each class (policies.configs)."""

    lp_class: ProblemClass = "lp_vertex"

    def __init__(self, classes: JobClasses, inp: PolicyInput) -> None:
        assert inp.configs is not None
        of_job = np.zeros(inp.num_jobs, dtype=np.intp)
        for c, members in enumerate(classes.members):
            of_job[list(members)] = c
        factor = np.zeros(inp.num_jobs)
        factor[of_job >= 0] = classes.level_factor[of_job]
        self.problem = ConfigProblem(
            inp.num_jobs, inp.num_workers, inp.configs, group_keys=[int(c) for c in of_job]
        )
        self._factor = factor
        self.x = self.problem.x
        self.level = self.problem.throughput(factor)
        self.validity = self.problem.validity()

    def levels(self, x: FloatArray) -> FloatArray:
        p = self.problem
        out = np.zeros(p.num_groups)
        np.add.at(out, p.row_group, p.rates * x * self._factor[p.first][p.row_group])
        return out

    def expand(self, x: FloatArray) -> FloatArray:
        return self.problem.expand(x)
