"""Why the round left a job waiting, or moved or preempted it: plain functions over the
round's plain data (the snapshot, the decision, what ran before), so that the daemon and a
test ask the same question. A plugin that knows more (a tenant's guarantee) offers its
reasons through round/hooks.py (`Explains`); the round never names it.

Waiting reasons hold while a job waits and are cleared once it runs; move reasons (why it
was preempted, moved, restarted or shares its devices) stay with the job until the next
change of reason, so that `gearshift job` still says who preempted it while it waits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gearshift.scheduler.types import Assignment, Device, JobSnapshot, Reason, Snapshot, Target

# Waiting: the job holds no devices because of it.
NO_FREE_DEVICE = "no_free_device"
TENANT_GUARANTEE = "tenant_guarantee"
GANG_NOT_FREE = "gang_not_free"
START_BOUND = "start_bound"
TYPE_LOCKED = "type_locked"
NOT_CHOSEN = "not_chosen"
# Moves: what the round did to a job that ran.
PREEMPTED = "preempted"
RESCALED = "rescaled"
LENT_DEVICE = "lent_device"
IN_BACKGROUND = "in_background"
PLAN_CHANGE = "plan_change"
OOM_RESTART = "oom_restart"
DEGRADED_WORKER = "degraded_worker"

WAITING = (NO_FREE_DEVICE, TENANT_GUARANTEE, GANG_NOT_FREE, START_BOUND, TYPE_LOCKED, NOT_CHOSEN)
MOVES = (
    PREEMPTED,
    RESCALED,
    LENT_DEVICE,
    IN_BACKGROUND,
    PLAN_CHANGE,
    OOM_RESTART,
    DEGRADED_WORKER,
)
CODES = WAITING + MOVES


@dataclass(frozen=True)
class Context:
    """What the round knows beyond the snapshot: the objective's name, its priorities (empty
    when the allocator does not rank), each job's locked type (D0/D1) and accepted types
    (empty: any), the start bound, and each job's memory factor (doubled at each
    out-of-memory failure)."""

    objective: str
    priorities: Mapping[str, float] = field(default_factory=dict)
    locked: Mapping[str, str] = field(default_factory=dict)
    accepted: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    max_starts: int = 0
    memory_factor: Mapping[str, int] = field(default_factory=dict)


def free_devices(devices: Iterable[Device], desired: Mapping[str, Assignment]) -> Counter[str]:
    """Devices no desired placement uses, by type."""
    used = {d for assignment in desired.values() for d, _ in assignment}
    return Counter(d.worker_type for d in devices if d not in used)


def counts_text(counts: Mapping[str, int], kinds: Sequence[str]) -> str:
    return ", ".join(f"{kind}: {counts.get(kind, 0)} free" for kind in kinds) or "none"


def _priority_text(priority: float | None) -> str:
    return "unranked" if priority is None else f"{priority:.3g}"


def waiting_reason(
    job: JobSnapshot, free: Mapping[str, int], capacity: Mapping[str, int], context: Context
) -> Reason:
    """Why a job that asked for devices got none: its accepted types have no free device, or
    fewer than its gang, or only other types are free and D0/D1 keeps it on its first, or the
    objective chose others though devices were free."""
    need = job.min_devices
    accepted = context.accepted.get(job.job_id) or tuple(sorted(capacity))
    kinds = list(accepted)  # those the cluster lacks too: 0 free
    locked = context.locked.get(job.job_id, "")
    usable = [k for k in job.types if k in capacity]
    room = (
        sum(free.get(k, 0) for k in usable)
        if job.mixing
        else max((free.get(k, 0) for k in usable), default=0)
    )
    facts = {"types": ",".join(kinds), "free": counts_text(free, kinds), "devices": str(need)}
    if locked and room < need:
        others = sum(free.get(k, 0) for k in kinds if k != locked)
        if others >= need:
            return Reason(
                TYPE_LOCKED,
                f"kept on its first type {locked} (D0/D1 keep a job on one type); "
                f"{free.get(locked, 0)} {locked} free, {others} of other accepted types",
                facts | {"locked_type": locked},
                locked,
            )
    if not kinds:
        return Reason(NO_FREE_DEVICE, "no live worker offers a device yet", facts, "")
    if room == 0:
        return Reason(
            NO_FREE_DEVICE,
            f"no free device of an accepted type ({counts_text(free, kinds)})",
            facts,
            ",".join(kinds),
        )
    if room < need:
        return Reason(
            GANG_NOT_FREE,
            f"a gang of {need} devices is not yet free ({counts_text(free, kinds)})",
            facts,
            str(need),
        )
    priority = context.priorities.get(job.job_id)
    return Reason(
        NOT_CHOSEN,
        f"{context.objective} chose other jobs this round (its priority "
        f"{_priority_text(priority)}; {counts_text(free, kinds)})",
        facts | {"objective": context.objective, "priority": _priority_text(priority)},
        context.objective,
    )


def _waiting(
    job: JobSnapshot,
    free: Mapping[str, int],
    capacity: Mapping[str, int],
    context: Context,
    seen: dict[tuple[object, ...], Reason],
) -> Reason:
    """waiting_reason, shared by the jobs of one kind (a reason that names no priority)."""
    job_id = job.job_id
    key: tuple[object, ...] = (job.types, job.min_devices, job.mixing)
    key += (context.locked.get(job_id, ""), context.accepted.get(job_id, ()))
    reason = seen.get(key)
    if reason is None or reason.code == NOT_CHOSEN:
        reason = seen[key] = waiting_reason(job, free, capacity, context)
    return reason


def held_back(starts: Sequence[str], bound: int) -> Reason:
    """A start the round's start bound left to the next round."""
    return Reason(
        START_BOUND,
        f"held back by the round's start bound (round.maxStarts = {bound}); "
        f"{len(starts)} started first",
        {"max_starts": str(bound)},
        str(bound),
    )


