"""Rescales applied in place (round.rescaleInPlace; docs/concepts/in-place.md).

A rescale that keeps at least one of a job's devices does not restart the job: the
processes on kept devices train on under their new ranks, the others leave at a step
boundary, and the new devices get processes that join (StartTask with join_generation),
the training state broadcast to them from a survivor. The round prepares the change
under its lock (`prepare`), sends it outside (`send`: the joiners' StartTask first, then
ChangeMembership to every running task of the job, all in flight at once), and records
it under the lock again. Anything that refuses or fails before the change is written
everywhere sends the job down the checkpoint-and-restart path instead; a change the
processes cannot complete stops them with a checkpoint (exit 75) and the job is requeued
and restarted like any stopped job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from gearshift.common.errors import rpc_details
from gearshift.common.jobspec import is_ps_job
from gearshift.scheduler.round.inplace_plan import JOINS, in_place_change, joiners
from gearshift.scheduler.round.placement import build_placement
from gearshift.scheduler.round.task_control import StartRequests, TaskControl
from gearshift.scheduler.state.records import JobRecord, TaskRecord
from gearshift.scheduler.state.state import SchedulerState
from gearshift.scheduler.types import Device
from gearshift.v1 import common_pb2, worker_pb2

C = common_pb2


@dataclass
class Prepared:
    """One job's in-place change, prepared under the lock."""

    job_id: str
    placement: common_pb2.Placement  # the new one, with its generation and rendezvous
    change: worker_pb2.MembershipChange
    running: list[TaskRecord]  # the job's running tasks, each told the change
    ranks: dict[str, tuple[int, ...]]  # running task id -> its processes' ranks after
    calls: list[tuple[str, worker_pb2.ChangeMembershipRequest]]
    joins: list[TaskRecord]  # the joining processes' tasks (saved)
    starts: StartRequests


def resizes_in_place(state: SchedulerState, job: JobRecord) -> bool:
    """Whether the job's resizes that keep its devices go in place (what the allocators
    weigh them at: JobSnapshot.resize_seconds); `refusal`'s lasting reasons."""
    return (
        state.settings.rescale_in_place
        and not state.has_holders(job)
        and not is_ps_job(job.spec)
        and not job.collocation.role
    )


def refusal(state: SchedulerState, job: JobRecord, tasks: Sequence[TaskRecord]) -> str:
    """Why the job cannot change in place now ("": it can), under the lock. The runtime
    restarts a job whose reads are acknowledged with checkpoints (a dynamic-mode job) and
    a parameter-server job has no ESTs to hand over; a collocated job's partner would
    change under it; tasks still starting have no step boundary to apply a change at."""
    if not resizes_in_place(state, job):
        return "in-place rescales are off, or the job restarts to change"
    if not job.placement.processes:
        return "the job runs nowhere"
    if not tasks or any(t.state != C.TASK_STATE_RUNNING for t in tasks):
        return "its tasks are not all running"
    workers = state.workers
    if any((w := workers.get(t.worker_id)) is None or not w.alive for t in tasks):
        return "a worker of its tasks is lost"
    return ""


def prepare(
    control: TaskControl,
    job: JobRecord,
    tasks: Sequence[TaskRecord],
    assignment: Sequence[tuple[Device, int]],
    cpus_per_device: int = 0,
) -> Prepared | None:
    """Under the lock: the change that moves `job` from its placement to `assignment` in
    place, its joiners' tasks saved; None when no device is kept (a restart). Call only
    when `refusal` has none."""
    state = control.state
    old = job.placement
    new = build_placement(assignment)
    generation = old.membership_generation + 1
    change = in_place_change(old, new, generation, "")
    if change is None:
        return None
    if len(new.processes) > 1:
        current = old.rendezvous_address or next(
            (t.rendezvous_address for t in tasks if 0 in t.local_ranks), ""
        )
        # rank 0 stays rank 0: it keeps serving its store (the next generation's keys have
        # their own prefix); otherwise the new rank 0 serves one on a port of its own
        stays = change.sources[0] == 0
        change.master_addr = current if stays and current else control.rendezvous_for(new)
    new.membership_generation = generation
    new.rendezvous_address = change.master_addr
    rank_of = {source: rank for rank, source in enumerate(change.sources) if source != JOINS}
    ranks = {
        t.task_id: tuple(sorted(rank_of[r] for r in t.local_ranks if r in rank_of)) for t in tasks
    }
    group = tasks[0].task_id.rpartition(".")[0]  # JOB.gN: the running tasks' rendezvous group
    joins, starts = control.prepare_join(
        job, new, change, joiners(new, change), group=group, cpus_per_device=cpus_per_device
    )
    calls = [
        (
            state.workers[t.worker_id].address,
            worker_pb2.ChangeMembershipRequest(task_id=t.task_id, change=change, epoch=state.epoch),
        )
        for t in tasks
    ]
    return Prepared(job.job_id, new, change, list(tasks), ranks, calls, joins, starts)


def send(control: TaskControl, prepared: Sequence[Prepared]) -> list[str]:
    """Outside the lock: each change's joiners started, then the change sent to every
    running task of its job; for each, "" when it went out everywhere, else what failed
    (its joiners are then to be killed, and the job restarted)."""
    started = control.start_jobs([p.starts for p in prepared])
    failed: list[str] = []
    for outcome in started:
        if outcome is None:
            failed.append("starting its joining processes broke")
        elif outcome[0]:
            failed.append("joining processes not started: " + "; ".join(outcome[0]))
        else:
            failed.append("")
    ready = [p for p, why in zip(prepared, failed, strict=True) if not why]
    answers = iter(control.agents.change_all([call for p in ready for call in p.calls]))
    out: list[str] = []
    for p, why in zip(prepared, failed, strict=True):
        if why:
            out.append(why)
            continue
        refused = [
            f"{call[1].task_id}: {_error(answer)}"
            for call, answer in zip(p.calls, [next(answers) for _ in p.calls], strict=True)
            if isinstance(answer, Exception)
        ]
        out.append("ChangeMembership failed: " + "; ".join(refused) if refused else "")
    return out


def settle(state: SchedulerState, p: Prepared) -> None:
    """Under the lock: a change that went out everywhere, in the running tasks' records
    (their ranks after it; a task whose processes all leave keeps none and ends LEFT)."""
    for task in p.running:
        task.local_ranks = p.ranks[task.task_id]
        task.rendezvous_address = p.change.master_addr or task.rendezvous_address
    state.store.save_tasks(p.running)


def describe(p: Prepared) -> str:
    """What the change does, for the job's RESCALED event."""
    sources = list(p.change.sources)
    stay = sum(1 for s in sources if s != JOINS)
    join = len(sources) - stay
    leave = sum(len(t.local_ranks) for t in p.running) - stay
    return f"in place (generation {p.change.generation}: {stay} stay, {join} join, {leave} leave)"


def _error(answer: Exception) -> str:
    return rpc_details(answer) if isinstance(answer, grpc.RpcError) else repr(answer)
