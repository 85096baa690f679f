"""The reconcile stage: the desired placements against the actual ones, as changes.

Pure: the daemon applies the changes (stop every moving job's tasks with a
checkpoint, then start the new placements; renew the leases of the others),
the simulator moves its clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gearshift.scheduler.mechanism import Device
from gearshift.scheduler.placement import Assignment

ChangeKind = Literal["start", "rescale", "preempt", "renew"]


@dataclass(frozen=True)
class Change:
    """What a round does to one job: `assignment` is its new placement (empty: none)."""

    job_id: str
    kind: ChangeKind
    assignment: Assignment = field(default_factory=list)


def same_assignment(want: Sequence[tuple[Device, int]], held: Sequence[tuple[Device, int]]) -> bool:
    """The same devices and ESTs: by identity first (the decision process hands a job kept
    on its devices its held assignment back), else item by item."""
    return want is held or list(want) == list(held)


def diff(desired: Mapping[str, Assignment], running: Mapping[str, Assignment]) -> list[Change]:
    """One change per job that runs or should run: start (not running, desired), renew (the
    same devices and ESTs), rescale (another placement), preempt (no longer desired).
    Running jobs first, in the given order, then the jobs to start."""
    out: list[Change] = []
    for job_id, held in running.items():
        want = desired.get(job_id)
        if want and same_assignment(want, held):
            out.append(Change(job_id, "renew", list(want)))
        elif want:
            out.append(Change(job_id, "rescale", list(want)))
        else:
            out.append(Change(job_id, "preempt"))
    for job_id, want in desired.items():
        if job_id not in running and want:
            out.append(Change(job_id, "start", list(want)))
    return out
