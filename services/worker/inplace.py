"""The worker daemon's side of in-place membership changes (runtime/membership.py).

The scheduler sends a change as a MembershipChange (ChangeMembership to the tasks that
run, StartTask with join_generation to the processes that join); the daemon turns it into
the runtime's Change, checks it against what the task runs, and writes the task's list of
changes to the membership file that its processes read at every global step. Plain data
and checks: the Task keeps the file and the ranks its processes have (tasks.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gearshift.common.errors import ValidationError
from gearshift.v1 import worker_pb2
from gearshift.worker.runtime.membership import Change

MEMBERSHIP_FILE = "membership.json"  # in the task's folder
DEFAULT_TIMEOUT_S = 60.0


def to_change(message: worker_pb2.MembershipChange, field: str) -> Change:
    """The runtime's Change of `message`; ValidationError names `field`'s bad part."""
    if message.generation < 1:
        raise ValidationError(f"{field}.generation", f"must be >= 1 (got {message.generation})")
    if any(source < -1 for source in message.sources):
        raise ValidationError(f"{field}.sources", "must be old ranks, or -1 for a joiner")
    if not message.timeout_seconds >= 0:
        raise ValidationError(f"{field}.timeout_seconds", "must be >= 0 (0: 60)")
    if message.at_step < 0:
        raise ValidationError(f"{field}.at_step", f"must be >= 0 (got {message.at_step})")
    return Change(
        generation=message.generation,
        mapping=tuple(message.mapping),
        sources=tuple(None if source < 0 else source for source in message.sources),
        master_addr=message.master_addr,
        at_step=message.at_step,
        timeout_s=message.timeout_seconds or DEFAULT_TIMEOUT_S,
    )


def check(change: Change, num_ests: int, old_procs: int, field: str) -> None:
    """`change` applies to a job of `num_ests` ESTs on `old_procs` processes."""
    try:
        change.check(num_ests, old_procs)
    except ValidationError as exc:  # the runtime names its flag; a request names its field
        raise ValidationError(field, exc.problem.partition(": ")[2] or exc.problem) from None


def check_join(change: Change, mapping: Sequence[int], ranks: Sequence[int], field: str) -> None:
    """The processes of a StartTask with join_generation join `change` as `ranks`."""
    check(change, sum(change.mapping), max(s for s in change.sources if s is not None) + 1, field)
    if tuple(mapping) != change.mapping:
        raise ValidationError(
            field, f"maps ESTs {list(change.mapping)}, the placement {list(mapping)}"
        )
    for rank in ranks:
        if change.sources[rank] is not None:
            raise ValidationError(
                field, f"rank {rank} is old rank {change.sources[rank]}'s, not a joiner's"
            )


def moved(ranks: Mapping[int, int | None], change: Change) -> dict[int, int | None]:
    """Each process's rank after `change` (by the rank it started as; None: it left)."""
    return {slot: None if rank is None else change.new_rank(rank) for slot, rank in ranks.items()}
