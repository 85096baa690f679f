"""What the allocation (Gantt) and tenants pages read: the cluster's devices, who held
each over a window, and each tenant's guarantee, share and use over that window."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from gearshift.client.dashboard.allocation import (
    Bar,
    JobRun,
    Lane,
    bars,
    lanes,
    mean_use,
    use_over_time,
)
from gearshift.v1 import scheduler_pb2

Json = dict[str, Any]


def devices(state: scheduler_pb2.ClusterState) -> tuple[list[Lane], int]:
    """Every registered device (the Gantt's rows), and how many are on alive workers."""
    out: list[Lane] = []
    alive = 0
    for worker in state.workers:
        index = 0
        for group in worker.devices:
            for _ in range(group.count):
                out.append(Lane(worker.worker_id, index, group.accelerator_type))
                index += 1
        alive += index if worker.alive else 0
    return out, alive


def first_held(held: Sequence[Bar], since: float) -> float:
    """When the first device in the window was taken (`since` when none was): the pages
    draw from there, not over a window that was empty before."""
    return min((b.start for b in held), default=since)


def allocation(
    state: scheduler_pb2.ClusterState,
    runs: Sequence[JobRun],
    since: float,
    now: float,
    truncated: bool = False,
) -> Json:
    """The Gantt: one lane per device, a bar per (job, device, stretch of time)."""
    registered, capacity = devices(state)
    held = bars(runs, since, now)
    alive = {w.worker_id: w.alive for w in state.workers}
    return {
        "since": since,
        "first": first_held(held, since),
        "now": now,
        "capacity": capacity,
        "truncated": truncated,
        "lanes": [
            {
                "worker": lane.worker_id,
                "device": lane.device_index,
                "type": lane.accelerator_type,
                "alive": alive.get(lane.worker_id, False),
            }
            for lane in lanes(registered, held)
        ],
        "bars": [asdict(b) for b in held],
        "jobs": {r.job_id: {"name": r.name, "tenant": r.tenant} for r in runs},
        "tenants": sorted({r.tenant for r in runs}),
    }


def tenants(
    state: scheduler_pb2.ClusterState,
    runs: Sequence[JobRun],
    since: float,
    now: float,
    truncated: bool = False,
) -> Json:
    """Each tenant: its guarantee (quota by type and in all), its devices and share of the
    cluster's alive devices now and on average over the window, and its use over time."""
    _, capacity = devices(state)
    held: list[Bar] = bars(runs, since, now)
    use = use_over_time(held, since, now)
    known = {t.tenant: t for t in state.tenants}
    rows = []
    for name in sorted(set(known) | set(use)):
        t = known.get(name, scheduler_pb2.TenantState(tenant=name))
        series = use.get(name, [(since, 0), (now, 0)])
        held_now = sum(t.devices.values()) if name in known else series[-1][1]
        guarantee = sum(t.quota.values())
        average = mean_use(series)
        rows.append(
            {
                "tenant": name,
                "quota": dict(sorted(t.quota.items())),
                "guarantee": guarantee,
                "guarantee_share": guarantee / capacity if capacity else None,
                "devices": dict(sorted(t.devices.items())),
                "held": held_now,
                "share": held_now / capacity if capacity else None,
                "mean_held": average,
                "mean_share": average / capacity if capacity else None,
                "peak_held": max(n for _, n in series),
                "guaranteed_devices": sum(t.guaranteed_devices.values()),
                "running_jobs": t.running_jobs,
                "queued_jobs": t.queued_jobs,
                "use": [[when, n] for when, n in series],
            }
        )
    return {
        "since": since,
        "first": first_held(held, since),
        "now": now,
        "capacity": capacity,
        "truncated": truncated,
        "tenants": rows,
    }
