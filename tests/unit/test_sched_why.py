"""round/why.py: each kind of reason from plain snapshots and decisions, the queue order, and
what a job keeps from one round to the next (round/reasons.py's one event per change)."""

from __future__ import annotations

from gearshift.scheduler.plugins.rubick.guarantees import Admission, guarantee_reasons
from gearshift.scheduler.plugins.rubick.tenants import Quotas
from gearshift.scheduler.round import why
from gearshift.scheduler.types import Assignment, Device, JobSnapshot, Reason, Snapshot, Target


def devices(kind: str, count: int, worker: str = "") -> list[Device]:
    return [Device(worker or f"{kind}-box", i, kind) for i in range(count)]


def job(
    job_id: str, need: int = 1, types: tuple[str, ...] = ("v100", "t4"), **kw: object
) -> JobSnapshot:
    fields: dict[str, object] = {
        "job_id": job_id,
        "num_ests": max(need, 1),
        "min_devices": need,
        "max_devices": need,
        "types": types,
        "capability": {},
        "throughputs": {},
        "steps_remaining": 100.0,
        "arrival_time": float(len(job_id)),
    }
    fields.update(kw)
    return JobSnapshot(**fields)  # type: ignore[arg-type]


def on(devs: list[Device]) -> Assignment:
    return [(d, 1) for d in devs]


CONTEXT = why.Context(objective="max_min_fairness", priorities={"a": 2.0, "b": 0.5})


def explain(
    snapshot: Snapshot,
    desired: dict[str, Assignment],
    current: dict[str, Assignment] | None = None,
    *,
    outcome: why.Outcome | None = None,
    context: why.Context = CONTEXT,
    targets: dict[str, Target] | None = None,
) -> dict[str, Reason]:
    return why.explain(
        snapshot,
        targets or {},
        desired,
        current or {},
        outcome=outcome or why.Outcome(),
        context=context,
    )


def test_no_free_device_of_an_accepted_type_names_the_types_and_their_free_counts() -> None:
    v100 = devices("v100", 2)
    snapshot = Snapshot(0.0, (*v100, *devices("k80", 1)), (job("a"), job("b", types=("v100",))))
    context = why.Context("las", accepted={"b": ("v100", "t4")})
    reasons = explain(snapshot, {"a": on(v100)}, context=context)
    reason = reasons["b"]
    assert reason.code == why.NO_FREE_DEVICE
    assert reason.message == "no free device of an accepted type (v100: 0 free, t4: 0 free)"
    assert reason.facts["types"] == "v100,t4"
    assert "a" not in reasons  # placed: no reason


def test_a_gang_of_n_devices_not_yet_free() -> None:
    v100 = devices("v100", 4)
    snapshot = Snapshot(0.0, tuple(v100), (job("a", 2), job("gang", 4)))
    reason = explain(snapshot, {"a": on(v100[:2])})["gang"]
    assert reason.code == why.GANG_NOT_FREE
    assert reason.message.startswith("a gang of 4 devices is not yet free (v100: 2 free")


def test_a_d1_job_kept_on_its_first_type_while_others_are_free() -> None:
    snapshot = Snapshot(
        0.0, (*devices("v100", 1), *devices("t4", 2)), (job("a"), job("d1", types=("v100",)))
    )
    context = why.Context("las", locked={"d1": "v100"})
    reason = explain(snapshot, {"a": on(devices("v100", 1))}, context=context)["d1"]
    assert reason.code == why.TYPE_LOCKED
    assert reason.facts["locked_type"] == "v100"
    assert "0 v100 free, 2 of other accepted types" in reason.message


def test_held_back_by_the_rounds_start_bound() -> None:
    v100 = devices("v100", 2)
    snapshot = Snapshot(0.0, tuple(v100), (job("a"), job("b")))
    desired = {"a": on(v100[:1]), "b": on(v100[1:])}
    outcome = why.Outcome(started=["a", "b"], held_back=["b"])
    context = why.Context("las", max_starts=1)
    reasons = explain(snapshot, desired, outcome=outcome, context=context)
    assert set(reasons) == {"b"}
    assert reasons["b"].code == why.START_BOUND
    assert reasons["b"].message.startswith(
        "held back by the round's start bound (round.maxStarts = 1)"
    )


def test_preempted_by_the_job_that_took_its_devices_under_the_objective_with_both_priorities() -> (
    None
):
    v100 = devices("v100", 1)
    snapshot = Snapshot(0.0, tuple(v100), (job("a"), job("b")))
    outcome = why.Outcome(started=["a"], preempted=["b"])
    reason = explain(snapshot, {"a": on(v100)}, {"b": on(v100)}, outcome=outcome)["b"]
    assert reason.code == why.PREEMPTED
    assert reason.message == "preempted by a under max_min_fairness (priority 2 against its 0.5)"
    assert reason.facts == {
        "objective": "max_min_fairness",
        "priority": "0.5",
        "by": "a",
        "by_priority": "2",
    }
    assert reason.subject == "a"


