"""Elastic EST jobs (EasyScale sections 3.3-3.4): how many devices of which types each job gets.

A job has N ESTs (its logical data-parallel workers) and elastic bounds
[min_devices, max_devices]. Any device count within the bounds works, of one or
several accelerator types: the EST-to-device split comes from EasyScale's Eq. 1
planner (gearshift.common.estplan; the service asks the Brain's PlanEsts, which
runs the same function). A change is applied by the job checkpointing and
restarting on the new mapping (the service drives StopTask(checkpoint) then
StartTask(resume)); the simulator charges `rescale_seconds` for it.

Two inter-job policies share one interface (`ElasticPolicy.allocate`):

- `EasyScale` (the paper's greedy inter-job scheduler): every job first gets its
  minimum in arrival order (rigid jobs, min = max, get all N devices of one type
  or wait); then each job's intra-job scheduler proposes scale-outs - adding m
  devices of one type, m = 1.. (homogeneous increments), with the predicted
  speedup - and the inter-job scheduler keeps granting the proposal with the
  highest speedup per device (ties: more devices) until devices or proposals
  run out. `heterogeneous=False` restricts a job to one type (EasyScale_homo).
- `YarnCs` (the baseline, Apache YARN's capacity scheduler as in Philly): FIFO
  gang scheduling - a job waits until N devices of one type are free, takes the
  fastest such type, and keeps them until it completes; no job passes the head
  of the queue.

Throughput model. capability[t] is one EST's mini-batches per second on one
device of type t (Gavel's single-device throughput of the job type). Eq. 1 gives
N / f_overload mini-batches/s for a split; `efficiency(d)` scales it for the
communication of d devices (from Gavel's measured multi-GPU throughputs), so N
ESTs on N devices of one type run exactly as fast as Gavel's rigid job; a job's
`slowdown` divides it for the kernels its determinism level forces (EasyScale's
D2 costs ~2.36x on CNNs, ~1x on transformers).

Determinism decides where a job may run: D0/D1 hold bits only on one kind of
device, so such a job uses one type per placement and, once placed, only that
type (`types` is then the locked type alone); a D2 job (`mixing`) may span types
in one placement. `configurations` lists what a job may run on - the device
counts per type within its bounds that some use of its ESTs makes faster than
any smaller configuration - with their rates: the rows every heterogeneity-aware
objective allocates over (gearshift.scheduler.plugins.gavel.policies.configs).
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from gearshift.common.estplan import DeviceOffer, EstPlan, plan_on, scale_out_proposals
from gearshift.scheduler.plugins.gavel.policies.configs import Config, config_of

Devices = dict[str, int]


@dataclass(frozen=True)
class ElasticJob:
    """What the elastic policies know of a job."""

    job_id: str
    num_ests: int
    min_devices: int
    max_devices: int
    capability: Mapping[str, float]
    arrival_time: float = 0.0
    efficiency: Mapping[int, float] = field(default_factory=dict)
    mixing: bool = True  # may span several types in one placement (D2)
    slowdown: float = 1.0  # kernel cost of its determinism level (D2 on CNNs: ~2.36)
    type_efficiency: Mapping[str, Mapping[int, float]] = field(default_factory=dict)

    @property
    def rigid(self) -> bool:
        """Gang job: exactly max_devices devices of one type, or nothing."""
        return self.min_devices >= self.max_devices

    def types(self) -> list[str]:
        return sorted(t for t, c in self.capability.items() if c > 0)

    def scaling(self, count: int, devices: Mapping[str, int] | None = None) -> float:
        """Communication efficiency on `count` devices (1.0 when unknown): per type when
        measured per type (weighted by each type's share of `devices`), else overall."""
        if devices and self.type_efficiency:
            total = sum(devices.values())
            return sum(
                n / total * _at(self.type_efficiency.get(t, self.efficiency), count)
                for t, n in devices.items()
            )
        return _at(self.efficiency, count)

    @cached_property
    def key(self) -> Hashable:
        """Everything that decides the job's rates (not its id), as a hashable key."""
        return (
            self.num_ests,
            self.min_devices,
            self.max_devices,
            tuple(sorted(self.capability.items())),
            tuple(sorted(self.efficiency.items())),
            tuple(sorted((t, tuple(sorted(e.items()))) for t, e in self.type_efficiency.items())),
            self.mixing,
            self.slowdown,
        )

    @cached_property
    def most(self) -> int:
        """The most devices the job can use."""
        return max(1, min(self.max_devices, self.num_ests))


def _at(efficiency: Mapping[int, float], count: int) -> float:
    """The efficiency measured at the largest device count <= count (1.0 when none)."""
    known = [d for d in efficiency if d <= count]
    return efficiency[max(known)] if known else 1.0


def plan(job: ElasticJob, devices: Mapping[str, int]) -> EstPlan:
    """The Eq. 1 EST split of `job` over exactly these devices."""
    used = {t: n for t, n in devices.items() if n > 0}
    return plan_on(job.num_ests, used, job.capability)


_CACHE_SIZE = 4096
_RATES: dict[Hashable, float] = {}


def rate(job: ElasticJob, devices: Mapping[str, int]) -> float:
    """Predicted mini-batches/s of `job` on `devices` (0 with none). Memoized: the
    allocators ask for the same few configurations of the same kinds of job again and
    again."""
    used = {t: n for t, n in devices.items() if n > 0}
    if not used:
        return 0.0
    key = (job.key, config_of(used))
    value = _RATES.get(key)
    if value is None:
        if len(_RATES) >= 16 * _CACHE_SIZE:
            _RATES.clear()
        count = sum(used.values())
        value = _RATES[key] = (
            plan(job, used).minibatches_per_second * job.scaling(count, used) / job.slowdown
        )
    return value


# Mixed-type configurations are enumerated in full up to this many devices; larger
# jobs mix only device counts that are worth having on one type.
FULL_MIX_DEVICES = 16


_CONFIGURATIONS: dict[Hashable, list[tuple[Config, float]]] = {}


def configurations(job: ElasticJob, capacity: Mapping[str, int]) -> list[tuple[Config, float]]:
    """The configurations `job` may run on in a cluster of `capacity`, with their rates.

    A configuration is kept only when no configuration using a subset of its devices
    is at least as fast (so a device that would not speed the job up is never asked
    for). A rigid job has its max_devices on one type. Sorted by size, then rate.
    Memoized: jobs of one kind share their rows, and a round asks for every job's.
    """
    key = (job.key, tuple(sorted(capacity.items())))
    cached = _CONFIGURATIONS.get(key)
    if cached is None:
        if len(_CONFIGURATIONS) >= _CACHE_SIZE:
            _CONFIGURATIONS.clear()
        cached = _CONFIGURATIONS[key] = _configurations(job, capacity)
    return list(cached)


def _configurations(job: ElasticJob, capacity: Mapping[str, int]) -> list[tuple[Config, float]]:
    types = [t for t in job.types() if capacity.get(t, 0) > 0]
    if job.rigid:
        need = job.max_devices
        return [(((t, need),), rate(job, {t: need})) for t in types if capacity[t] >= need]
    low, high = max(job.min_devices, 1), job.most
    useful = _useful_counts(job.num_ests, high)
    candidates: set[Config] = set()
    for t in types:
        for k in range(low, min(high, capacity[t]) + 1):
            candidates.add(((t, k),))
    if job.mixing and len(types) > 1:
        for size in range(2, min(len(types), high) + 1):
            for kinds in itertools.combinations(types, size):
                ranges = [
                    range(1, min(capacity[t], high) + 1)
                    if high <= FULL_MIX_DEVICES
                    else [k for k in useful if k <= capacity[t]]
                    for t in kinds
                ]
                for counts in itertools.product(*ranges):
                    if low <= sum(counts) <= high:
                        candidates.add(config_of(dict(zip(kinds, counts, strict=True))))
    # Ties broken by the configuration itself: a set's order changes with the process's
    # string hashing, and the decision must not (decider.py decides in another process).
    rated = sorted(
        ((c, rate(job, dict(c))) for c in candidates),
        key=lambda item: (_size(item[0]), -item[1], item[0]),
    )
    kept: list[tuple[Config, float]] = []
    for config, value in rated:
        if value <= 0:
            continue
        if not any(value <= other + 1e-12 and _within(small, config) for small, other in kept):
            kept.append((config, value))
    return kept


def _size(config: Config) -> int:
    return sum(n for _, n in config)


def _within(small: Config, big: Config) -> bool:
    """Whether `small` uses no more devices of any type than `big`."""
    have = dict(big)
    return all(have.get(t, 0) >= n for t, n in small)


def _useful_counts(num_ests: int, high: int) -> list[int]:
    """Device counts at which N ESTs spread evenly step faster than on one device fewer."""
    out = [k for k in range(1, high + 1) if k == 1 or -(-num_ests // k) < -(-num_ests // (k - 1))]
    return out


class ElasticPolicy(abc.ABC):
    """Devices per type for every job, given the capacity and the current assignment."""

    name: str = "elastic"

    @abc.abstractmethod
    def allocate(
        self,
        jobs: Sequence[ElasticJob],
        capacity: Mapping[str, int],
        current: Mapping[str, Mapping[str, int]],
    ) -> dict[str, Devices]:
        """jobs are in arrival order; the result omits jobs that get nothing."""


def _take(free: dict[str, int], devices: Mapping[str, int]) -> None:
    for t, n in devices.items():
        free[t] -= n


def _start(job: ElasticJob, free: Mapping[str, int], heterogeneous: bool) -> Devices | None:
    """The job's minimum: the fastest placement with min_devices devices (all N of one type
    for a rigid job), or None when it does not fit."""
    need = max(job.min_devices, 1)
    options: list[Devices] = [{t: need} for t in job.types() if free.get(t, 0) >= need]
    if heterogeneous and not job.rigid and not options:
        mixed: Devices = {}
        left = need
        for t in sorted(job.types(), key=lambda t: -job.capability[t]):
            take = min(left, free.get(t, 0))
            if take > 0:
                mixed[t] = take
                left -= take
        if left == 0:
            options.append(mixed)
    if not options:
        return None
    return max(options, key=lambda d: (rate(job, d), -len(d)))


@dataclass(frozen=True)
class Proposal:
    """Add `devices` of one type to a job; `gain` is the speedup per added device."""

    job_id: str
    worker_type: str
    devices: int
    speedup: float

    @property
    def gain(self) -> float:
        return (self.speedup - 1.0) / self.devices


def proposals(
    job: ElasticJob,
    held: Mapping[str, int],
    free: Mapping[str, int],
    *,
    heterogeneous: bool,
    top_k: int = 3,
) -> list[Proposal]:
    """The intra-job scheduler's scale-out proposals (EasyScale Role-2), by speedup."""
    count = sum(held.values())
    room = min(job.max_devices, job.num_ests) - count
    if job.rigid or room <= 0 or count == 0:
        return []
    heterogeneous = heterogeneous and job.mixing
    # Every type the job can use is offered (0 available where it may not grow), so the
    # planner knows the speed of the devices it already holds.
    offers = [
        DeviceOffer(
            t,
            min(free.get(t, 0), room) if heterogeneous or held.get(t, 0) > 0 else 0,
            job.capability[t],
        )
        for t in job.types()
    ]
    base = rate(job, held)
    out: list[Proposal] = []
    for candidate in scale_out_proposals(job.num_ests, held, offers, top_k=len(offers) * room):
        grown = dict(held)
        grown[candidate.accelerator_type] = (
            grown.get(candidate.accelerator_type, 0) + candidate.additional_devices
        )
        speedup = rate(job, grown) / base if base > 0 else 0.0
        if speedup > 1.0 + 1e-9:
            out.append(
                Proposal(
                    job.job_id, candidate.accelerator_type, candidate.additional_devices, speedup
                )
            )
    out.sort(key=lambda p: (-p.speedup, p.devices, p.worker_type))
    return out[:top_k]


class EasyScale(ElasticPolicy):
    """EasyScale's greedy inter-job scheduler; see the module docstring."""

    name = "easyscale"

    def __init__(self, *, heterogeneous: bool = True, top_k: int = 3) -> None:
        self.heterogeneous = heterogeneous
        self.top_k = top_k
        if not heterogeneous:
            self.name = "easyscale_homo"

    def allocate(
        self,
        jobs: Sequence[ElasticJob],
        capacity: Mapping[str, int],
        current: Mapping[str, Mapping[str, int]],
    ) -> dict[str, Devices]:
        free = dict(capacity)
        out: dict[str, Devices] = {}
        for job in jobs:  # arrival order: everyone's minimum first
            start = _start(job, free, self.heterogeneous and job.mixing)
            if start is not None:
                out[job.job_id] = start
                _take(free, start)
        by_id = {job.job_id: job for job in jobs}
        while any(n > 0 for n in free.values()):
            pending: list[Proposal] = []
            for job_id, held in out.items():
                pending.extend(
                    proposals(
                        by_id[job_id],
                        held,
                        free,
                        heterogeneous=self.heterogeneous,
                        top_k=self.top_k,
                    )
                )
            if not pending:
                break
            best = max(pending, key=lambda p: (p.gain, p.devices, -_order(jobs, p.job_id)))
            held = out[best.job_id]
            held[best.worker_type] = held.get(best.worker_type, 0) + best.devices
            free[best.worker_type] -= best.devices
        return out


def _order(jobs: Sequence[ElasticJob], job_id: str) -> int:
    for i, job in enumerate(jobs):
        if job.job_id == job_id:
            return i
    return len(jobs)


class YarnCs(ElasticPolicy):
    """FIFO gang scheduling, non-preemptive; see the module docstring."""

    name = "yarn_cs"

    def allocate(
        self,
        jobs: Sequence[ElasticJob],
        capacity: Mapping[str, int],
        current: Mapping[str, Mapping[str, int]],
    ) -> dict[str, Devices]:
        free = dict(capacity)
        out: dict[str, Devices] = {}
        for job in jobs:  # running jobs keep their devices
            held = current.get(job.job_id)
            if held and sum(held.values()) > 0:
                out[job.job_id] = dict(held)
                _take(free, held)
        for job in jobs:
            if job.job_id in out:
                continue
            need = max(job.max_devices, 1)
            fits = [t for t in job.types() if free.get(t, 0) >= need]
            if not fits:
                break  # FIFO: nobody passes the head of the queue
            kind = max(fits, key=lambda t: (job.capability[t] * job.scaling(need), t))
            out[job.job_id] = {kind: need}
            free[kind] -= need
        return out


def make_elastic_policy(name: str) -> ElasticPolicy:
    """`easyscale` (heterogeneous), `easyscale_homo` or `yarn_cs`; ValueError otherwise."""
    if name in ("easyscale", "easyscale_heter"):
        return EasyScale()
    if name == "easyscale_homo":
        return EasyScale(heterogeneous=False)
    if name == "yarn_cs":
        return YarnCs()
    raise ValueError(f"unknown elastic policy {name!r}")


ELASTIC_POLICIES = ("easyscale", "easyscale_homo", "yarn_cs")
