"""From "these devices, this many ESTs on each" to the Placement a job's processes run with.

One process per device, ranks in the order given (rank 0 first, so its worker
hosts the torch.distributed store); ESTs are numbered consecutively across
ranks, so EST ids depend only on the per-device counts. Elastic jobs may mix
types (EasyScale); rigid jobs get one type.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gearshift.scheduler.mechanism import Device
from gearshift.v1 import common_pb2


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
