"""A job's history from its events (gearshift.client.timeline), and `gearshift job --plot`'s PNG."""

from __future__ import annotations

from pathlib import Path

from gearshift.client import timeline
from gearshift.client.jobplot import write_job_plot
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.unit.test_plots import assert_real_png

S = scheduler_pb2
C = common_pb2


def placement(*devices: tuple[str, str, int, int]) -> C.Placement:
    """(worker, type, device index, ESTs) per rank."""
    out = C.Placement()
    est = 0
    for rank, (worker, kind, index, ests) in enumerate(devices):
        out.processes.add(
            rank=rank,
            worker_id=worker,
            accelerator_type=kind,
            device_index=index,
            est_ids=list(range(est, est + ests)),
        )
        est += ests
    return out


def event(
    sequence: int,
    time: float,
    kind: S.JobEventType.ValueType,
    state: C.JobState.ValueType,
    *,
    step: int = 0,
    loss: float = 0.0,
    where: C.Placement | None = None,
    message: str = "",
) -> S.JobEvent:
    out = S.JobEvent(
        job_id="job-1", sequence=sequence, time=time, type=kind, state=state, message=message
    )
    out.progress.step, out.progress.loss, out.progress.samples_per_second = step, loss, 10.0 * step
    if where is not None:
        out.placement.CopyFrom(where)
    return out


FOUR = placement(("w1", "v100", 0, 1), ("w1", "v100", 1, 1), ("w2", "t4", 0, 1), ("w2", "t4", 1, 1))
TWO = placement(("w2", "t4", 0, 2), ("w2", "t4", 1, 2))
EVENTS = [
    event(1, 100.0, S.JOB_EVENT_TYPE_SUBMITTED, C.JOB_STATE_QUEUED),
    event(2, 101.0, S.JOB_EVENT_TYPE_STARTED, C.JOB_STATE_RUNNING, where=FOUR),
    event(3, 111.0, S.JOB_EVENT_TYPE_PROGRESS, C.JOB_STATE_RUNNING, step=50, loss=1.5),
    event(4, 120.0, S.JOB_EVENT_TYPE_RESCALING, C.JOB_STATE_RESCALING, step=80, loss=1.2),
    event(5, 121.0, S.JOB_EVENT_TYPE_CHECKPOINTED, C.JOB_STATE_RESCALING, step=80, loss=1.2),
    event(
        6,
        122.0,
        S.JOB_EVENT_TYPE_RESCALED,
        C.JOB_STATE_RUNNING,
        step=80,
        where=TWO,
        message="2 processes on w2; EST plan changed",
    ),
    event(7, 140.0, S.JOB_EVENT_TYPE_SUCCEEDED, C.JOB_STATE_SUCCEEDED, step=200, loss=0.3),
]


def test_segments_follow_starts_rescales_and_the_end() -> None:
    first, second = timeline.segments(EVENTS)
    assert (first.start, first.end) == (101.0, 120.0)
    assert first.devices_by_type == {"t4": 2, "v100": 2}
    assert first.ests_per_device == [1, 1, 1, 1]
    assert (second.start, second.end) == (122.0, 140.0)
    assert second.devices_by_type == {"t4": 2} and second.ests_per_device == [2, 2]


def test_a_running_placement_stays_open() -> None:
    (only,) = timeline.segments(EVENTS[:3])
    assert only.end is None
    series = timeline.devices_over_time([only], now=130.0)
    assert series == [(101.0, {"t4": 2, "v100": 2}), (130.0, {"t4": 2, "v100": 2})]


def test_devices_over_time_is_a_step_series() -> None:
    series = timeline.devices_over_time(timeline.segments(EVENTS), now=999.0)
    assert series == [
        (101.0, {"t4": 2, "v100": 2}),
        (120.0, {}),
        (122.0, {"t4": 2}),
        (140.0, {}),
    ]


def test_progress_rescales_and_plan_changes() -> None:
    seen = [timeline.ProgressPoint(130.0, 150, 0.5, 1500.0)]
    points = timeline.progress(EVENTS, seen)
    assert [p.step for p in points] == [50, 80, 150, 200]
    assert points[1].time == 120.0, "a step's first report counts"
    assert timeline.rescale_times(EVENTS) == [122.0]
    assert [e.sequence for e in timeline.plan_changes(EVENTS)] == [6]


def test_job_plot_writes_one_png(tmp_path: Path) -> None:
    job = scheduler_pb2.Job(
        job_id="job-1", state=C.JOB_STATE_SUCCEEDED, submitted_at=100.0, started_at=101.0,
        finished_at=140.0, rescale_count=1,
    )  # fmt: skip
    job.spec.name = "digits-cnn"
    path = write_job_plot(job, EVENTS, 150.0, tmp_path / "job.png")
    assert_real_png(path, min_size=(600, 400))
