"""The round's reasons applied to the jobs: worked out outside the scheduler's lock
(round/why.py over the snapshot and the decision), then set on the job records under it in
one hold, each change of reason one REASON event (none while it holds), and counted for the
`gearshift_jobs_pending{reason}` metric."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from gearshift.scheduler.round.why import Context, Outcome, carry, explain, queue_order
from gearshift.scheduler.state.state import RUNNING_STATES, SchedulerState
from gearshift.scheduler.types import Assignment, Reason, Snapshot, Target
from gearshift.v1 import common_pb2, scheduler_pb2


class JobReasons:
    """Sets each round's reasons and queue positions on the jobs; see the module docstring."""

    def __init__(self, state: SchedulerState) -> None:
        self.state = state

    def context(
        self, snapshot: Snapshot, objective: str, priorities: Mapping[str, float]
    ) -> Context:
        """What why.explain needs of the records: read without the lock (a spec never
        changes; a locked type read a moment early is the one the snapshot had)."""
        jobs = self.state.jobs
        locked: dict[str, str] = {}
        accepted: dict[str, tuple[str, ...]] = {}
        for job in snapshot.jobs:
            record = jobs.get(job.job_id)
            if record is None:
                continue
            if record.locked_type:
                locked[job.job_id] = record.locked_type
            if record.spec.accelerator_types:
                accepted[job.job_id] = tuple(record.spec.accelerator_types)
        return Context(
            objective=objective,
            priorities=priorities,
            locked=locked,
            accepted=accepted,
            max_starts=self.state.settings.max_starts_per_round,
            memory_factor=dict(self.state.memory_factor),
        )

    def update(
        self,
        snapshot: Snapshot,
        targets: Mapping[str, Target],
        desired: Mapping[str, Assignment],
        current: Mapping[str, Assignment],
        *,
        outcome: Outcome,
        context: Context,
        offered: Mapping[str, Reason] | None = None,
    ) -> Counter[str]:
        """Work out the round's reasons, set them (one hold); the waiting jobs by reason."""
        reasons = explain(
            snapshot, targets, desired, current, outcome=outcome, context=context, offered=offered
        )
        placed = {j for j, a in desired.items() if a and j not in set(outcome.held_back)}
        waiting = [j.job_id for j in snapshot.jobs if j.job_id not in placed]
        positions = queue_order(snapshot, waiting, context.priorities)
        state = self.state
        with state.store.locked_batch(state.lock):
            return self._apply(snapshot, reasons, positions, placed)

    def _apply(
        self,
        snapshot: Snapshot,
        reasons: Mapping[str, Reason],
        positions: Mapping[str, int],
        placed: set[str],
    ) -> Counter[str]:
        state = self.state
        now = state.clock()
        pending: Counter[str] = Counter()
        for seen in snapshot.jobs:
            job = state.jobs.get(seen.job_id)
            if job is None or job.terminal:
                continue
            running = job.state in RUNNING_STATES or job.job_id in placed  # starting now
            reason = carry(job.reason, reasons.get(job.job_id), running)
            job.queue_position = 0 if running else positions.get(job.job_id, 0)
            if reason is None:
                job.reason = None
                job.estimated_start = 0.0
            elif reason.same_as(job.reason):
                job.reason = reason  # the facts of this round (free counts, priorities)
            else:
                job.reason, job.reason_since = reason, now
                state.record(
                    job, scheduler_pb2.JOB_EVENT_TYPE_REASON, reason.message, keep_message=True
                )
            if not running and job.state == common_pb2.JOB_STATE_QUEUED and job.reason:
                pending[job.reason.code] += 1
        return pending
