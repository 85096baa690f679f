"""The one interface every scheduling policy implements, and the data it works on.

Gavel (section 3-4) writes every policy as an optimization problem over the
allocation matrix X: X[k, j] is the fraction of wall-clock time that job
combination k (a single job, or two jobs sharing a device when space sharing is
on) spends on accelerator type j. A policy reads a `PolicyInput` (plain NumPy
arrays, rows in arrival order) and returns an `Allocation`; it never touches
storage, gRPC or clocks, so the simulator, the service and the tests share it.

Validity constraints (Gavel section 3.1), common to every policy:
  0 <= X[k, j] <= 1;  sum over combinations holding job m and types j of X <= 1;
  sum_k X[k, j] * scale_factor[k] <= num_workers[j].
`validity_constraints` builds them once for all cvxpy-based policies.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

from gearshift.scheduler.plugins.gavel.policies.configs import Configurations, ElasticAllocation
from gearshift.scheduler.plugins.gavel.policies.cvx import cp
from gearshift.scheduler.types import EntityPolicy

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]
ProblemClass = Literal["lp", "lp_vertex", "conic", "milp", "greedy"]


class PolicyError(RuntimeError):
    """A policy could not compute an allocation (no solver succeeded, infeasible input)."""


def _array(values: Sequence[float] | FloatArray, length: int, default: float) -> FloatArray:
    if len(values) == 0:
        return np.full(length, default, dtype=np.float64)
    out = np.asarray(values, dtype=np.float64)
    if out.shape != (length,):
        raise ValueError(f"expected {length} values, got shape {out.shape}")
    return out


@dataclass(frozen=True)
class PolicyInput:
    """Everything a policy may look at; rows are jobs in arrival order.

    throughputs[m, j]: steps/s of job m alone on scale_factors[m] devices of
    type j (0: it cannot run there). colocated[(a, b)] (a < b, job indices)
    is an (n, 2) array of the two jobs' steps/s when they share devices of each
    type (space sharing). deadlines are seconds from now to each job's SLO
    (inf: none). previous is the allocation in force (sticky policies such as
    Gavel's FIFO keep a job on its type). costs are dollars per device-hour of
    each type.

    Elastic problems (`configs` set; see policies.configs): throughputs[m, j] is
    job m's rate on ONE device of type j, scale factors are 1, and the rows of
    `configs` are what the job may run on.
    """

    job_ids: tuple[str, ...]
    worker_types: tuple[str, ...]
    throughputs: FloatArray
    scale_factors: FloatArray
    num_workers: FloatArray
    priority_weights: FloatArray
    steps_remaining: FloatArray
    times_since_start: FloatArray
    deadlines: FloatArray
    costs: FloatArray
    entities: tuple[str, ...]
    entity_weights: Mapping[str, float]
    entity_policies: Mapping[str, EntityPolicy]
    colocated: Mapping[tuple[int, int], FloatArray] = field(default_factory=dict)
    previous: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    seed: int = 0
    configs: Configurations | None = None
    max_devices: FloatArray | None = None  # elastic: each job's most devices

    @staticmethod
    def create(
        job_ids: Sequence[str],
        worker_types: Sequence[str],
        throughputs: Sequence[Sequence[float]] | FloatArray,
        num_workers: Sequence[float] | FloatArray,
        *,
        scale_factors: Sequence[float] | FloatArray = (),
        priority_weights: Sequence[float] | FloatArray = (),
        steps_remaining: Sequence[float] | FloatArray = (),
        times_since_start: Sequence[float] | FloatArray = (),
        deadlines: Sequence[float] | FloatArray = (),
        costs: Sequence[float] | FloatArray = (),
        entities: Sequence[str] = (),
        entity_weights: Mapping[str, float] | None = None,
        entity_policies: Mapping[str, EntityPolicy] | None = None,
        colocated: Mapping[tuple[int, int], FloatArray] | None = None,
        previous: Mapping[str, Mapping[str, float]] | None = None,
        seed: int = 0,
        configs: Configurations | None = None,
        max_devices: Sequence[float] | FloatArray = (),
    ) -> PolicyInput:
        """Build an input with defaults: scale factor 1, weight 1, 1 step left, no SLO,
        cost 1 per device-hour, every job in one entity "default" of weight 1."""
        m, n = len(job_ids), len(worker_types)
        t = np.asarray(throughputs, dtype=np.float64).reshape(m, n)
        jobs_entities = tuple(entities) if entities else ("default",) * m
        if len(jobs_entities) != m:
            raise ValueError(f"expected {m} entities, got {len(jobs_entities)}")
        weights = dict(entity_weights or {})
        for entity in jobs_entities:
            weights.setdefault(entity, 1.0)
        return PolicyInput(
            job_ids=tuple(job_ids),
            worker_types=tuple(worker_types),
            throughputs=t,
            scale_factors=_array(scale_factors, m, 1.0),
            num_workers=_array(num_workers, n, 0.0),
            priority_weights=_array(priority_weights, m, 1.0),
            steps_remaining=_array(steps_remaining, m, 1.0),
            times_since_start=_array(times_since_start, m, 0.0),
            deadlines=_array(deadlines, m, math.inf),
            costs=_array(costs, n, 1.0),
            entities=jobs_entities,
            entity_weights=weights,
            entity_policies=dict(entity_policies or {}),
            colocated=dict(colocated or {}),
            previous=dict(previous or {}),
            seed=seed,
            configs=configs,
            max_devices=_array(max_devices, m, 1.0) if configs is not None else None,
        )

    @property
    def num_jobs(self) -> int:
        return len(self.job_ids)

    @property
    def elastic(self) -> bool:
        return self.configs is not None

    @property
    def num_types(self) -> int:
        return len(self.worker_types)

    def equal_share(self) -> FloatArray:
        """Gavel's X_equal: every job gets each type in proportion to its count, rows summing
        to 1 (the time-averaged view of an equal split; any common factor leaves the
        max-min optimum unchanged)."""
        total = float(self.num_workers.sum())
        share = self.num_workers / total if total > 0 else np.zeros(self.num_types)
        return np.tile(share, (self.num_jobs, 1))

    def equal_share_throughputs(self, throughputs: FloatArray | None = None) -> FloatArray:
        """throughput(m, X_equal) for every job (1e-12 where a job can run nowhere)."""
        t = self.throughputs if throughputs is None else throughputs
        out: FloatArray = np.maximum((t * self.equal_share()).sum(axis=1), 1e-12)
        return out


@dataclass(frozen=True)
class Allocation:
    """X over job combinations: fractions[k, j] for combos[k] (job ids; one or two)."""

    worker_types: tuple[str, ...]
    combos: tuple[tuple[str, ...], ...]
    fractions: FloatArray

    @staticmethod
    def singles(inp: PolicyInput, x: FloatArray) -> Allocation:
        """An allocation with one row per job, clipped into [0, 1]."""
        return Allocation(
            inp.worker_types,
            tuple((j,) for j in inp.job_ids),
            np.clip(np.asarray(x, dtype=np.float64).reshape(inp.num_jobs, inp.num_types), 0, 1),
        )

    @staticmethod
    def empty(worker_types: Sequence[str]) -> Allocation:
        return Allocation(tuple(worker_types), (), np.zeros((0, len(worker_types))))

    def as_dict(self) -> dict[tuple[str, ...], dict[str, float]]:
        return {
            combo: {t: float(v) for t, v in zip(self.worker_types, row, strict=True)}
            for combo, row in zip(self.combos, self.fractions, strict=True)
        }

    def job_totals(self) -> dict[str, dict[str, float]]:
        """Each job's time share per type, summed over the combinations that hold it."""
        out: dict[str, dict[str, float]] = {}
        for combo, row in zip(self.combos, self.fractions, strict=True):
            for job in combo:
                into = out.setdefault(job, dict.fromkeys(self.worker_types, 0.0))
                for t, v in zip(self.worker_types, row, strict=True):
                    into[t] += float(v)
        return out

    def effective_throughputs(self, inp: PolicyInput) -> FloatArray:
        """throughput(m, X) of every job of `inp` under this allocation."""
        index = {job: i for i, job in enumerate(inp.job_ids)}
        types = {t: j for j, t in enumerate(inp.worker_types)}
        out = np.zeros(inp.num_jobs)
        for combo, row in zip(self.combos, self.fractions, strict=True):
            for pos, job in enumerate(combo):
                for t, v in zip(self.worker_types, row, strict=True):
                    j = types[t]
                    if len(combo) == 1:
                        rate = inp.throughputs[index[job], j]
                    else:
                        a, b = index[combo[0]], index[combo[1]]
                        rate = inp.colocated[(a, b)][j, pos]
                    out[index[job]] += rate * v
        return out


class Policy(abc.ABC):
    """A scheduling policy: PolicyInput -> Allocation.

    `heterogeneity_aware` tells the mechanism whether the policy knows which
    type is faster (Gavel shuffles the type order for agnostic policies);
    `skip_zero_priority` makes the mechanism leave idle devices idle rather
    than fill them with jobs the policy gave nothing (Gavel does so for FIFO).
    """

    name: str = "policy"
    problem_class: ClassVar[ProblemClass] = "lp"
    heterogeneity_aware: bool = True
    skip_zero_priority: ClassVar[bool] = False
    has_elastic_form: ClassVar[bool] = False
    # Why a policy without an elastic form has none (docs/concepts/policies.md), said in the
    # refusal of an elastic allocator by this name.
    no_elastic_form_because: ClassVar[str] = "it is not written over device configurations"

    @abc.abstractmethod
    def solve(self, inp: PolicyInput) -> Allocation:
        """The allocation for `inp`; raises PolicyError when it cannot compute one."""

    def solve_elastic(self, inp: PolicyInput) -> ElasticAllocation:
        """Time shares of configurations for an elastic input (inp.configs is set)."""
        raise PolicyError(f"{self.name} has no elastic form")

    def allocate_elastic(self, inp: PolicyInput) -> ElasticAllocation:
        """solve_elastic(), with the empty cases handled once for every policy."""
        if inp.configs is None:
            raise ValueError("allocate_elastic needs an input with configurations")
        if (
            inp.num_jobs == 0
            or inp.configs.num_rows == 0
            or float(inp.num_workers.sum()) <= 0
            or not np.any(inp.configs.rates > 0)
        ):
            return ElasticAllocation.empty(inp.worker_types, inp.job_ids)
        return self.solve_elastic(inp)

    def allocate(self, inp: PolicyInput) -> Allocation:
        """solve(), with the empty cases handled once for every policy: no job, no device, or
        no job that can run on the types present (an LP would be unbounded there)."""
        runnable = inp.throughputs * (inp.num_workers > 0)[None, :] > 0
        if (
            inp.num_jobs == 0
            or inp.num_types == 0
            or float(inp.num_workers.sum()) <= 0
            or not runnable.any()
        ):
            return Allocation(
                inp.worker_types,
                tuple((j,) for j in inp.job_ids),
                np.zeros((inp.num_jobs, inp.num_types)),
            )
        return self.solve(inp)


@dataclass(frozen=True)
class Combos:
    """Rows of X for space sharing: every job alone, then pairs of jobs with equal scale
    factors whose colocated throughputs are known (Gavel section 3.1).

    members[i, k] = 1 when job i is in combination k; rates[i] is an (K, n)
    array of job i's steps/s in every combination (0 where it is absent).
    """

    rows: tuple[tuple[int, ...], ...]
    scale_factors: FloatArray
    members: sp.csr_matrix
    rates: tuple[FloatArray, ...]

    @staticmethod
    def build(
        inp: PolicyInput, throughputs: FloatArray, space_sharing: bool, *, every_pair: bool = False
    ) -> Combos:
        """`every_pair` keeps a row for each pair of equal scale factors, even one that runs
        nowhere (Gavel's packed LPs have one: it changes which feasible point an interior-point
        solver returns, not the optimum)."""
        m, n = inp.num_jobs, inp.num_types
        rows: list[tuple[int, ...]] = [(i,) for i in range(m)]
        if space_sharing:
            for a in range(m):
                for b in range(a + 1, m):
                    pair = inp.colocated.get((a, b))
                    if inp.scale_factors[a] != inp.scale_factors[b]:
                        continue
                    if every_pair or (pair is not None and np.any(pair > 0)):
                        rows.append((a, b))
        k = len(rows)
        sf = np.array([inp.scale_factors[r[0]] for r in rows])
        data, ri, ci = [], [], []
        rates = [np.zeros((k, n)) for _ in range(m)]
        for idx, row in enumerate(rows):
            for pos, job in enumerate(row):
                data.append(1.0)
                ri.append(job)
                ci.append(idx)
                if len(row) == 1:
                    rates[job][idx] = throughputs[job]
                elif (pair := inp.colocated.get((row[0], row[1]))) is not None:
                    # A pair never beats its members' isolated speed on a type they cannot use.
                    rates[job][idx] = np.where(throughputs[job] > 0, pair[:, pos], 0.0)
        members = sp.csr_matrix((data, (ri, ci)), shape=(m, k))
        return Combos(tuple(rows), sf, members, tuple(rates))

    @property
    def singles_only(self) -> bool:
        return len(self.rows) == int(self.members.shape[0])

    def allocation(self, inp: PolicyInput, x: FloatArray) -> Allocation:
        combos = tuple(tuple(inp.job_ids[i] for i in row) for row in self.rows)
        return Allocation(inp.worker_types, combos, np.clip(x, 0.0, 1.0))


@dataclass(frozen=True)
class Groups:
    """Interchangeable jobs grouped into one row of X.

    Jobs with the same throughputs, scale factor and weight (and whatever else
    the caller adds to the key) are interchangeable; a max-min or sum objective
    has an optimum that treats them alike (average any optimum over their
    permutations: the constraints and objective are symmetric and convex), so
    they can share one row, counted `counts[g]` times in the capacity
    constraint. Gavel's own implementation groups jobs by type the same way.
    With 26 job types this turns a 2,048-row LP into one of a few dozen rows.
    """

    members: tuple[tuple[int, ...], ...]
    first: npt.NDArray[np.intp]
    counts: FloatArray

    @staticmethod
    def build(keys: Sequence[object]) -> Groups:
        groups: dict[object, list[int]] = {}
        for i, key in enumerate(keys):
            groups.setdefault(key, []).append(i)
        members = tuple(tuple(g) for g in groups.values())
        return Groups(
            members,
            np.array([g[0] for g in members], dtype=np.intp),
            np.array([len(g) for g in members], dtype=np.float64),
        )

    def __len__(self) -> int:
        return len(self.members)

    def expand(self, x: FloatArray, num_jobs: int) -> FloatArray:
        """Per-group rows back to per-job rows."""
        out = np.zeros((num_jobs, x.shape[1]))
        for g, members in enumerate(self.members):
            out[list(members)] = x[g]
        return out


def grouped_validity(x: cp.Variable, inp: PolicyInput, groups: Groups) -> list[cp.Constraint]:
    """The validity constraints for grouped rows (capacity counts every member)."""
    return [
        x >= 0,
        cp.sum(x, axis=1) <= 1,
        (groups.counts * inp.scale_factors[groups.first]) @ x <= inp.num_workers,
    ]


def validity_constraints(
    x: cp.Variable, inp: PolicyInput, combos: Combos | None = None
) -> list[cp.Constraint]:
    """Gavel's validity constraints on X (jobs x types, or combinations x types)."""
    # X <= 1 is implied by X >= 0 and the row sums; leaving it out halves the solve time.
    if combos is None or combos.singles_only:
        return [
            x >= 0,
            cp.sum(x, axis=1) <= 1,
            inp.scale_factors @ x <= inp.num_workers,
        ]
    return [
        x >= 0,
        combos.members @ cp.sum(x, axis=1) <= 1,
        combos.scale_factors @ x <= inp.num_workers,
    ]


def scaled_throughputs(
    x: cp.Variable, speeds: FloatArray, factor: FloatArray, combos: Combos | None = None
) -> cp.Expression:
    """factor[m] * throughput(m, X) for every job m, as one cvxpy vector.

    speeds[m, j] are the steps/s the policy reasons with (see job_speed_matrix);
    with space sharing, `combos` (built from the same speeds) adds each job's
    share of the combinations that hold it.
    """
    factor = np.asarray(factor, dtype=np.float64).reshape(-1)
    if combos is None or combos.singles_only:
        return cp.sum(cp.multiply(speeds * factor[:, None], x), axis=1)
    k, n = x.shape
    matrix = sp.vstack(
        [sp.csr_matrix(combos.rates[i].reshape(1, k * n) * factor[i]) for i in range(len(factor))]
    ).tocsr()
    return matrix @ cp.vec(x, order="C")


def agnostic_throughputs(throughputs: FloatArray) -> FloatArray:
    """Every type a job can run on counted as fast as its mean over those types."""
    runs = throughputs > 0
    count = np.maximum(runs.sum(axis=1, keepdims=True), 1)
    mean = np.where(runs, throughputs, 0.0).sum(axis=1, keepdims=True) / count
    return np.asarray(np.where(runs, mean, 0.0), dtype=np.float64)


def job_speed_matrix(inp: PolicyInput, heterogeneity_aware: bool) -> FloatArray:
    """The throughputs a policy reasons with: the real ones, or (heterogeneity-agnostic)
    1 wherever the job can run, so every type looks alike (Gavel's agnostic baselines).

    Elastic inputs are agnostic through their configuration rates (built with each
    job's mean speed on every type); their one-device rates follow suit."""
    if heterogeneity_aware:
        return inp.throughputs
    if inp.configs is not None:
        return agnostic_throughputs(inp.throughputs)
    return (inp.throughputs > 0).astype(np.float64)
