"""The scheduler's side of PS jobs (ps_jobs.py): Brain plans within the spec's bounds, the
stage to ask (initial -> optimize -> adjust), and the loop, against the Brain's own DLRover
planner (convert + dlrover: the formulas the Brain daemon runs, without its storage)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gearshift.brain import dlrover
from gearshift.brain.convert import plan_message, plan_request
from gearshift.common.errors import ValidationError
from gearshift.scheduler.plugins.dlrover.plan_book import dump, load
from gearshift.scheduler.plugins.dlrover.ps_jobs import (
    PsAsk,
    PsPlan,
    PsPlans,
    describe,
    fallback,
    from_message,
    measured,
    next_stage,
    pinned,
    slot_cores,
    task_cores,
    to_task,
    with_spec_counts,
)
from gearshift.v1 import brain_pb2, common_pb2

B = brain_pb2


def spec(
    ps: int = 0, workers: int = 0, max_ps: int = 8, max_workers: int = 24
) -> common_pb2.JobSpec:
    return common_pb2.JobSpec(
        name="wd",
        total_steps=1000,
        parameter_server=common_pb2.ParameterServerSpec(
            ps=ps, workers=workers, max_ps=max_ps, max_workers=max_workers
        ),
    )


def brain_plan(ps: int, ps_cores: float, workers: int, worker_cores: float) -> B.ResourcePlan:
    return B.ResourcePlan(
        plan_id="p",
        stage=B.PLAN_STAGE_OPTIMIZE,
        source=B.PLAN_SOURCE_OPTIMIZER,
        ps=B.NodeGroupPlan(count=ps, cpu_cores=ps_cores),
        workers=B.NodeGroupPlan(count=workers, cpu_cores=worker_cores),
        reason="why",
    )


def test_a_brain_plan_is_clamped_to_the_bounds_and_the_budget() -> None:
    plan = from_message(brain_plan(10, 16.0, 30, 2.5), spec(max_ps=4, max_workers=6), 8.0)
    assert (plan.ps, plan.workers, plan.ps_cores, plan.worker_cores) == (4, 6, 8.0, 3.0)
    assert "ps 10 -> 4" in plan.reason and "workers 30 -> 6" in plan.reason
    assert plan.stage == "optimize" and plan.source == "optimizer"


def test_a_hot_ps_replacement_gives_that_ps_more_cores_and_keeps_them() -> None:
    reply = brain_plan(3, 1.0, 4, 1.0)
    reply.stage = B.PLAN_STAGE_ADJUST
    reply.ps_replacements.add(ps_index=1, cpu_cores=3.0)
    hot = from_message(reply, spec(), 8.0)
    assert hot.cores_each == (1.0, 3.0, 1.0) and hot.total_cores == 9.0
    assert to_task(hot).ps_cores_each == [1.0, 3.0, 1.0]
    kept = from_message(brain_plan(3, 1.0, 4, 1.0), spec(), 8.0, current=hot)
    assert kept.same_shape(hot)  # the next adjust without a hot PS does not shrink it back
    assert "cores 1/3/1" in describe(hot) and "not bitwise reproducible" in describe(hot)


def test_spec_counts_win_and_no_brain_falls_back_to_them() -> None:
    plan = with_spec_counts(from_message(brain_plan(1, 4.0, 1, 4.0), spec(2, 2), 8.0), spec(2, 2))
    assert (plan.ps, plan.workers, plan.source) == (2, 2, "spec")
    assert (fallback(spec(0, 3), "down").ps, fallback(spec(0, 3), "down").workers) == (1, 3)


def test_cores_of_the_task_and_the_budget() -> None:
    plan = PsPlan(ps=2, workers=4, ps_cores=1.0, worker_cores=1.0)
    assert task_cores(plan, 16) == 6 and task_cores(plan, 4) == 4 and task_cores(plan, 0) == 0
    assert slot_cores([(16, 1), (8, 4), (0, 0)]) == 16.0 and slot_cores([]) == 0.0


def metrics(ps: int, workers: int, seconds: float = 5.0) -> common_pb2.ParameterServerMetrics:
    return common_pb2.ParameterServerMetrics(
        worker_cores_used=2.5,
        ps_cores_per_worker=5.7,
        ps_cores_used=[5.7 * workers / ps] * ps,
        ps=ps,
        workers=workers,
        measured_seconds=seconds,
    )


def test_the_stage_follows_dlrover_initial_optimize_adjust() -> None:
    sampled = PsPlan(ps=1, workers=1, ps_cores=16.0, worker_cores=32.0, stage="initial")
    optimized = PsPlan(ps=8, workers=24, ps_cores=16.0, worker_cores=3.0, stage="optimize")
    m = measured(metrics(1, 1), sampled)
    assert next_stage(None, None, running=False, since_asked=0, interval=60) == B.PLAN_STAGE_INITIAL
    assert next_stage(sampled, None, running=True, since_asked=99, interval=60) is None
    assert next_stage(sampled, m, running=True, since_asked=0, interval=60) == B.PLAN_STAGE_OPTIMIZE
    m2 = measured(metrics(8, 24), optimized)
    assert next_stage(optimized, m2, running=True, since_asked=10, interval=60) is None
    assert (
        next_stage(optimized, m2, running=True, since_asked=60, interval=60) == B.PLAN_STAGE_ADJUST
    )
    # Measurements of other counts (the previous plan's), or too short, do not count.
    assert measured(metrics(1, 1), optimized) is None
    assert measured(metrics(8, 24, seconds=0.5), optimized) is None


def dlrover_brain(
    request: B.PlanResourcesRequest, spec: common_pb2.JobSpec, at: float
) -> B.ResourcePlan:
    """The Brain's planner, as its service dispatches it (no storage)."""
    req = plan_request(request)
    if req.stage is dlrover.Stage.INITIAL:
        plan = dlrover.initial_plan(req.budget, [], "model type 'wide-deep'")
    elif req.stage is dlrover.Stage.OPTIMIZE:
        plan = dlrover.optimize_plan(req.budget, req.metrics, req.current)
    else:
        assert req.current is not None
        plan = dlrover.adjust_plan(req.budget, req.metrics, req.current)
    return plan_message(plan, f"plan-{request.stage}")


