"""First in, first out (Gavel section 4.2), as an LP and as Gavel's queue.

`Fifo` is the paper's heterogeneity-aware formulation: with jobs numbered in
arrival order m = 0..M-1, maximize sum_m (M - m) * scale_factor_m *
throughput(m, X) / throughput(m, X_fastest), where X_fastest puts the job on its
fastest type. The decreasing weights make an earlier job win a device over a
later one; the scale factor (as for LAS, section 4.1) compares jobs per device,
so a 4-device job is not outweighed by four later 1-device jobs. LP. Elastic
(policies.configs): the same sum over configuration rows, each job's throughput
divided by its fastest configuration's.

`QueueFifo` is the queue Gavel's reference implementation runs under the names
`fifo` (heterogeneity-agnostic: a random type among those with room) and
`fifo_perf` (the fastest type with room): a job keeps its type until it
completes, freed devices go to the next jobs in arrival order, and the queue
stops at the first job that fits nowhere (no job jumps ahead). It is sticky, so
it reads the allocation in force from PolicyInput.previous.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from gearshift.scheduler.plugins.gavel.policies import solvers
from gearshift.scheduler.plugins.gavel.policies.base import (
    Allocation,
    Policy,
    PolicyInput,
    ProblemClass,
    job_speed_matrix,
    scaled_throughputs,
    validity_constraints,
)
from gearshift.scheduler.plugins.gavel.policies.configs import ConfigProblem, ElasticAllocation
from gearshift.scheduler.plugins.gavel.policies.cvx import cp


class Fifo(Policy):
    """The paper's FIFO objective as one LP."""

    name: str = "fifo_lp"
    problem_class: ClassVar[ProblemClass] = "lp"
    has_elastic_form: ClassVar[bool] = True

    def __init__(self, *, heterogeneity_aware: bool = True) -> None:
        self.heterogeneity_aware = heterogeneity_aware

    def solve(self, inp: PolicyInput) -> Allocation:
        speeds = job_speed_matrix(inp, self.heterogeneity_aware)
        fastest = np.maximum(speeds.max(axis=1), 1e-12)
        m = inp.num_jobs
        # Weights M-m, rescaled to at most 1: the order is what matters, and small
        # coefficients keep the interior-point solver well conditioned.
        order = (m - np.arange(m)) / m
        x = cp.Variable((m, inp.num_types))
        objective = cp.sum(scaled_throughputs(x, speeds, order * inp.scale_factors / fastest))
        solvers.solve(
            cp.Problem(cp.Maximize(objective), validity_constraints(x, inp)), "lp", what=self.name
        )
        return Allocation.singles(inp, np.asarray(x.value, dtype=np.float64))

    def solve_elastic(self, inp: PolicyInput) -> ElasticAllocation:
        assert inp.configs is not None
        m = inp.num_jobs
        best = np.maximum(inp.configs.best_rates(m), 1e-12)
        order = (m - np.arange(m)) / m
        problem = ConfigProblem(m, inp.num_workers, inp.configs)
        objective = cp.sum(problem.throughput(order / best))
        solvers.solve(
            cp.Problem(cp.Maximize(objective), problem.validity()), "lp_vertex", what=self.name
        )
        return problem.allocation(inp.job_ids, inp.worker_types)


class QueueFifo(Policy):
    """Gavel's FIFO queue; see the module docstring.

    With `reference_bookkeeping` (the default, used under Gavel's names so that
    its users get the numbers they know), the queue keeps two traits of the
    reference implementation: room on a type is counted while walking the
    held jobs in arrival order, so a device freed by a completed job can be
    promised to the queue's head before later jobs on that type are counted
    (the type is then over-committed and those jobs time-share it); and a
    head that does not fit the freed type is passed over until the next
    recomputation. Without it the queue is strict: held jobs keep their type,
    then jobs take free devices in arrival order and the first that fits
    nowhere stops the queue.
    """

    name: str = "fifo"
    problem_class: ClassVar[ProblemClass] = "greedy"
    skip_zero_priority: ClassVar[bool] = True
    no_elastic_form_because: ClassVar[str] = (
        "it is Gavel's queue, not an objective: a job holds one type at its scale factor "
        "until it completes, so there is no device count to choose; the elastic FIFO is "
        "fifo_lp, the paper's FIFO objective over device configurations"
    )

    def __init__(
        self,
        *,
        heterogeneity_aware: bool = False,
        seed: int | None = None,
        reference_bookkeeping: bool = True,
    ) -> None:
        self.heterogeneity_aware = heterogeneity_aware
        self.reference_bookkeeping = reference_bookkeeping
        self._rng = random.Random(seed)

    def solve(self, inp: PolicyInput) -> Allocation:
        col = {t: j for j, t in enumerate(inp.worker_types)}
        index = {job: i for i, job in enumerate(inp.job_ids)}
        free = {t: float(n) for t, n in zip(inp.worker_types, inp.num_workers, strict=True)}
        held = {
            job: kind
            for job, row in inp.previous.items()
            if (kind := _held_type(row, free)) is not None
        }
        queue = [i for i, job in enumerate(inp.job_ids) if job not in held]
        chosen: dict[int, str] = {}

        def size(i: int) -> float:
            return float(inp.scale_factors[i])

        def runs(i: int, kind: str) -> bool:
            return bool(inp.throughputs[i, col[kind]] > 0)

        for job, kind in held.items():  # arrival order
            if job in index:
                chosen[index[job]] = kind
                free[kind] -= size(index[job])
            elif self.reference_bookkeeping and queue:
                # Room is counted as held jobs are walked: later holders of this type
                # are not subtracted yet, so the head may over-commit it.
                head = queue[0]
                if size(head) <= free[kind] and runs(head, kind):
                    chosen[queue.pop(0)] = kind
                    free[kind] -= size(head)
        types = sorted(t for t in inp.worker_types if free[t] > 0)
        while queue and types:
            head = queue.pop(0)
            options = [t for t in types if free[t] >= size(head) and runs(head, t)]
            if not options:
                break  # FIFO: the head of the queue waits, nobody passes it
            if self.heterogeneity_aware:
                kind = max(options, key=lambda t: inp.throughputs[head, col[t]])
                drawn = kind
            else:
                drawn = options[self._rng.randrange(len(options))]
                # The reference draws a type but assigns the last type of its list.
                kind = types[-1] if self.reference_bookkeeping else drawn
            if not runs(head, kind):
                continue
            chosen[head] = kind
            free[kind] -= size(head)
            if free[kind] == 0 or (not self.reference_bookkeeping and free[kind] < 0):
                types.remove(drawn)
        x = np.zeros((inp.num_jobs, inp.num_types))
        for i, kind in chosen.items():
            x[i, col[kind]] = 1.0
        return Allocation.singles(inp, x)


def _held_type(row: Mapping[str, float], known: Mapping[str, float]) -> str | None:
    """The type a previous FIFO allocation gave a job (its row is 1 on one type)."""
    for kind, value in row.items():
        if value >= 0.5 and kind in known:
            return kind
    return None
