"""Shortest job first (Gavel section 4.2): minimize min_m steps_m / throughput(m, X).

A minimum of convex functions is not convex, so the problem is not solved as
written. Because min over X of min over jobs equals min over jobs of min over X,
it splits into one LP per job: the fastest the job can go alone on the capacity
left. That LP (maximize sum_j T[m, j] x_j subject to sum_j x_j <= 1 and
scale_factor * x_j <= free_j) is a fractional knapsack whose optimum is the
greedy fill of its fastest types, computed exactly here. The shortest job gets
its optimum, its devices are taken, and the procedure repeats on what is left
(lexicographic SJF), so spare capacity goes to the next shortest jobs.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gearshift.scheduler.plugins.gavel.policies.base import (
    Allocation,
    FloatArray,
    Policy,
    PolicyInput,
    ProblemClass,
)


def fastest_alone(speeds: FloatArray, scale_factor: float, free: FloatArray) -> FloatArray:
    """The optimum of the per-job LP: fill the fastest types first (fractional knapsack)."""
    x = np.zeros_like(speeds)
    left = 1.0
    for j in np.argsort(-speeds, kind="stable"):
        if speeds[j] <= 0 or left <= 0:
            break
        take = min(left, max(free[j], 0.0) / scale_factor)
        x[j] = take
        left -= take
    return x


class ShortestJobFirst(Policy):
    """Lexicographic SJF; see the module docstring."""

    name: str = "shortest_job_first"
    problem_class: ClassVar[ProblemClass] = "greedy"
    no_elastic_form_because: ClassVar[str] = (
        "its per-job step is a fractional knapsack that a greedy fill of the fastest types "
        "solves exactly at one scale factor; over configurations of several device counts "
        "and types that step is an LP per job per pass, which is not built; for short "
        "completion times over configurations choose makespan or fifo_lp"
    )

    def solve(self, inp: PolicyInput) -> Allocation:
        free = inp.num_workers.astype(np.float64).copy()
        x = np.zeros((inp.num_jobs, inp.num_types))
        waiting = set(range(inp.num_jobs))
        while waiting and free.max() > 1e-9:
            best_job, best_time, best_x = -1, np.inf, np.zeros(inp.num_types)
            for m in sorted(waiting):
                share = fastest_alone(inp.throughputs[m], float(inp.scale_factors[m]), free)
                rate = float(inp.throughputs[m] @ share)
                if rate <= 0:
                    continue
                duration = float(inp.steps_remaining[m]) / rate
                if duration < best_time:
                    best_job, best_time, best_x = m, duration, share
            if best_job < 0:
                break
            x[best_job] = best_x
            free -= inp.scale_factors[best_job] * best_x
            waiting.discard(best_job)
        return Allocation.singles(inp, x)
