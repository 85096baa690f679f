"""Straggler detection (plain logic) and the place stage's avoidance of degraded workers."""

from __future__ import annotations

import pytest

from gearshift.client.dashboard.views import cluster
from gearshift.client.render import cluster_text
from gearshift.scheduler.plugins.dlrover.stragglers import (
    Report,
    Track,
    expired,
    observe,
)
from gearshift.scheduler.round.placement import place
from gearshift.scheduler.types import Device, StragglerPolicy, Target
from gearshift.v1 import common_pb2, scheduler_pb2

POLICY = StragglerPolicy(margin=0.5, reports=3, clear_seconds=60.0)


def rep(rank: int, step: int, seconds: float, worker: str = "", ests: int = 1) -> Report:
    return Report(rank, worker or f"w{rank}", step, seconds, ests)


def feed(tracks: dict[int, Track], step: int, times: list[float]) -> tuple[list[int], list[str]]:
    """One report of every rank at `step`; (straggler ranks, recovered workers)."""
    out = observe(tracks, [rep(r, step, t) for r, t in enumerate(times)], POLICY)
    return [v.rank for v in out.stragglers], out.recovered


def test_a_rank_slower_than_the_margin_for_k_reports_is_a_straggler() -> None:
    tracks: dict[int, Track] = {}
    assert feed(tracks, 5, [0.1, 0.1, 0.4]) == ([], [])  # rank 2: slow 1 (ranks 0, 1 first)
    assert feed(tracks, 10, [0.1, 0.1, 0.4]) == ([], [])  # slow 2
    stragglers, _ = feed(tracks, 15, [0.1, 0.1, 0.4])  # slow 3: K reached
    assert stragglers == [2]
    verdict = observe(tracks, [rep(2, 20, 0.4)], POLICY).stragglers[0]
    assert verdict.reports == 4 and verdict.worker_id == "w2"
    assert verdict.median == pytest.approx(0.1)
    assert (
        verdict.describe()
        == "STRAGGLER rank 2 on worker w2: 0.4 s/step vs median 0.1 s for 4 reports"
    )


def test_within_the_margin_is_not_slow() -> None:
    tracks: dict[int, Track] = {}
    for step in range(5, 60, 5):
        assert feed(tracks, step, [0.1, 0.1, 0.149])[0] == []  # 49% slower: margin is 50%


def test_milliseconds_of_jitter_are_no_straggler() -> None:
    tracks: dict[int, Track] = {}
    for step in range(5, 60, 5):
        assert feed(tracks, step, [0.003, 0.009])[0] == []  # 3x slower, but by 6 ms a step


def test_a_normal_report_resets_the_count() -> None:
    tracks: dict[int, Track] = {}
    feed(tracks, 5, [0.1, 0.4])
    feed(tracks, 10, [0.1, 0.4])
    feed(tracks, 15, [0.1, 0.1])  # normal: back to 0
    feed(tracks, 20, [0.1, 0.4])
    assert feed(tracks, 25, [0.1, 0.4])[0] == []  # only 2 consecutive
    assert feed(tracks, 30, [0.1, 0.4])[0] == [1]


def test_a_repeated_measurement_counts_once() -> None:
    """Heartbeats carry the same report until the process writes a new one."""
    tracks: dict[int, Track] = {}
    feed(tracks, 5, [0.1, 0.4])
    for _ in range(10):
        assert feed(tracks, 5, [0.1, 0.4])[0] == []
    assert tracks[1].slow == 1


def test_two_processes_compare_with_each_other_not_with_their_mean() -> None:
    """Leave-one-out median: with two processes each is judged against the other, so a
    process 2x slower is a straggler (the median of both, 0.15, would hide it)."""
    tracks: dict[int, Track] = {}
    result: list[int] = []
    for step in (5, 10, 15):
        result, _ = feed(tracks, step, [0.1, 0.2])
    assert result == [1]


def test_a_one_process_job_is_never_judged() -> None:
    tracks: dict[int, Track] = {}
    for step in range(5, 100, 5):
        assert feed(tracks, step, [5.0]) == ([], [])


def test_times_are_compared_per_est() -> None:
    """A process holding 3 ESTs takes 3x as long a step and is not slow for it."""
    tracks: dict[int, Track] = {}
    for step in range(5, 50, 5):
        out = observe(tracks, [rep(0, step, 0.3, ests=3), rep(1, step, 0.1)], POLICY)
        assert out.stragglers == []


