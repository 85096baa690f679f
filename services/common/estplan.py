"""EST-to-device planning: EasyScale's Eq. 1, read with the per-type N_i factor.

Shared by the Brain (the PlanEsts RPC) and the scheduler (its simulator and
elastic policies), so both plan with the same function. Pure Python over plain
data: no NumPy, so the light client install could use it too.

Model. A job has N ESTs (maxP). A device of type i does C_i mini-batches per
second for this job. A global step ends when the most loaded device finishes,
so with a_d ESTs on device d the step takes f = max_d a_d / C_d seconds
(f_overload) and the job does N / f mini-batches per second. Eq. 1 writes the
same number as sum_i N_i*C_i - waste, where waste counts capability left idle
by the imbalance; with the N_i factor the two agree (the printed (1c) lacks it,
see shared/notes/easyscale.md).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_EPS = 1e-9


@dataclass(frozen=True)
class DeviceOffer:
    """Devices of one type that a job could get, and how fast one is for the job."""

    accelerator_type: str
    available: int
    minibatches_per_second: float


@dataclass(frozen=True)
class EstPlacement:
    """ESTs on the devices of one type: one entry per device."""

    accelerator_type: str
    ests_per_device: tuple[int, ...]

    @property
    def device_count(self) -> int:
        return len(self.ests_per_device)


@dataclass(frozen=True)
class EstPlan:
    """Chosen devices and ESTs per device, with the Eq. 1 prediction."""

    num_ests: int
    placements: tuple[EstPlacement, ...]
    minibatches_per_second: float

    @property
    def device_count(self) -> int:
        return sum(p.device_count for p in self.placements)

    @property
    def steps_per_second(self) -> float:
        return self.minibatches_per_second / self.num_ests

    def devices_by_type(self) -> dict[str, int]:
        return {p.accelerator_type: p.device_count for p in self.placements}

    def ests_per_device(self) -> list[int]:
        """ESTs per device in placement order (the process-rank order a launcher uses)."""
        return [a for p in self.placements for a in p.ests_per_device]


@dataclass(frozen=True)
class ScaleOutProposal:
    """Adding `additional_devices` devices of one type, and the speedup it would bring."""

    accelerator_type: str
    additional_devices: int
    speedup: float
    plan: EstPlan

    @property
    def speedup_per_device(self) -> float:
        return (self.speedup - 1.0) / self.additional_devices


def eq1_throughput(
    max_p: int,
    counts: Mapping[str, int],
    ests_per_device: Mapping[str, int],
    capability: Mapping[str, float],
) -> float:
    """EasyScale Eq. 1 (a)-(d) as written, with N_i in the waste term.

    counts[i] = N_i devices of type i, each given up to ests_per_device[i] = A_i
    ESTs; capability[i] = C_i mini-batches/s. Equals max_p / f_overload.
    """
    used = [t for t, n in counts.items() if n > 0]
    n_est = sum(counts[t] * ests_per_device[t] for t in used)  # (1a)
    if n_est < max_p:
        raise ValueError(f"{n_est} EST slots cannot hold maxP={max_p} ESTs")
    f_overload = max(ests_per_device[t] / capability[t] for t in used)  # (1b)
    waste = (
        sum(counts[t] * (capability[t] - ests_per_device[t] / f_overload) for t in used)
        + (n_est - max_p) / f_overload
    )  # (1c), with the N_i factor
    return sum(counts[t] * capability[t] for t in used) - waste  # (1d)


def step_time(ests_per_device: Sequence[int], capability: Sequence[float]) -> float:
    """f_overload: seconds per global step when device d holds ests_per_device[d] ESTs."""
    return max(a / c for a, c in zip(ests_per_device, capability, strict=True) if a > 0)


def assign(num_ests: int, capability: Sequence[float]) -> list[int]:
    """Spread num_ests ESTs over devices of the given speeds, at least one each, fastest step.

    One EST per device, then each further EST to the device that would finish
    it first; for unit-size work on machines of different speeds this greedy
    rule gives the smallest step time.
    """
    if num_ests < len(capability):
        raise ValueError(f"{num_ests} ESTs cannot cover {len(capability)} devices")
    load = [1] * len(capability)
    for _ in range(num_ests - len(capability)):
        best = min(range(len(capability)), key=lambda d: ((load[d] + 1) / capability[d], d))
        load[best] += 1
    return load


def _capacity(f: float, speed: float) -> int:
    return math.floor(f * speed + _EPS)


def _choose_devices(
    num_ests: int, offers: Sequence[DeviceOffer], f: float, limit: int
) -> list[DeviceOffer] | None:
    """The fewest devices (at most `limit`) that can hold every EST within step time f.

    Larger capacity first; among equal capacity the slower type, which wastes
    less of the cluster's capability for the same step time.
    """
    pool = sorted(
        ((offer, _capacity(f, offer.minibatches_per_second)) for offer in offers),
        key=lambda item: (-item[1], item[0].minibatches_per_second, item[0].accelerator_type),
    )
    chosen: list[DeviceOffer] = []
    held = 0
    for offer, capacity in pool:
        for _ in range(offer.available):
            if held >= num_ests or len(chosen) >= limit or capacity == 0:
                break
            chosen.append(offer)
            held += capacity
    return chosen if held >= num_ests else None


def _plan_for(num_ests: int, devices: Sequence[DeviceOffer]) -> EstPlan:
    order = sorted(devices, key=lambda o: (-o.minibatches_per_second, o.accelerator_type))
    loads = assign(num_ests, [o.minibatches_per_second for o in order])
    by_type: dict[str, list[int]] = {}
    for offer, load in zip(order, loads, strict=True):
        by_type.setdefault(offer.accelerator_type, []).append(load)
    placements = tuple(EstPlacement(t, tuple(sorted(a, reverse=True))) for t, a in by_type.items())
    f = step_time(loads, [o.minibatches_per_second for o in order])
    return EstPlan(num_ests, placements, num_ests / f)


def plan_ests(
    num_ests: int,
    offers: Sequence[DeviceOffer],
    *,
    min_devices: int = 1,
    max_devices: int | None = None,
) -> EstPlan | None:
    """The devices and EST split with the highest Eq. 1 throughput, using as few devices as
    reach it; None when the offers cannot give min_devices devices.

    The best step time is one of a/C_i (a ESTs on a device of type i); the
    smallest such time that the best `max_devices` devices can meet is found by
    bisection, then the fewest devices meeting it are chosen.
    """
    if num_ests < 1:
        raise ValueError(f"num_ests must be >= 1 (got {num_ests})")
    usable = [o for o in offers if o.available > 0 and o.minibatches_per_second > 0]
    limit = min(max_devices or num_ests, num_ests, sum(o.available for o in usable))
    if limit < max(min_devices, 1):
        return None
    candidates = sorted(
        {a / o.minibatches_per_second for o in usable for a in range(1, num_ests + 1)}
    )
    lo, hi = 0, len(candidates) - 1
    while lo < hi:  # smallest feasible step time; feasibility grows with f
        mid = (lo + hi) // 2
        if _choose_devices(num_ests, usable, candidates[mid], limit) is None:
            lo = mid + 1
        else:
            hi = mid
    chosen = _choose_devices(num_ests, usable, candidates[lo], limit)
    if chosen is None:
        return None
    if len(chosen) < min_devices:
        chosen = _top_up(chosen, usable, min_devices)
    return _plan_for(num_ests, chosen)


def _top_up(
    chosen: list[DeviceOffer], offers: Sequence[DeviceOffer], count: int
) -> list[DeviceOffer]:
    """Add the fastest remaining devices until there are `count` (the job's minimum)."""
    taken = {o.accelerator_type: 0 for o in offers}
    for offer in chosen:
        taken[offer.accelerator_type] += 1
    out = list(chosen)
    for offer in sorted(offers, key=lambda o: -o.minibatches_per_second):
        while len(out) < count and taken[offer.accelerator_type] < offer.available:
            out.append(offer)
            taken[offer.accelerator_type] += 1
    return out


def plan_on(num_ests: int, devices: Mapping[str, int], capability: Mapping[str, float]) -> EstPlan:
    """The best EST split over exactly these devices (all of them used)."""
    return _plan_on(num_ests, tuple((t, n, capability[t]) for t, n in devices.items()))


@functools.lru_cache(maxsize=8192)
def _plan_on(num_ests: int, devices: tuple[tuple[str, int, float], ...]) -> EstPlan:
    """Memoized (a plan is frozen): EasyScale's proposals ask for the same few splits for
    every job every round (the continuous-trace simulation spent 45% of its time here)."""
    chosen = [DeviceOffer(t, n, speed) for t, n, speed in devices for _ in range(n)]
    return _plan_for(num_ests, chosen)


def scale_out_proposals(
    num_ests: int,
    current: Mapping[str, int],
    extra: Sequence[DeviceOffer],
    top_k: int,
) -> list[ScaleOutProposal]:
    """EasyScale's intra-job proposals: add m devices of one type (homogeneous increments) to
    the current ones; the top_k by speedup (ties: fewer devices), only those that speed up.
    """
    capability = {o.accelerator_type: o.minibatches_per_second for o in extra}
    base_devices = {t: n for t, n in current.items() if n > 0}
    room = num_ests - sum(base_devices.values())
    if top_k <= 0 or room <= 0 or not base_devices:
        return []
    missing = set(base_devices) - set(capability)
    if missing:
        raise ValueError(f"no capability given for current device types {sorted(missing)}")
    base = plan_on(num_ests, base_devices, capability).minibatches_per_second
    proposals: list[ScaleOutProposal] = []
    for offer in extra:
        for m in range(1, min(offer.available, room) + 1):
            devices = dict(base_devices)
            devices[offer.accelerator_type] = devices.get(offer.accelerator_type, 0) + m
            plan = plan_on(num_ests, devices, capability)
            speedup = plan.minibatches_per_second / base
            if speedup > 1 + _EPS:
                proposals.append(ScaleOutProposal(offer.accelerator_type, m, speedup, plan))
    proposals.sort(key=lambda p: (-p.speedup, p.additional_devices, p.accelerator_type))
    return proposals[:top_k]
