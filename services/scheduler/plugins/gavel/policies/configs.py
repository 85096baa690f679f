"""Elastic jobs as rows of device configurations: the one extension every Gavel objective shares.

A rigid job runs on scale_factor devices of one type, and X[m, j] is its time
share on type j. An elastic EST job may run on any device configuration its
bounds and determinism allow - c = (devices per type), 1 <= |c| <= its maximum,
one type unless it runs under D2 - at the rate EasyScale's planner predicts for c
(gearshift.scheduler.plugins.easyscale.elastic builds the rows). Its variables become x[r], the
time share of configuration row r:

    throughput(m, x) = sum_{r of m} rate[r] * x[r]
    sum_{r of m} x[r] <= 1                                   (time)
    sum_r devices[r, j] * x[r] <= num_workers[j]             (capacity)

Every objective keeps its published formula with this throughput. What the
objectives compare against is counted in devices: `PolicyInput.throughputs`
holds each job's rate on ONE device of each type (a rigid job's: its rate on
scale_factor devices / scale_factor, so a rigid job's normalized throughput is
exactly Gavel's) and scale factors are 1. A rigid job in an elastic problem is
the one-type configurations with scale_factor devices.

`ConfigProblem` is the variable and the sparse matrices around it. With
`grouped=True` interchangeable jobs (same rows, rates and objective factor)
share one set of rows counted by multiplicity, as `base.Groups` does for rigid
LAS: any max-min or sum objective has an optimum that treats them alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

from gearshift.scheduler.plugins.gavel.policies.cvx import cp
from gearshift.scheduler.types import Config

IntArray = npt.NDArray[np.intp]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Configurations:
    """The configuration rows of every job: row r is job job[r] running on configs[r]."""

    job: IntArray
    configs: tuple[Config, ...]
    devices: FloatArray  # (rows, types): devices of each type in the row's configuration
    rates: FloatArray  # (rows,): the job's steps/s in that configuration

    @staticmethod
    def build(
        worker_types: Sequence[str], per_job: Sequence[Sequence[tuple[Config, float]]]
    ) -> Configurations:
        """Rows from each job's (configuration, rate) list, jobs in order."""
        col = {t: j for j, t in enumerate(worker_types)}
        job: list[int] = []
        configs: list[Config] = []
        rates: list[float] = []
        for m, rows in enumerate(per_job):
            for config, rate in rows:
                job.append(m)
                configs.append(config)
                rates.append(float(rate))
        devices = np.zeros((len(configs), len(worker_types)))
        for r, config in enumerate(configs):
            for kind, count in config:
                if kind not in col:
                    raise ValueError(f"configuration {config} names unknown type {kind!r}")
                devices[r, col[kind]] = count
        return Configurations(
            np.asarray(job, dtype=np.intp), tuple(configs), devices, np.asarray(rates)
        )

    @property
    def num_rows(self) -> int:
        return len(self.configs)

    def rows_of(self, m: int) -> IntArray:
        return np.flatnonzero(self.job == m)

    def best_rates(self, num_jobs: int) -> FloatArray:
        """Each job's fastest configuration's rate (0 for a job without rows)."""
        out = np.zeros(num_jobs)
        np.maximum.at(out, self.job, self.rates)
        return out

    def throughputs(self, x: FloatArray, num_jobs: int) -> FloatArray:
        """throughput(m, x) for a value of x (one share per row)."""
        out = np.zeros(num_jobs)
        np.add.at(out, self.job, self.rates * x)
        return out


@dataclass(frozen=True)
class ElasticAllocation:
    """Time shares of configurations: shares[job][config] (only positive shares kept)."""

    worker_types: tuple[str, ...]
    shares: dict[str, dict[Config, float]]

    @staticmethod
    def empty(worker_types: Sequence[str], job_ids: Sequence[str] = ()) -> ElasticAllocation:
        return ElasticAllocation(tuple(worker_types), {j: {} for j in job_ids})

    @staticmethod
    def from_rows(
        job_ids: Sequence[str],
        worker_types: Sequence[str],
        configs: Configurations,
        x: FloatArray,
        tolerance: float = 1e-6,
    ) -> ElasticAllocation:
        shares: dict[str, dict[Config, float]] = {j: {} for j in job_ids}
        for r, value in enumerate(np.clip(x, 0.0, 1.0)):
            if value > tolerance:
                shares[job_ids[int(configs.job[r])]][configs.configs[r]] = float(value)
        return ElasticAllocation(tuple(worker_types), shares)

    def device_shares(self) -> dict[str, dict[str, float]]:
        """Each job's expected devices of each type (time share x devices)."""
        out: dict[str, dict[str, float]] = {}
        for job, rows in self.shares.items():
            into = dict.fromkeys(self.worker_types, 0.0)
            for config, share in rows.items():
                for kind, count in config:
                    into[kind] += share * count
            out[job] = into
        return out


