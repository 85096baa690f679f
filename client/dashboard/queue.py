"""The queue page's data: the waiting jobs in the round's order, each with the reason the
round gave, since when, its estimated start and its tenant; and a job's reason as the job
page shows it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gearshift.v1 import common_pb2, scheduler_pb2

Json = dict[str, Any]


def reason(job: scheduler_pb2.Job) -> Json | None:
    """The round's reason for the job (None: it has none)."""
    if not job.HasField("reason"):
        return None
    r = job.reason
    return {
        "code": r.code,
        "message": r.message,
        "facts": dict(sorted(r.facts.items())),
        "since": r.since,
        "estimated_start": r.estimated_start,
    }


def queue(jobs: Sequence[scheduler_pb2.Job], now: float) -> Json:
    """The queued jobs by queue position (those without one, not yet seen by a round, last,
    by arrival)."""
    waiting = [j for j in jobs if j.state == common_pb2.JOB_STATE_QUEUED]
    waiting.sort(key=lambda j: (j.queue_position or 1 << 30, j.submitted_at, j.job_id))
    return {
        "now": now,
        "jobs": [
            {
                "id": j.job_id,
                "name": j.spec.name,
                "tenant": j.spec.tenant or "default",
                "position": j.queue_position,
                "submitted_at": j.submitted_at,
                "reason": reason(j),
            }
            for j in waiting
        ],
    }
