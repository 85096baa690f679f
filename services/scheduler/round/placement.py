"""The place stage, and from "these devices, this many ESTs on each" to the Placement a
job's processes run with.

`place` maps every job's target (devices per type, ESTs per device) to devices:
largest targets first (as Gavel places decreasing scale factors); a job whose
target is what it holds keeps its devices and ESTs (its lease is renewed, no
restart); another takes the devices it holds that are still free, then the
fewest workers that fit the rest (`consolidate`, shared with Gavel's mechanism); a
target that names its workers (`Target.workers`) gets that many devices on each of them -
those it holds there first - and keeps its devices only if they match. Jobs sharing devices
(space sharing, a background job on its foreground's) are placed once, together:
the partner placed second takes the first one's devices (a background job the
first device of its type, which hosts the foreground's rank 0).

Degraded workers (a straggler ran there: gearshift.scheduler.plugins.dlrover.stragglers) are
avoided:
every target is placed first on the other workers' devices, a job held on a degraded
worker then moving off it; only the targets that do not fit there are placed again with
the degraded workers' devices (kept where they are when they can).

One process per device, ranks in the order given (rank 0 first, so its worker
hosts the torch.distributed store); ESTs are numbered consecutively across
ranks, so EST ids depend only on the per-device counts. Elastic D2 jobs may mix
types (EasyScale); the others get one type.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gearshift.scheduler.types import Assignment, Device, Target, config_of
from gearshift.v1 import common_pb2


def place(
    targets: Mapping[str, Target],
    devices: Iterable[Device],
    current: Mapping[str, Sequence[tuple[Device, int]]],
    avoid: frozenset[str] = frozenset(),
) -> dict[str, Assignment]:
    """Devices and ESTs for every target that fits, off the workers in `avoid` while
    another placement exists; see the module docstring."""
    devices = list(devices)
    if not avoid or not any(d.worker_id in avoid for d in devices):
        return _place(targets, devices, current)
    out = _place(targets, [d for d in devices if d.worker_id not in avoid], current)
    rest = {job_id: t for job_id, t in targets.items() if job_id not in out}
    if rest:
        used = {d for assignment in out.values() for d, _ in assignment}
        out.update(_place(rest, [d for d in devices if d not in used], current))
    return out


def _place(
    targets: Mapping[str, Target],
    devices: Iterable[Device],
    current: Mapping[str, Sequence[tuple[Device, int]]],
) -> dict[str, Assignment]:
    pools: dict[str, dict[str, list[Device]]] = {}
    for device in sorted(devices):
        pools.setdefault(device.worker_type, {}).setdefault(device.worker_id, []).append(device)
    order = sorted(targets.values(), key=lambda t: -t.size)  # stable: the allocator's order
    out: dict[str, Assignment] = {}
    for target in order:  # keep: same devices per type as now, all still free
        held = list(current.get(target.job_id, ()))
        if (
            held
            and target.role != "background"  # it follows its foreground, kept or moved
            # A pair shares one set of devices: once a partner kept its own, this job joins
            # it below (both keeping theirs would take two sets and crowd another job out).
            and not any(p in out for p in target.partners)
            and config_of(count_by_type(d for d, _ in held)) == target.devices
            and (not target.workers or _per_worker(d for d, _ in held) == dict(target.workers))
            and all(d in pools.get(d.worker_type, {}).get(d.worker_id, ()) for d, _ in held)
        ):
            out[target.job_id] = held
            _take(pools, [d for d, _ in held])
    for target in order:
        if target.job_id in out:
            continue
        shared = [p for p in target.partners if p in out]
        picked: list[Device] | None
        if shared:  # space sharing: the partner's devices, this job's ESTs
            picked = [d for d, _ in out[shared[0]]]
        elif target.role == "background":
            continue  # runs only on its foreground's devices, which did not fit
        else:
            mine = [d for d, _ in current.get(target.job_id, ())]
            picked = _pinned(pools, target, mine) if target.workers else None
            if picked is None:
                picked = _pick(pools, target, mine)
            if picked is None:
                continue
            _take(pools, picked)
        out[target.job_id] = assign_ests(picked, target.ests)
    return out


def _pick(
    pools: Mapping[str, Mapping[str, list[Device]]], target: Target, held: Sequence[Device]
) -> list[Device] | None:
    """The target's devices: those it holds that are free first, then consolidated. The
    pools are read, not copied (copied, each job placed copied every worker's free list:
    1,000 workers a job, 4% of a decision's CPU under bench/load.py); a worker with no free
    device never fits in `consolidate`, so the empty ones may stay."""
    picked: list[Device] = []
    for kind, count in target.devices:
        pool = pools.get(kind, {})
        mine = [d for d in held if d.worker_type == kind and d in pool.get(d.worker_id, ())]
        take = mine[:count]
        left = count - len(take)
        rest = consolidate(_without(pool, take), left) if left else ()
        if rest is None:
            return None
        picked.extend([*take, *rest])
    return picked


def _without(
    pool: Mapping[str, list[Device]], taken: Sequence[Device]
) -> Mapping[str, list[Device]]:
    """`pool` less the `taken` devices (a shallow copy only when some are taken)."""
    if not taken:
        return pool
    gone = set(taken)
    return {**pool} | {
        w: [d for d in pool[w] if d not in gone] for w in {d.worker_id for d in taken}
    }


def _per_worker(devices: Iterable[Device]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in devices:
        out[d.worker_id] = out.get(d.worker_id, 0) + 1
    return out


def _pinned(
    pools: Mapping[str, Mapping[str, list[Device]]], target: Target, held: Sequence[Device]
) -> list[Device] | None:
    """The target's devices on exactly its named workers (held ones first); None when a
    worker has too few free devices of the target's type."""
    if len(target.devices) != 1:
        return None
    kind = target.devices[0][0]
    picked: list[Device] = []
    for worker, count in target.workers:
        free = pools.get(kind, {}).get(worker, [])
        mine = [d for d in held if d.worker_id == worker and d in free]
        rest = [d for d in free if d not in mine]
        take = [*mine, *rest][:count]
        if len(take) < count:
            return None
        picked.extend(take)
    return picked if len(picked) == target.size else None


def _take(pools: dict[str, dict[str, list[Device]]], devices: Iterable[Device]) -> None:
    for device in devices:
        pools[device.worker_type][device.worker_id].remove(device)


def build_placement(assignments: Sequence[tuple[Device, int]]) -> common_pb2.Placement:
    """A Placement with one process per (device, ESTs) pair, in rank order."""
    placement = common_pb2.Placement()
    first = 0
    for rank, (device, count) in enumerate(assignments):
        if count < 1:
            raise ValueError(f"device {device} would hold {count} ESTs")
        placement.processes.add(
            rank=rank,
            worker_id=device.worker_id,
            accelerator_type=device.worker_type,
            device_index=device.index,
            est_ids=list(range(first, first + count)),
        )
        first += count
    return placement


def assign_ests(
    devices: Sequence[Device], split: Mapping[str, Sequence[int]]
) -> list[tuple[Device, int]]:
    """Pair devices with per-device EST counts, type by type, heaviest first.

    Devices are taken in the given order within each type (the caller orders
    them: kept devices first, then by worker); devices the split leaves out
    are not used.
    """
    out: list[tuple[Device, int]] = []
    for kind in sorted(split, key=lambda k: (-max(split[k], default=0), k)):
        pool = [d for d in devices if d.worker_type == kind]
        counts = sorted(split[kind], reverse=True)
        if len(counts) > len(pool):
            raise ValueError(f"split wants {len(counts)} {kind} devices, {len(pool)} given")
        out.extend(zip(pool, counts, strict=False))
    return out


def placement_devices(placement: common_pb2.Placement) -> list[Device]:
    """The devices a placement uses, in rank order."""
    return [
        Device(p.worker_id, p.device_index, p.accelerator_type)
        for p in sorted(placement.processes, key=lambda p: p.rank)
    ]


def local_ranks(placement: common_pb2.Placement, worker_id: str) -> list[int]:
    """The ranks a worker runs."""
    return sorted(p.rank for p in placement.processes if p.worker_id == worker_id)


def workers_of(placement: common_pb2.Placement) -> list[str]:
    """The workers of a placement, rank 0's first."""
    seen: list[str] = []
    for process in sorted(placement.processes, key=lambda p: p.rank):
        if process.worker_id not in seen:
            seen.append(process.worker_id)
    return seen


def same_devices(a: common_pb2.Placement, b: common_pb2.Placement) -> bool:
    """Whether two placements run the same ESTs on the same devices (lease renewal)."""

    def key(p: common_pb2.Placement) -> list[tuple[int, str, int, str, tuple[int, ...]]]:
        return sorted(
            (x.rank, x.worker_id, x.device_index, x.accelerator_type, tuple(x.est_ids))
            for x in p.processes
        )

    return key(a) == key(b)


def count_by_type(devices: Iterable[Device]) -> dict[str, int]:
    out: dict[str, int] = {}
    for device in devices:
        out[device.worker_type] = out.get(device.worker_type, 0) + 1
    return out


def consolidate(pool: Mapping[str, Sequence[Device]], size: int) -> tuple[Device, ...] | None:
    """`size` devices on as few workers as possible: the fullest-fitting worker alone if one
    can hold them all (best fit), else workers with the most free devices first.

    pool maps each worker to its free devices of one type.
    """
    best: str | None = None
    for worker, devices in pool.items():
        if len(devices) >= size and (
            best is None or (len(devices), worker) < (len(pool[best]), best)
        ):
            best = worker
    if best is not None:
        return tuple(pool[best][:size])
    picked: list[Device] = []
    for worker in sorted(pool, key=lambda w: (-len(pool[w]), w)):
        picked.extend(pool[worker][: size - len(picked)])
        if len(picked) == size:
            return tuple(picked)
    return None


def most_devices(spec: common_pb2.JobSpec) -> int:
    """The most devices a job can use: its max_devices (0: num_ests), at most num_ests."""
    most = spec.elastic.max_devices or spec.num_ests
    return max(1, min(most, max(spec.num_ests, 1)))