class ConfigProblem:
    """x over configuration rows, with the sparse matrices every elastic objective uses."""

    def __init__(
        self,
        num_jobs: int,
        num_workers: FloatArray,
        configs: Configurations,
        *,
        group_keys: Sequence[object] | None = None,
    ) -> None:
        self.configs = configs
        self.num_jobs = num_jobs
        self.num_workers = num_workers
        if group_keys is None:
            self.members: tuple[tuple[int, ...], ...] = tuple((m,) for m in range(num_jobs))
        else:
            groups: dict[object, list[int]] = {}
            for m, key in enumerate(group_keys):
                groups.setdefault(key, []).append(m)
            self.members = tuple(tuple(g) for g in groups.values())
        self.first = np.array([g[0] for g in self.members], dtype=np.intp)
        self.counts = np.array([len(g) for g in self.members], dtype=np.float64)
        # Rows of each group's first member, in group order.
        group_of = np.full(num_jobs, -1, dtype=np.intp)
        group_of[self.first] = np.arange(len(self.members))
        keep = np.flatnonzero(group_of[configs.job] >= 0)
        self.rows = keep
        self.row_group = group_of[configs.job[keep]]
        self.rates = configs.rates[keep]
        self.devices = configs.devices[keep]
        size = len(keep)
        self.member_matrix = sp.csr_matrix(
            (np.ones(size), (self.row_group, np.arange(size))), shape=(len(self.members), size)
        )
        self.x = cp.Variable(size)

    @property
    def num_groups(self) -> int:
        return len(self.members)

    def throughput(self, factor: FloatArray | float = 1.0) -> cp.Expression:
        """factor[job] x throughput of each group's jobs (one entry per group)."""
        per_job = np.broadcast_to(np.asarray(factor, dtype=np.float64), (self.num_jobs,))
        weights = self.rates * per_job[self.first][self.row_group]
        matrix = sp.csr_matrix(
            (weights, (self.row_group, np.arange(len(self.rows)))),
            shape=(self.num_groups, len(self.rows)),
        )
        return matrix @ self.x

    def used(self) -> cp.Expression:
        """Devices of each type in use on average (every member of a group counted)."""
        return (self.devices * self.counts[self.row_group][:, None]).T @ self.x

    def validity(self, scale: cp.Variable | None = None) -> list[cp.Constraint]:
        """x >= 0, each job's shares sum to <= 1, capacity (all times `scale`: Charnes-Cooper)."""
        one: cp.Expression | float = 1.0 if scale is None else scale
        workers: cp.Expression | FloatArray = (
            self.num_workers if scale is None else self.num_workers * scale
        )
        return [self.x >= 0, self.member_matrix @ self.x <= one, self.used() <= workers]

    def cost(self, prices: FloatArray) -> cp.Expression:
        """Dollars per second of the allocation: devices x price x share, every member counted."""
        per_row = (self.devices @ prices) * self.counts[self.row_group]
        return per_row @ self.x

    def expand(self, value: FloatArray) -> FloatArray:
        """Per-group row values back to one value per row of `configs` (every member)."""
        out = np.zeros(self.configs.num_rows)
        by_config: dict[tuple[int, object], float] = {}
        for value_r, row in zip(value, self.rows, strict=True):
            by_config[(int(self.configs.job[row]), self.configs.configs[row])] = float(value_r)
        group_of_job = {m: g for g, members in enumerate(self.members) for m in members}
        for r in range(self.configs.num_rows):
            lead = int(self.first[group_of_job[int(self.configs.job[r])]])
            out[r] = by_config.get((lead, self.configs.configs[r]), 0.0)
        return out

    def allocation(self, job_ids: Sequence[str], worker_types: Sequence[str]) -> ElasticAllocation:
        value = np.asarray(self.x.value, dtype=np.float64)
        return ElasticAllocation.from_rows(job_ids, worker_types, self.configs, self.expand(value))


def row_signatures(configs: Configurations, num_jobs: int) -> list[tuple[object, ...]]:
    """Each job's (configuration, rate) rows as a hashable key: jobs with equal keys are
    interchangeable in every elastic objective (with equal objective factors)."""
    rows: list[list[tuple[Config, float]]] = [[] for _ in range(num_jobs)]
    for r, m in enumerate(configs.job):
        rows[int(m)].append((configs.configs[r], float(configs.rates[r])))
    return [tuple(r) for r in rows]