def preempted_reason(
    job_id: str,
    held: Assignment,
    desired: Mapping[str, Assignment],
    context: Context,
) -> Reason:
    """Which job took the preempted job's devices (the highest-ranked of them), under which
    objective, with the two priorities."""
    mine = {d for d, _ in held}
    takers = sorted(
        (j for j, assignment in desired.items() if any(d in mine for d, _ in assignment)),
        key=lambda j: (-context.priorities.get(j, 0.0), j),
    )
    own = context.priorities.get(job_id)
    facts = {"objective": context.objective, "priority": _priority_text(own)}
    if not takers:
        return Reason(
            PREEMPTED,
            f"preempted under {context.objective} (priority {_priority_text(own)}); "
            "its devices were given up",
            facts,
            "",
        )
    by = takers[0]
    theirs = context.priorities.get(by)
    return Reason(
        PREEMPTED,
        f"preempted by {by} under {context.objective} "
        f"(priority {_priority_text(theirs)} against its {_priority_text(own)})",
        facts | {"by": by, "by_priority": _priority_text(theirs)},
        by,
    )


def moved_reason(
    job: JobSnapshot,
    held: Assignment,
    want: Assignment,
    *,
    avoid: frozenset[str],
    context: Context,
    restart: str = "",
) -> Reason:
    """Why a running job moves: off a degraded worker, a new execution plan (Rubick) or
    resource plan (DLRover) that restarts it (`restart`: the reconcile's words), or the
    objective's new share for it."""
    off = sorted({d.worker_id for d, _ in held} - {d.worker_id for d, _ in want} & avoid)
    if off:
        return Reason(
            DEGRADED_WORKER,
            f"moved off degraded worker {', '.join(off)} (a straggler ran there)",
            {"workers": ",".join(off)},
            ",".join(off),
        )
    if restart:  # the reconcile's words, e.g. "restarting with a new execution plan"
        said = restart.replace("restarting", "restarted", 1)
        return Reason(PLAN_CHANGE, said, {"restart": restart}, restart)
    before, after = len({d for d, _ in held}), len({d for d, _ in want})
    return Reason(
        RESCALED,
        f"moved from {before} to {after} devices under {context.objective}",
        {"objective": context.objective, "from": str(before), "to": str(after)},
        f"{before}->{after}",
    )