def test_free_devices_the_objective_gave_others_name_the_objective_and_priority() -> None:
    v100 = devices("v100", 2)
    snapshot = Snapshot(0.0, tuple(v100), (job("a"), job("b")))
    reason = explain(snapshot, {"a": on(v100[:1])})["b"]
    assert reason.code == why.NOT_CHOSEN
    assert reason.facts["priority"] == "0.5"


def test_moves_off_a_degraded_worker_and_restarts_for_a_new_plan() -> None:
    slow, fast = devices("v100", 1, "slow"), devices("v100", 1, "fast")
    snapshot = Snapshot(0.0, (*slow, *fast), (job("a"), job("p")), avoid=frozenset({"slow"}))
    outcome = why.Outcome(moved=["a", "p"], restarts={"p": "restarting with a new execution plan"})
    reasons = explain(
        snapshot, {"a": on(fast), "p": on(slow)}, {"a": on(slow), "p": on(slow)}, outcome=outcome
    )
    assert reasons["a"].code == why.DEGRADED_WORKER
    assert reasons["a"].facts == {"workers": "slow"}
    assert (reasons["p"].code, reasons["p"].message) == (
        why.PLAN_CHANGE,
        "restarted with a new execution plan",
    )


def test_collocation_and_an_oom_restart() -> None:
    v100 = devices("v100", 1)
    snapshot = Snapshot(0.0, tuple(v100), (job("fg"), job("bg"), job("oom", types=("t4",))))
    t4 = devices("t4", 1)
    snapshot = Snapshot(0.0, (*v100, *t4), snapshot.jobs)
    targets = {
        "fg": Target("fg", (("v100", 1),), {}, ("bg",), "foreground"),
        "bg": Target("bg", (("v100", 1),), {}, ("fg",), "background"),
    }
    context = why.Context("las", memory_factor={"oom": 2})
    reasons = explain(
        snapshot,
        {"fg": on(v100), "bg": on(v100), "oom": on(t4)},
        outcome=why.Outcome(started=["fg", "bg", "oom"]),
        context=context,
        targets=targets,
    )
    assert reasons["fg"].code == why.LENT_DEVICE
    assert reasons["fg"].message == "its devices' idle time is lent to background job bg"
    assert reasons["bg"].code == why.IN_BACKGROUND
    assert (
        reasons["oom"].message == "restarted after running out of memory, with 2x its memory share"
    )


def test_waiting_behind_a_tenants_guarantee_with_use_against_quota() -> None:
    v100 = devices("v100", 2)
    guaranteed = job("g", 2, types=("v100",), entity="acme", guaranteed=True)
    snapshot = Snapshot(0.0, tuple(v100), (guaranteed, job("be", types=("v100",))))
    targets = {"g": Target("g", (("v100", 2),), {})}
    quotas = Quotas({"acme": {"v100": 4}})
    reasons = guarantee_reasons(snapshot, targets, {"g": Admission("v100", 2)}, quotas)
    assert set(reasons) == {"be"}
    assert reasons["be"].code == why.TENANT_GUARANTEE
    assert reasons["be"].message == (
        "waiting behind tenant acme's guarantee (v100: 2 of 4 devices of its quota in use)"
    )
    assert reasons["be"].facts == {"tenant": "acme", "usage": "v100: 2 of 4"}
    # offered to the round, it replaces the generic reason
    offered = why.explain(
        snapshot,
        targets,
        {"g": on(v100)},
        {},
        outcome=why.Outcome(),
        context=CONTEXT,
        offered=reasons,
    )
    assert offered["be"].code == why.TENANT_GUARANTEE


def test_the_queue_is_ordered_by_priority_then_arrival() -> None:
    snapshot = Snapshot(0.0, (), (job("a"), job("bb"), job("ccc")))
    assert why.queue_order(snapshot, ["ccc", "bb", "a"], {"ccc": 3.0}) == {
        "ccc": 1,
        "a": 2,
        "bb": 3,
    }


def test_what_a_job_keeps_from_round_to_round() -> None:
    waiting = Reason(why.NO_FREE_DEVICE, "no free device (v100: 0 free)", {}, "v100")
    fewer = Reason(why.NO_FREE_DEVICE, "no free device (v100: 0 free, again)", {}, "v100")
    preempted = Reason(why.PREEMPTED, "preempted by a", {}, "a")
    assert fewer.same_as(waiting)  # new counts, the same reason: no new event
    assert not preempted.same_as(waiting)
    assert why.carry(waiting, None, running=True) is None  # it runs: the wait is over
    moved = Reason(why.DEGRADED_WORKER, "moved off degraded worker w", {}, "w")
    assert why.carry(moved, None, running=True) is moved  # the last move's reason
    assert why.carry(preempted, None, running=True) is None  # running again
    assert why.carry(preempted, waiting, running=False) is preempted  # who preempted it
    assert why.carry(None, waiting, running=False) is waiting
