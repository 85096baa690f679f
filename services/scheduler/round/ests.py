"""The EST model of an elastic job, shared by every allocator: its rate on a set of devices
(EasyScale's Eq. 1 planner, gearshift.common.estplan), the device configurations worth
running it on, and how its ESTs split over the devices a target names (`split_ests`).

Moved here from the EasyScale and Gavel plugins, which both build on it (as does Rubick):
the plugins import the round's model, never one another.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from gearshift.common.estplan import EstPlan, plan_on
from gearshift.scheduler.types import Config, JobSnapshot, config_of

_CACHE_SIZE = 4096
_RATES: dict[Hashable, float] = {}

# Mixed-type configurations are enumerated in full up to this many devices; larger
# jobs mix only device counts that are worth having on one type.
FULL_MIX_DEVICES = 16

_CONFIGURATIONS: dict[Hashable, list[tuple[Config, float]]] = {}
_MEMO_SIZE = 1 << 14
_SPLITS: dict[Hashable, dict[str, tuple[int, ...]]] = {}


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


def elastic_job(job: JobSnapshot) -> ElasticJob:
    """The elastic model of the job (types it may not use have capability 0)."""
    return ElasticJob(
        job_id=job.job_id,
        num_ests=job.num_ests,
        min_devices=job.min_devices,
        max_devices=job.max_devices,
        capability={t: (c if t in job.types else 0.0) for t, c in job.capability.items()},
        arrival_time=job.arrival_time,
        efficiency=job.efficiency,
        type_efficiency=job.type_efficiency,
        mixing=job.mixing,
        slowdown=job.slowdown,
    )


def split_ests(job: ElasticJob, config: Config) -> dict[str, tuple[int, ...]]:
    """ESTs per device of each type for `config`, by EasyScale's planner. Memoized on
    what decides it (the job's kind, `ElasticJob.key`): a round splits every chosen job."""
    key = (job.key, config)
    split = _SPLITS.get(key)
    if split is None:
        if len(_SPLITS) >= _MEMO_SIZE:
            _SPLITS.clear()
        capability = {t: job.capability.get(t, 0.0) or 1.0 for t, _ in config}
        plan = plan_on(job.num_ests, dict(config), capability)
        split = _SPLITS[key] = {p.accelerator_type: p.ests_per_device for p in plan.placements}
    return dict(split)
