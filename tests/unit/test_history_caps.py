"""When a history plan's device cap gives way (the pure rule)."""

from __future__ import annotations

from gearshift.scheduler.plugins.dlrover.history_caps import caps_to_lift, idle_usable
from gearshift.scheduler.round.hooks import CapView

ANY: frozenset[str] = frozenset()


def capped(job_id: str = "j", cap: int = 1, held: int = 1, most: int = 4, types=ANY) -> CapView:
    return CapView(job_id, cap, held, most, frozenset(types))


def test_a_capped_running_job_grows_onto_idle_devices_when_nothing_waits() -> None:
    assert caps_to_lift([capped()], {"cpu": 3}) == ["j"]


def test_the_cap_stands_while_a_job_waits_for_the_idle_devices() -> None:
    waiter = capped("waits", cap=0, held=0)
    assert caps_to_lift([capped(), waiter], {"cpu": 3}) == []  # the idle devices are its
    v100s = capped("waits", cap=0, held=0, types={"v100"})
    assert caps_to_lift([capped(), v100s], {"cpu": 3}) == ["j"]  # it cannot use them
    assert caps_to_lift([capped(), v100s], {"cpu": 3, "v100": 1}) == []


def test_the_cap_stands_when_no_device_it_can_use_is_idle() -> None:
    assert caps_to_lift([capped()], {}) == []
    assert caps_to_lift([capped()], {"cpu": 0}) == []
    assert caps_to_lift([capped(types={"v100"})], {"t4": 2}) == []  # not its type
    assert caps_to_lift([capped(types={"v100"})], {"t4": 2, "v100": 1}) == ["j"]


def test_only_running_capped_jobs_below_their_spec_bound_are_lifted() -> None:
    jobs = [
        capped("uncapped", cap=0),
        capped("starting", held=0),  # its start honours the history
        capped("at-its-most", held=4),
        capped("grows", cap=2, held=2),
    ]
    assert caps_to_lift(jobs, {"cpu": 2}) == []  # "starting" waits for them
    assert caps_to_lift(jobs[:1] + jobs[2:], {"cpu": 2}) == ["grows"]


def test_idle_usable_counts_the_types_a_job_may_use() -> None:
    idle = {"v100": 2, "t4": 3}
    assert idle_usable(idle, ANY) == 5
    assert idle_usable(idle, frozenset({"t4", "k80"})) == 3