def ask(running: bool, m: common_pb2.ParameterServerMetrics | None = None) -> PsAsk:
    return PsAsk("j", running, spec(), 0.0, 200.0, m, 12.0)


def test_dlrover_table_1_wide_and_deep_runs_with_the_optimized_plan() -> None:
    """Sample -> optimize with the measured ŵ = 2.5, ŝ = 5.7 under C_total = 200: DLRover's
    Table 1 plan, 24 workers x 3 cores and 8 PS x 16 cores; then a kept adjust."""
    now = [0.0]
    plans = PsPlans(dlrover_brain, 60.0, lambda: now[0])
    plans.refresh([ask(False)])
    first = plans.plan("j")
    assert first is not None and (first.ps, first.workers) == (1, 1) and first.stage == "initial"
    assert plans.started("j") == first and plans.started("j") is None
    plans.refresh([ask(True)])  # nothing measured yet: nothing asked
    assert not plans.restart_wanted("j")
    plans.refresh([ask(True, metrics(1, 1))])
    assert plans.restart_wanted("j")
    table1 = plans.plan("j")
    assert table1 is not None and table1.stage == "optimize"
    assert (table1.workers, table1.worker_cores, table1.ps, table1.ps_cores) == (24, 3.0, 8, 16.0)
    assert table1.total_cores == 200.0
    assert plans.started("j") == table1 and not plans.restart_wanted("j")
    now[0] = 30.0
    plans.refresh([ask(True, metrics(8, 24))])  # not due before the interval
    assert not plans.restart_wanted("j")
    now[0] = 61.0
    plans.refresh([ask(True, metrics(8, 24))])  # busy, balanced PS: the plan is kept
    assert not plans.restart_wanted("j")
    assert plans.plan("j") is not None and plans.plan("j").stage == "adjust"  # type: ignore[union-attr]


