"""Sia's normalized goodput (SOSP'23, section 4.2): what a configuration is worth to its job.

Sia scores each (job, configuration) by the job's speedup there: its goodput over its
goodput on its slowest minimal allocation, so every job counts in units of its own
baseline whatever its model. It maximizes sum_m (lambda - speedup^p) over one chosen
configuration per job, with p = -0.5 (the artifact's published `--policy_p_val=-0.5`):
a device goes where it raises some job's speedup^p most. With p < 0 the gain of a device
falls as a job's speedup rises, so a job that gains 2.4x from a fast type takes it before
one that gains 1.1x: types go by comparative advantage across jobs.

lambda is the value of running at all. Sia publishes 1.1 (`--mip_lambda_n=1.1`): a
newcomer's first device is then worth 0.1, less than a running job's second (1 - 2^-0.5 =
0.29), and live, a newcomer waited while a running job kept two devices
(tests/e2e/test_elastic_las.py). At lambda >= 2 admitting a job is worth at least 1, more
than any growth (each below 1): every job that fits runs before any grows, as LAS expects.
On Sia's Philly workloads both give 0.695 h (docs/results/sia.md).

Here the value is per configuration row of an elastic problem (policies.configs), so it
is linear in the time shares x and an LP objective.
"""

from __future__ import annotations

import numpy as np

from gearshift.scheduler.plugins.gavel.policies.base import FloatArray
from gearshift.scheduler.plugins.gavel.policies.configs import ConfigProblem

# Sia's published exponent, and the value of running at all (module docstring).
POWER = -0.5
ADMIT = 2.0


def speedup_values(
    problem: ConfigProblem, weights: FloatArray, *, power: float = POWER, admit: float = ADMIT
) -> FloatArray:
    """Per row of `problem`: (admit - speedup^power) x the job's weight x the jobs its group
    counts, speedup being the row's rate over the slowest rate among its job's rows (0 for a
    row that does not run)."""
    if power >= 0 or admit <= 1:
        raise ValueError(f"power must be < 0 and admit > 1, got {power} and {admit}")
    rates = problem.rates
    slowest = np.full(problem.num_groups, np.inf)
    np.minimum.at(slowest, problem.row_group, np.where(rates > 0, rates, np.inf))
    speedup = rates / slowest[problem.row_group]  # 0 for a row that does not run
    runs = speedup > 0
    value = np.where(runs, admit - np.power(np.where(runs, speedup, 1.0), power), 0.0)
    members = weights[problem.first] * problem.counts
    return value * members[problem.row_group]
