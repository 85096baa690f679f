"""Which rescales can be made in place, and the change that makes one (issue 47 step 2).

A rescale keeps a process when a device of the old placement is in the new one: the
process on it stays (under its new rank) and trains on, the old placement's other
processes leave, and the new placement's other devices get joining processes. With no
device kept, nothing survives and the job restarts from its checkpoint. Plain functions
over placements; not yet called by the rounds (the scheduler still restarts every
rescale: docs/concepts/in-place.md, *Not yet*).
"""

from __future__ import annotations

from gearshift.v1 import common_pb2, worker_pb2

JOINS = -1  # MembershipChange.sources: a process that joins


def _by_rank(placement: common_pb2.Placement) -> list[common_pb2.ProcessAssignment]:
    return sorted(placement.processes, key=lambda p: p.rank)


def in_place_change(
    old: common_pb2.Placement, new: common_pb2.Placement, generation: int, master_addr: str
) -> worker_pb2.MembershipChange | None:
    """The change from `old` to `new` as the job's `generation`, each new rank's source the
    old rank on the same (worker, device); None when no device is kept (a restart)."""
    old_rank = {(p.worker_id, p.device_index): p.rank for p in old.processes}
    processes = _by_rank(new)
    sources = [old_rank.get((p.worker_id, p.device_index), JOINS) for p in processes]
    if all(source == JOINS for source in sources):
        return None
    return worker_pb2.MembershipChange(
        generation=generation,
        mapping=[len(p.est_ids) for p in processes],
        sources=sources,
        master_addr=master_addr if len(processes) > 1 else "",
    )


def joiners(new: common_pb2.Placement, change: worker_pb2.MembershipChange) -> dict[str, list[int]]:
    """The new ranks that join, by the worker that starts them (StartTask join_generation)."""
    out: dict[str, list[int]] = {}
    for process, source in zip(_by_rank(new), change.sources, strict=True):
        if source == JOINS:
            out.setdefault(process.worker_id, []).append(process.rank)
    return out
