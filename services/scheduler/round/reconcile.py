"""The reconcile stage: the desired placements against the actual ones, as changes.

Pure: the daemon applies the changes (stop every moving job's tasks with a
checkpoint, then start the new placements; renew the leases of the others),
the simulator moves its clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gearshift.scheduler.types import Assignment, Device

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


def starts_past(changes: Sequence[Change], starts: int) -> list[str]:
    """The jobs whose starts come past the first `starts`: those the bound holds back."""
    return [c.job_id for c in changes if c.kind == "start"][starts:]


def hold_back(
    changes: Sequence[Change], running: Mapping[str, Assignment], starts: int
) -> tuple[list[Change], int]:
    """The changes with at most `starts` starts, the first in order; the starts past them
    wait for a later round and so do the preemptions that only made room for them (those
    jobs renew instead: a job stopped for devices nobody takes this round would leave them
    idle). A preemption is kept when a kept start or a rescale needs one of its devices, or
    when the job holds none. Returns the changes to apply and the number of starts held
    back."""
    later = set(starts_past(changes, starts))
    if not later:
        return list(changes), 0
    wanted = {
        device
        for c in changes
        if c.kind == "rescale" or (c.kind == "start" and c.job_id not in later)
        for device, _ in c.assignment
    }
    out: list[Change] = []
    for c in changes:
        if c.job_id in later:
            continue
        held = running.get(c.job_id, [])
        if c.kind == "preempt" and held and not any(device in wanted for device, _ in held):
            out.append(Change(c.job_id, "renew", list(held)))
        else:
            out.append(c)
    return out, len(later)