def collocation_reason(target: Target) -> Reason | None:
    """A foreground job lends its devices' idle time to a background job (DeepPool)."""
    partner = target.partners[0] if target.partners else ""
    if target.role == "foreground":
        return Reason(
            LENT_DEVICE,
            f"its devices' idle time is lent to background job {partner}",
            {"background": partner},
            partner,
        )
    if target.role == "background":
        return Reason(
            IN_BACKGROUND,
            f"runs in the background on {partner}'s devices (paused when it slows {partner})",
            {"foreground": partner},
            partner,
        )
    return None


def oom_reason(factor: int) -> Reason:
    return Reason(
        OOM_RESTART,
        f"restarted after running out of memory, with {factor}x its memory share",
        {"memory_factor": str(factor)},
        str(factor),
    )


@dataclass(frozen=True)
class Outcome:
    """What the reconcile decided: the jobs it starts, moves and preempts, those whose start
    the bound held back, and why a job kept on its devices restarts (job -> the reconcile's
    words)."""

    started: Sequence[str] = ()
    moved: Sequence[str] = ()
    preempted: Sequence[str] = ()
    held_back: Sequence[str] = ()
    restarts: Mapping[str, str] = field(default_factory=dict)


def explain(
    snapshot: Snapshot,
    targets: Mapping[str, Target],
    desired: Mapping[str, Assignment],
    current: Mapping[str, Assignment],
    *,
    outcome: Outcome,
    context: Context,
    offered: Mapping[str, Reason] | None = None,
) -> dict[str, Reason]:
    """Every job the round left waiting, or moved, preempted, restarted or collocated, with
    its reason. `offered` are a plugin's reasons for the jobs it left waiting (Explains):
    they replace the generic waiting reason."""
    offered = offered or {}
    free = free_devices(
        snapshot.devices, {j: a for j, a in desired.items() if j not in set(outcome.held_back)}
    )
    capacity = snapshot.capacity
    out: dict[str, Reason] = {}
    held = set(outcome.held_back)
    seen: dict[tuple[object, ...], Reason] = {}  # thousands of waiting jobs, a few kinds
    started_first = [j for j in outcome.started if j not in held]
    for job in snapshot.jobs:
        job_id = job.job_id
        if job_id in held:
            out[job_id] = held_back(started_first, context.max_starts)
        elif not desired.get(job_id) and job_id not in current:
            out[job_id] = offered.get(job_id) or _waiting(job, free, capacity, context, seen)
    for job_id in outcome.preempted:
        out[job_id] = preempted_reason(job_id, current.get(job_id, []), desired, context)
    by_id = {job.job_id: job for job in snapshot.jobs}
    for job_id in outcome.moved:
        if job_id in by_id:
            out[job_id] = moved_reason(
                by_id[job_id],
                current.get(job_id, []),
                desired.get(job_id, []),
                avoid=snapshot.avoid,
                context=context,
                restart=outcome.restarts.get(job_id, ""),
            )
    for job_id in outcome.started:
        factor = context.memory_factor.get(job_id, 1)
        if job_id not in held and factor > 1:
            out[job_id] = oom_reason(factor)
    for job_id, target in targets.items():
        if job_id in desired and job_id not in out:
            reason = collocation_reason(target)
            if reason is not None:
                out[job_id] = reason
    return out


def queue_order(
    snapshot: Snapshot, waiting: Iterable[str], priorities: Mapping[str, float]
) -> dict[str, int]:
    """The waiting jobs' positions (from 1): by the objective's priority where it ranks them
    (highest first), then by arrival."""
    order = {job.job_id: i for i, job in enumerate(snapshot.jobs)}
    ids = sorted(
        (j for j in waiting if j in order),
        key=lambda j: (-priorities.get(j, 0.0), order[j]),
    )
    return {job_id: i + 1 for i, job_id in enumerate(ids)}


def carry(before: Reason | None, now: Reason | None, running: bool) -> Reason | None:
    """The job's reason after this round: this round's, else a move reason kept (it still
    explains the last move; a preempted job's while it waits, until it runs again), else
    none once it runs."""
    if now is not None:
        if before is not None and before.code == PREEMPTED and not running and now.code in WAITING:
            return before  # who preempted it says more than what it waits for now
        return now
    if before is not None and before.code == PREEMPTED:
        return None if running else before  # running again: its wait is over
    if before is not None and before.code in MOVES:
        return before
    return None if running else before
