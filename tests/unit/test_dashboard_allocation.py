"""The allocation (Gantt) and tenants pages' data: bars from the jobs' placement events,
clipped to a window; each tenant's devices over time, guarantee and share."""

from __future__ import annotations

import pytest

from gearshift.client import timeline
from gearshift.client.dashboard import allocation_view
from gearshift.client.dashboard.allocation import JobRun, Lane, bars, lanes, mean_use, use_over_time
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.unit.test_timeline import event, placement

S = scheduler_pb2
C = common_pb2
RUNNING = C.JOB_STATE_RUNNING


def run(job_id: str, tenant: str, events: list[S.JobEvent]) -> JobRun:
    return JobRun(job_id, f"name-{job_id}", tenant, timeline.segments(events))


def two_jobs() -> list[JobRun]:
    """a: 2 devices on wA from 10, shrunk to 1 at 50, still running; b: wB's device 0
    from 40 until it succeeded at 80."""
    a = [
        event(
            1,
            10.0,
            S.JOB_EVENT_TYPE_STARTED,
            RUNNING,
            where=placement(("wA", "v100", 0, 2), ("wA", "v100", 1, 2)),
        ),
        event(2, 50.0, S.JOB_EVENT_TYPE_RESCALED, RUNNING, where=placement(("wA", "v100", 1, 4))),
    ]
    b = [
        event(1, 40.0, S.JOB_EVENT_TYPE_STARTED, RUNNING, where=placement(("wB", "t4", 0, 1))),
        event(2, 80.0, S.JOB_EVENT_TYPE_SUCCEEDED, C.JOB_STATE_SUCCEEDED),
    ]
    return [run("a", "team-a", a), run("b", "team-b", b)]


def test_bars_are_the_devices_each_job_held_clipped_to_the_window() -> None:
    held = bars(two_jobs(), since=20.0, now=100.0)
    got = [(b.job_id, b.worker_id, b.device_index, b.start, b.end, b.open, b.ests) for b in held]
    assert got == [
        ("a", "wA", 0, 20.0, 50.0, False, 2),
        ("a", "wA", 1, 20.0, 50.0, False, 2),
        ("b", "wB", 0, 40.0, 80.0, False, 1),
        ("a", "wA", 1, 50.0, 100.0, True, 4),
    ]
    assert [b.job_id for b in bars(two_jobs(), since=85.0, now=100.0)] == ["a"]  # b ended before
    assert bars(two_jobs(), since=0.0, now=5.0) == []  # nothing ran yet
    with pytest.raises(ValueError, match="the window ends"):
        bars(two_jobs(), since=10.0, now=5.0)


def test_lanes_are_every_device_and_those_of_workers_that_left() -> None:
    held = bars(two_jobs(), since=0.0, now=100.0)
    registered = [Lane("wA", 0, "v100"), Lane("wA", 1, "v100"), Lane("wC", 0, "t4")]
    got = [(lane.worker_id, lane.device_index) for lane in lanes(registered, held)]
    assert got == [("wA", 0), ("wA", 1), ("wB", 0), ("wC", 0)]


def test_use_over_time_is_a_step_series_per_tenant_and_per_job() -> None:
    held = bars(two_jobs(), since=0.0, now=100.0)
    use = use_over_time(held, 0.0, 100.0)
    assert use == {
        "team-a": [(0.0, 0), (10.0, 2), (50.0, 1), (100.0, 1)],  # the rescale: -2 +1 at once
        "team-b": [(0.0, 0), (40.0, 1), (80.0, 0), (100.0, 0)],
    }
    assert mean_use(use["team-a"]) == pytest.approx((40 * 2 + 50 * 1) / 100)
    assert mean_use(use["team-b"]) == pytest.approx(0.4)
    assert set(use_over_time(held, 0.0, 100.0, key="job_id")) == {"a", "b"}
    assert mean_use([]) == 0.0 and mean_use([(5.0, 3)]) == 3.0
    with pytest.raises(ValueError, match="key must be"):
        use_over_time(held, 0.0, 100.0, key="worker")


def cluster() -> S.ClusterState:
    state = S.ClusterState()
    state.workers.add(
        worker_id="wA", alive=True, devices=[C.DeviceGroup(accelerator_type="v100", count=2)]
    )
    state.workers.add(
        worker_id="wB", alive=True, devices=[C.DeviceGroup(accelerator_type="t4", count=2)]
    )
    state.workers.add(
        worker_id="wC", alive=False, devices=[C.DeviceGroup(accelerator_type="t4", count=4)]
    )
    team_a = state.tenants.add(tenant="team-a", running_jobs=1)
    team_a.quota["v100"] = 2
    team_a.devices["v100"] = 1
    team_a.guaranteed_devices["v100"] = 1
    state.tenants.add(tenant="idle-team").quota["t4"] = 1
    return state


def test_the_allocation_view_lists_lanes_bars_and_jobs() -> None:
    view = allocation_view.allocation(cluster(), two_jobs(), 0.0, 100.0)
    assert view["capacity"] == 4  # wC is lost
    assert [(lane["worker"], lane["device"], lane["alive"]) for lane in view["lanes"]] == [
        ("wA", 0, True), ("wA", 1, True), ("wB", 0, True), ("wB", 1, True),
        ("wC", 0, False), ("wC", 1, False), ("wC", 2, False), ("wC", 3, False),
    ]  # fmt: skip
    assert len(view["bars"]) == 4 and view["bars"][0]["tenant"] == "team-a"
    assert view["jobs"]["b"] == {"name": "name-b", "tenant": "team-b"}
    assert view["tenants"] == ["team-a", "team-b"]
    assert view["first"] == 10.0  # the pages draw from the first device taken
    assert allocation_view.allocation(cluster(), [], 0.0, 100.0)["first"] == 0.0


def test_the_tenants_view_gives_guarantee_share_and_use() -> None:
    view = allocation_view.tenants(cluster(), two_jobs(), 0.0, 100.0)
    rows = {t["tenant"]: t for t in view["tenants"]}
    assert list(rows) == ["idle-team", "team-a", "team-b"]
    a = rows["team-a"]
    assert (a["quota"], a["guarantee"], a["guarantee_share"]) == ({"v100": 2}, 2, 0.5)
    assert (a["held"], a["share"], a["peak_held"], a["guaranteed_devices"]) == (1, 0.25, 2, 1)
    assert a["mean_held"] == pytest.approx(1.3) and a["mean_share"] == pytest.approx(1.3 / 4)
    assert a["use"] == [[0.0, 0], [10.0, 2], [50.0, 1], [100.0, 1]]
    b = rows["team-b"]  # no quota, not in the cluster state now: from its history
    assert (b["guarantee"], b["held"], b["peak_held"]) == (0, 0, 1)
    idle = rows["idle-team"]
    assert idle["use"] == [[0.0, 0], [100.0, 0]] and idle["mean_share"] == 0.0