def test_no_brain_runs_the_spec_counts_and_a_down_brain_keeps_the_plan() -> None:
    plans = PsPlans(lambda r, s, t: None, 60.0, lambda: 0.0)
    plans.refresh([PsAsk("j", False, spec(2, 3), 0.0, 8.0, None, 0.0)])
    plan = plans.plan("j")
    assert (
        plan is not None
        and (plan.ps, plan.workers) == (2, 3)
        and "Brain unavailable" in plan.reason
    )
    plans.refresh([PsAsk("j", True, spec(2, 3), 0.0, 8.0, metrics(2, 3), 1.0)])
    assert plans.plan("j") == plan and not plans.restart_wanted("j")


@pytest.mark.parametrize("interval", [0.0])
def test_adjust_never_asked_with_interval_0(interval: float) -> None:
    optimized = PsPlan(ps=8, workers=24, ps_cores=16.0, worker_cores=3.0, stage="optimize")
    m = measured(metrics(8, 24), optimized)
    assert next_stage(optimized, m, running=True, since_asked=1e9, interval=interval) is None


def test_pinned_counts_are_checked_against_the_spec_and_the_slot() -> None:
    current = PsPlan(ps=1, workers=4, ps_cores=2.0, worker_cores=1.0, stage="optimize")
    plan = pinned(
        spec(max_ps=4, max_workers=4), current, ps=3, workers=4, ps_cores=0, worker_cores=0,
        budget=2.0, who="tenant:t",
    )  # fmt: skip
    assert (plan.ps, plan.workers, plan.ps_cores, plan.worker_cores) == (3, 4, 2.0, 1.0)
    assert describe(plan).startswith("set by tenant:t: 3 PS (2 cores each) x 4 workers")
    for kwargs, field in (
        ({"ps": 5, "workers": 4}, "ps"),
        ({"ps": 0, "workers": 4}, "ps"),
        ({"ps": 2, "workers": 9}, "workers"),
        ({"ps": 2, "workers": 2, "ps_cores": 3.0}, "ps_cores"),
        ({"ps": 2, "workers": 2, "worker_cores": 1.5}, "worker_cores"),
    ):
        args = {"ps_cores": 0.0, "worker_cores": 0.0, **kwargs}
        with pytest.raises(ValidationError) as err:
            pinned(spec(max_ps=4, max_workers=4), current, budget=2.0, who="a", **args)  # type: ignore[arg-type]
        assert err.value.message.startswith(field), err.value.message


def test_a_pin_overrides_the_brain_until_auto() -> None:
    """Pinned counts replace a pending Brain plan, take a restart, and the Brain is not
    asked until they are cleared; then ADJUST from the pinned plan after the interval."""
    now = [0.0]
    asked: list[int] = []

    def brain(r: B.PlanResourcesRequest, s: common_pb2.JobSpec, t: float) -> B.ResourcePlan:
        asked.append(r.stage)
        return dlrover_brain(r, s, t)

    plans = PsPlans(brain, 10.0, lambda: now[0])
    plans.refresh([ask(False)])
    first = plans.plan("j")
    assert first is not None
    plans.started("j")
    plans.refresh([ask(True, metrics(1, 1))])  # the Brain's optimize plan waits
    assert plans.restart_wanted("j")
    set_by = pinned(spec(), first, ps=3, workers=4, ps_cores=1, worker_cores=1, budget=8, who="a")
    assert plans.pin("j", set_by, running=True) and plans.plan("j") == set_by
    assert plans.started("j") == set_by and not plans.restart_wanted("j")
    calls = len(asked)
    now[0] = 100.0
    plans.refresh([ask(True, metrics(3, 4))])
    assert len(asked) == calls and plans.plan("j") == set_by  # pinned: not asked
    same = pinned(spec(), set_by, ps=3, workers=4, ps_cores=1, worker_cores=1, budget=8, who="b")
    assert not plans.pin("j", same, running=True) and not plans.restart_wanted(
        "j"
    )  # already runs that
    assert plans.unpin("j") and not plans.unpin("j")
    plans.refresh([ask(True, metrics(3, 4))])  # not due yet: the interval restarts
    assert len(asked) == calls
    now[0] = 111.0
    plans.refresh([ask(True, metrics(3, 4))])
    assert asked[-1] == B.PLAN_STAGE_ADJUST


