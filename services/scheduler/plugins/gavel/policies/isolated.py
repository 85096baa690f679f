"""Isolated (equal share): every job gets 1/M of the cluster, split over types in proportion to
their counts (Gavel's `isolated`). The reference point of LAS and finish-time fairness; no
solver needed.
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


def isolated_share(inp: PolicyInput) -> FloatArray:
    """X_isolated: N_j / (M * scale_factor_m) of type j for every job, rows scaled to <= 1."""
    m = max(inp.num_jobs, 1)
    x = inp.num_workers[None, :] / (m * inp.scale_factors[:, None])
    x = np.where(inp.throughputs > 0, x, 0.0)
    rows = x.sum(axis=1, keepdims=True)
    return np.asarray(np.where(rows > 1, x / np.maximum(rows, 1e-12), x), dtype=np.float64)


class Isolated(Policy):
    """X = X_isolated."""

    name: str = "isolated"
    problem_class: ClassVar[ProblemClass] = "greedy"
    no_elastic_form_because: ClassVar[str] = (
        "it is the yardstick finish-time fairness is measured against (1/M of every type), "
        "not an objective: elastic finish_time_fairness computes its own isolated share "
        "(1/M of each type, at most the job's maximum devices)"
    )

    def solve(self, inp: PolicyInput) -> Allocation:
        return Allocation.singles(inp, isolated_share(inp))
