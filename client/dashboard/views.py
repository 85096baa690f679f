"""What the dashboard's JSON endpoints answer: plain data built from the scheduler's messages.

Times are seconds since the Unix epoch; the pages format them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from gearshift.client import timeline
from gearshift.client.dashboard import queue
from gearshift.client.dashboard.gateway import JobHistory
from gearshift.client.render import event_name, state_name
from gearshift.common.facts import DETERMINISM_PREFIX, TERMINAL_STATES
from gearshift.v1 import brain_pb2, common_pb2, scheduler_pb2

Json = dict[str, Any]


def placement(placement: common_pb2.Placement) -> list[Json]:
    return [
        {
            "rank": p.rank,
            "worker": p.worker_id,
            "type": p.accelerator_type,
            "device": p.device_index,
            "ests": list(p.est_ids),
        }
        for p in placement.processes
    ]


def devices_by_type(placement: common_pb2.Placement) -> dict[str, int]:
    return dict(sorted(Counter(p.accelerator_type for p in placement.processes).items()))


def job_row(job: scheduler_pb2.Job) -> Json:
    """A job as the jobs page lists it."""
    progress = job.progress
    return {
        "id": job.job_id,
        "name": job.spec.name,
        "tenant": job.spec.tenant or "default",
        "state": state_name(job.state),
        "terminal": job.state in TERMINAL_STATES,
        "step": progress.step,
        "total_steps": progress.total_steps,
        "loss": progress.loss,
        "samples_per_second": progress.samples_per_second,
        "devices": devices_by_type(job.placement),
        "ests_per_device": [len(p.est_ids) for p in job.placement.processes],
        "rescales": job.rescale_count,
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "message": job.message,
        "reason": queue.reason(job),
        "queue_position": job.queue_position,
    }


def job_detail(job: scheduler_pb2.Job) -> Json:
    """A job with its spec and current placement, for the job page."""
    spec = job.spec
    return {
        **job_row(job),
        "entrypoint": spec.entrypoint.module,
        "num_ests": spec.num_ests,
        "global_batch_size": spec.global_batch_size,
        "elastic": [spec.elastic.min_devices, spec.elastic.max_devices],
        "accelerator_types": list(spec.accelerator_types),
        "determinism": common_pb2.DeterminismLevel.Name(spec.determinism).removeprefix(
            DETERMINISM_PREFIX
        ),
        "placement": placement(job.placement),
        "digest": job.final_digest,
        "last_sequence": job.last_sequence,
    }


def event(e: scheduler_pb2.JobEvent) -> Json:
    return {
        "sequence": e.sequence,
        "time": e.time,
        "type": event_name(e.type),
        "state": state_name(e.state),
        "message": e.message,
        "step": e.progress.step,
        "loss": e.progress.loss,
        "samples_per_second": e.progress.samples_per_second,
        "devices": devices_by_type(e.placement),
        "ests_per_device": [len(p.est_ids) for p in e.placement.processes],
    }


def job_view(
    job: scheduler_pb2.Job,
    history: JobHistory,
    now: float,
    brain: brain_pb2.JobHistory | str | None = None,
) -> Json:
    """Everything the job page shows: the job, its placements over time, its curves, events.

    `brain` is the Brain's record of the job (its samples/s curve is then the Brain's,
    finer than the events'), the reason it could not be read, or None without a Brain.
    """
    end = job.finished_at or now
    events = history.events
    placed = timeline.segments(events)
    out: Json = {
        "job": job_detail(job),
        "now": now,
        "start": job.started_at or job.submitted_at,
        "end": end,
        "segments": [
            {
                "start": s.start,
                "end": s.end,
                "devices": s.devices_by_type,
                "ests_per_device": s.ests_per_device,
                "slots": [asdict(slot) for slot in s.slots],
            }
            for s in placed
        ],
        "rescales": timeline.rescale_times(events),
        "progress": [asdict(p) for p in timeline.progress(events, history.seen)],
        "events": [event(e) for e in events],
        "plan_changes": [event(e) for e in timeline.plan_changes(events)],
        "brain": None,
    }
    if isinstance(brain, str):
        out["brain"] = {"error": brain}
    elif brain is not None:
        out["brain"] = {
            "status": brain.job.status,
            "samples": [
                {"time": s.time, "step": s.step, "samples_per_second": s.samples_per_second}
                for s in brain.samples
            ],
            "plans": len(brain.plans),
        }
    return out


def cluster(state: scheduler_pb2.ClusterState) -> Json:
    """Workers with their devices and what runs on each, the jobs' placements."""
    running: dict[tuple[str, int], Json] = {}
    for allocation in state.allocations:
        for p in allocation.placement.processes:
            running[(p.worker_id, p.device_index)] = {
                "job": allocation.job_id,
                "name": allocation.job_name,
                "rank": p.rank,
                "ests": len(p.est_ids),
            }
    workers = []
    for w in state.workers:
        devices = []
        index = 0
        for group in w.devices:
            for _ in range(group.count):
                where = running.get((w.worker_id, index), {"job": None})
                devices.append({"index": index, "type": group.accelerator_type, **where})
                index += 1
        workers.append(
            {
                "id": w.worker_id,
                "address": w.address,
                "hostname": w.hostname,
                "alive": w.alive,
                "degraded": w.degraded_reason,  # empty: not degraded
                "last_heartbeat_at": w.last_heartbeat_at,
                "devices": devices,
            }
        )
    return {
        "policy": state.policy,
        "round": state.round,
        "round_seconds": state.round_seconds,
        "workers": workers,
        "allocations": [
            {
                "job": a.job_id,
                "name": a.job_name,
                "devices": devices_by_type(a.placement),
                "placement": placement(a.placement),
            }
            for a in state.allocations
        ],
    }


def log_lines(lines: Sequence[common_pb2.LogLine]) -> Json:
    return {
        "available": True,
        "lines": [{"rank": x.rank, "time": x.time, "text": x.text} for x in lines],
    }
