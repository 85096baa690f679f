"""sim/forward.py: the pipeline run forward from a live snapshot says when waiting jobs start
(the next completion that frees their devices, in the queue's order), within its bounds."""

from __future__ import annotations

from gearshift.scheduler.plugins.allocators import make_allocator
from gearshift.scheduler.sim.forward import Bounds, estimate_starts
from gearshift.scheduler.types import Device, JobSnapshot, Snapshot


def job(job_id: str, arrival: float, steps: float, current: int = 0) -> JobSnapshot:
    return JobSnapshot(
        job_id=job_id,
        num_ests=1,
        min_devices=1,
        max_devices=1,
        types=("t4",),
        capability={"t4": 2.0},  # mini-batches/s on one device
        throughputs={"t4": 2.0},
        steps_remaining=steps,
        arrival_time=arrival,
        current=(("t4", 1),) if current else (),
    )


def test_waiting_jobs_start_as_the_running_ones_finish_in_fifo_order() -> None:
    device = Device("box", 0, "t4")
    snapshot = Snapshot(
        1000.0,
        (device,),
        (job("run", 1.0, 100.0, current=1), job("next", 2.0, 40.0), job("last", 3.0, 10.0)),
    )
    starts = estimate_starts(
        snapshot, {"run": [(device, 1)]}, make_allocator("fifo"), Bounds(round_seconds=3600.0)
    )
    assert starts == {"next": 1050.0, "last": 1070.0}  # 100 / 2 s, then 40 / 2 s more


def test_a_job_beyond_the_horizon_has_no_estimate() -> None:
    device = Device("box", 0, "t4")
    snapshot = Snapshot(0.0, (device,), (job("run", 1.0, 1e6, current=1), job("next", 2.0, 1.0)))
    bounds = Bounds(round_seconds=60.0, horizon_seconds=600.0)
    starts = estimate_starts(snapshot, {"run": [(device, 1)]}, make_allocator("fifo"), bounds)
    assert starts == {}