def test_only_processes_on_the_same_accelerator_type_are_compared() -> None:
    """A D2 job mixing types: its T4 processes are slower by nature."""
    tracks: dict[int, Track] = {}
    for step in range(5, 50, 5):
        reports = [
            Report(0, "a", step, 0.1, 1, "v100"),
            Report(1, "a", step, 0.1, 1, "v100"),
            Report(2, "b", step, 0.4, 1, "t4"),
        ]
        assert observe(tracks, reports, POLICY).stragglers == []
    slow_v100 = [Report(1, "a", s, 0.4, 1, "v100") for s in (50, 55, 60)]
    out = [observe(tracks, [r], POLICY).stragglers for r in slow_v100]
    assert [len(v) for v in out] == [0, 0, 1]  # against rank 0 only, not the T4 one


def test_normal_reports_for_k_reports_recover_the_worker() -> None:
    tracks: dict[int, Track] = {}
    for step in (5, 10, 15):
        feed(tracks, step, [0.1, 0.4])
    assert feed(tracks, 20, [0.1, 0.1])[1] == ["w0"]  # rank 0's normal run: 4 reports
    assert feed(tracks, 25, [0.1, 0.1])[1] == ["w0"]
    assert feed(tracks, 30, [0.1, 0.1])[1] == ["w0", "w1"]  # rank 1: 3 normal reports


def test_marks_expire_after_clear_seconds() -> None:
    assert expired({"w1": 100.0, "w2": 150.0}, 170.0, POLICY) == ["w1"]
    assert expired({}, 170.0, POLICY) == []


@pytest.mark.parametrize(
    ("policy", "flag"),
    [
        (StragglerPolicy(margin=0), "--straggler-margin"),
        (StragglerPolicy(reports=0), "--straggler-reports"),
        (StragglerPolicy(clear_seconds=0), "--straggler-clear-seconds"),
    ],
)
def test_bad_settings_name_their_flag(policy: StragglerPolicy, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        policy.check()


def dev(worker: str, index: int = 0) -> Device:
    return Device(worker, index, "cpu")


def target(job: str, size: int) -> Target:
    return Target(job, (("cpu", size),), {"cpu": (1,) * size})


def workers(assignment: list[tuple[Device, int]]) -> list[str]:
    return sorted(d.worker_id for d, _ in assignment)


def test_place_moves_a_job_off_a_degraded_worker_when_another_fits() -> None:
    devices = [dev("w1"), dev("w2"), dev("w3")]
    current = {"a": [(dev("w1"), 1), (dev("w2"), 1)]}
    assert workers(place({"a": target("a", 2)}, devices, current)["a"]) == ["w1", "w2"]
    moved = place({"a": target("a", 2)}, devices, current, frozenset({"w2"}))
    assert workers(moved["a"]) == ["w1", "w3"]  # keeps w1's device, leaves w2


def test_place_uses_a_degraded_worker_only_when_nothing_else_fits() -> None:
    devices = [dev("w1"), dev("w2"), dev("w3")]
    avoid = frozenset({"w2"})
    out = place({"a": target("a", 2), "b": target("b", 1)}, devices, {}, avoid)
    assert sorted(d.worker_id for a in out.values() for d, _ in a) == ["w1", "w2", "w3"]
    assert workers(out["a"]) == ["w1", "w3"]  # the largest first, on healthy workers
    assert workers(out["b"]) == ["w2"]  # no healthy device left: the degraded one
    current = {"a": [(dev("w1"), 1), (dev("w2"), 1)]}
    kept = place({"a": target("a", 2)}, [dev("w1"), dev("w2")], current, avoid)
    assert workers(kept["a"]) == ["w1", "w2"]  # no other placement: it stays


def test_cluster_views_show_a_degraded_worker_and_why() -> None:
    why = "STRAGGLER rank 1 on worker w2: 0.25 s/step vs median 0.003 s for 3 reports"
    state = scheduler_pb2.ClusterState(policy="easyscale")
    for worker, reason in (("w1", ""), ("w2", why)):
        state.workers.add(
            worker_id=worker,
            alive=True,
            devices=[common_pb2.DeviceGroup(accelerator_type="cpu", count=1)],
            degraded=bool(reason),
            degraded_reason=reason,
        )
    text = cluster_text(state)
    assert f"w2 degraded: {why}" in text
    rows = {line.split()[0]: line for line in text.splitlines() if " alive" in line}
    assert "alive degraded" in rows["w2"] and "degraded" not in rows["w1"], text
    assert [w["degraded"] for w in cluster(state)["workers"]] == ["", why]
