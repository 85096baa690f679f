"""AlloX (Le et al., EuroSys'20) as Gavel runs it (Gavel's `allox` baseline): one-device jobs
assigned to devices by a min-cost matching that minimizes the sum of completion times.

Each device d is a type; a job placed k-th from last on d adds k x its processing time
there (steps left / its steps/s on d's type) to the sum of completion times, plus the
time it has already waited. The assignment problem over (job, (device, position)) is
solved exactly (Hungarian method, scipy's linear_sum_assignment); every device then runs
the job placed first on it, which keeps that device until it completes (a job held this
way is not re-matched). Only the `alpha` x M oldest waiting jobs (at least as many as
free devices) enter the matching. Jobs on more than one device are refused, as Gavel's
policy refuses them.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from scipy.optimize import linear_sum_assignment

from gearshift.scheduler.plugins.gavel.policies.base import (
    Allocation,
    Policy,
    PolicyError,
    PolicyInput,
    ProblemClass,
)


class AlloX(Policy):
    """Min-sum-of-completion-times matching; see the module docstring."""

    name: str = "allox"
    problem_class: ClassVar[ProblemClass] = "greedy"
    no_elastic_form_because: ClassVar[str] = (
        "it matches one-device jobs to single devices, and refuses jobs on more than one"
    )

    def __init__(self, *, alpha: float = 1.0) -> None:
        self.alpha = alpha
        self._held: dict[str, int] = {}  # job -> the type index of the device it keeps

    def solve(self, inp: PolicyInput) -> Allocation:
        wide = [job for job, sf in zip(inp.job_ids, inp.scale_factors, strict=True) if sf != 1]
        if wide:
            raise PolicyError(f"allox schedules one-device jobs only; on more: {wide[:5]}")
        alive = set(inp.job_ids)
        self._held = {job: kind for job, kind in self._held.items() if job in alive}
        devices: list[int] = []  # one entry per free device: its type index
        for j in range(inp.num_types):
            taken = sum(1 for kind in self._held.values() if kind == j)
            devices.extend([j] * max(int(inp.num_workers[j]) - taken, 0))
        waiting = [i for i, job in enumerate(inp.job_ids) if job not in self._held]
        waiting.sort(key=lambda i: -inp.times_since_start[i])  # oldest first, stable
        waiting = waiting[: max(int(self.alpha * len(waiting)), len(devices))]
        if waiting and devices:
            for row, kind in _match(inp, waiting, devices).items():
                self._held[inp.job_ids[row]] = kind
        x = np.zeros((inp.num_jobs, inp.num_types))
        for i, job in enumerate(inp.job_ids):
            if job in self._held:
                x[i, self._held[job]] = 1.0
        return Allocation.singles(inp, x)


def _match(inp: PolicyInput, jobs: list[int], devices: list[int]) -> dict[int, int]:
    """The job first in line on each device (job -> type index) of the optimal matching."""
    m, n = len(jobs), len(devices)
    speed = np.maximum(inp.throughputs[np.ix_(jobs, devices)], 1e-10)
    processing = inp.steps_remaining[jobs][:, None] / speed  # (m, n)
    waited = np.repeat(inp.times_since_start[jobs][:, None], n, axis=1)
    # Column k * n + d: device d, the job placed k+1-th from last there.
    cost = np.hstack([(k + 1) * processing + waited for k in range(m)])
    rows, cols = linear_sum_assignment(cost)
    first: dict[int, tuple[int, int]] = {}  # device -> (position from last, job)
    for row, col in zip(rows, cols, strict=True):
        device, position = int(col % n), int(col // n)
        if device not in first or position > first[device][0]:
            first[device] = (position, jobs[int(row)])
    return {job: devices[device] for device, (_, job) in first.items()}