def test_without_a_brain_a_pin_still_applies() -> None:
    plans = PsPlans(None, 10.0, lambda: 0.0)
    plans.refresh([ask(False)])
    assert plans.plan("j") is None  # the task runs the spec's counts (fallback)
    set_by = pinned(spec(), None, ps=2, workers=2, ps_cores=0, worker_cores=0, budget=0, who="a")
    assert (set_by.ps_cores, set_by.worker_cores) == (1.0, 1.0)
    assert plans.pin("j", set_by, running=False) and plans.started("j") == set_by
    again = replace(set_by, source="b")
    assert plans.pin("j", again, running=False)  # not running: announced at its start
    assert plans.started("j") == again


def test_a_plan_survives_its_row_and_a_bad_row_is_no_plan() -> None:
    plan = PsPlan(2, 3, 1.0, 2.0, ps_cores_each=(1.0, 3.0), stage="set", source="a", reason="r")
    assert load(PsPlan, dump(plan)) == plan
    assert dump(None) == "" and load(PsPlan, "") is None
    assert load(PsPlan, "{not json") is None and load(PsPlan, '{"ps": 2, "nope": 1}') is None


def test_a_restarted_scheduler_keeps_the_running_plan_and_the_pin() -> None:
    """Recovered from the job's row: the running plan needs no restart and is not
    announced again; a pin keeps the Brain unasked, and one the job does not run yet
    still waits for its next start."""
    now = [0.0]
    asked: list[int] = []

    def brain(r: B.PlanResourcesRequest, s: common_pb2.JobSpec, t: float) -> B.ResourcePlan:
        asked.append(r.stage)
        return dlrover_brain(r, s, t)

    runs = PsPlan(2, 2, 1.0, 1.0, stage="optimize", source="optimizer")
    plans = PsPlans(brain, 10.0, lambda: now[0])
    plans.recover("j", runs, None, running=True)
    assert plans.plan("j") == runs and not plans.restart_wanted("j")
    assert plans.started("j") is None  # already announced before the restart
    plans.refresh([ask(True, metrics(2, 2))])
    assert asked == []  # asked again an interval later, from the recovered plan
    now[0] = 11.0
    plans.refresh([ask(True, metrics(2, 2))])
    assert asked == [B.PLAN_STAGE_ADJUST]

    pin = pinned(spec(), runs, ps=3, workers=4, ps_cores=0, worker_cores=0, budget=8, who="a")
    pinned_plans = PsPlans(brain, 10.0, lambda: now[0])
    pinned_plans.recover("j", runs, pin, running=True)
    assert pinned_plans.pinned("j") and pinned_plans.restart_wanted("j")
    assert pinned_plans.started("j") == pin
    now[0] = 100.0
    pinned_plans.refresh([ask(True, metrics(3, 4))])
    assert asked == [B.PLAN_STAGE_ADJUST]  # pinned: the Brain is not asked
    same = PsPlans(brain, 10.0, lambda: now[0])
    same.recover("j", pin, pin, running=True)  # the pin already ran
    assert same.pinned("j") and not same.restart_wanted("j") and same.plan("j") == pin
