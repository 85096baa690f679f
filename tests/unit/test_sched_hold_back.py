"""reconcile.hold_back: a round's starts past its bound wait, and so do the preemptions that
only made room for them (stopped for devices nobody takes, they would leave them idle)."""

from __future__ import annotations

from gearshift.scheduler.round.reconcile import diff, hold_back
from gearshift.scheduler.types import Assignment, Device


def on(*devices: tuple[str, int]) -> Assignment:
    return [(Device(w, i, "t4"), 0) for w, i in devices]


RUNNING = {
    "p1": on(("a", 0)),  # makes room for s1
    "p2": on(("a", 1)),  # makes room for s2 only
    "p3": on(("a", 2)),  # makes room for r's growth
    "r": on(("b", 0)),
    "k": on(("c", 0)),  # kept as it is
    "z": [],  # runs, holds nothing known: its preemption frees nothing and stays
}
DESIRED = {
    "k": RUNNING["k"],
    "r": on(("b", 0), ("a", 2)),
    "s1": on(("a", 0)),
    "s2": on(("a", 1)),
    "s3": on(("d", 0)),  # on free devices
}


def test_starts_past_the_bound_wait_with_the_preemptions_only_they_needed() -> None:
    changes, later = hold_back(diff(DESIRED, RUNNING), RUNNING, 1)
    assert later == 2
    kinds = {c.job_id: c.kind for c in changes}
    assert kinds == {
        "p1": "preempt",
        "p2": "renew",
        "p3": "preempt",
        "z": "preempt",
        "r": "rescale",
        "k": "renew",
        "s1": "start",
    }
    assert next(c for c in changes if c.job_id == "p2").assignment == RUNNING["p2"]


def test_the_first_starts_in_the_decisions_order_are_the_ones_kept() -> None:
    changes, later = hold_back(diff(DESIRED, RUNNING), RUNNING, 2)
    assert later == 1
    assert [c.job_id for c in changes if c.kind == "start"] == ["s1", "s2"]
    assert {c.job_id for c in changes if c.kind == "preempt"} == {"p1", "p2", "p3", "z"}


def test_within_the_bound_every_change_stays() -> None:
    changes = diff(DESIRED, RUNNING)
    assert hold_back(changes, RUNNING, 3) == (changes, 0)
    assert hold_back(changes, RUNNING, 0)[1] == 3
    assert {c.kind for c in hold_back(changes, RUNNING, 0)[0]} == {"preempt", "rescale", "renew"}
