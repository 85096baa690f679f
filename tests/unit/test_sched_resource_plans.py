"""Resource plans applied to live jobs: the restart rule, when to ask, plan conversion,
and the Brain's data-parallel adjust stage (plain functions)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gearshift.brain import dlrover
from gearshift.common.errors import ValidationError
from gearshift.common.ports import free_port
from gearshift.scheduler.plugins.dlrover.plan_book import load
from gearshift.scheduler.plugins.dlrover.resource_plans import (
    PlanAsk,
    ProcessPlan,
    ResourcePlans,
    describe,
    due,
    from_message,
    restart_pays,
)
from gearshift.scheduler.round.brain import BrainAdvisor
from gearshift.scheduler.round.process_resources import process_resources
from gearshift.scheduler.service import SchedulerSettings
from gearshift.v1 import brain_pb2, common_pb2, worker_pb2
from gearshift.worker.command import CommandSettings, plan_task
from tests.sched_harness import Clock, TableBrain, job_spec, make_scheduler, register
from tests.unit.task_requests import resolved

MIB = 1024**2


def plan(cores: int, memory: int = 512 * MIB, loader: int = 0, rate: float = 0.0) -> ProcessPlan:
    return ProcessPlan("p", "adjust", "optimizer", 0, cores, memory, loader, rate)


def test_a_shrink_pays_when_the_cores_it_frees_outweigh_the_restart() -> None:
    # 4 -> 1 core, 2 processes, 1000 steps at 10/s: 100 s left. As is: 800 core-s;
    # with the plan: 200 + 8 cores idle for 10 s = 280.
    decision = restart_pays(
        plan(4),
        plan(1, rate=10.0),
        processes=2,
        steps_left=1000,
        steps_per_second=10.0,
        restart_seconds=10.0,
    )
    assert decision.apply, decision.why
    assert "800 core-s as is, 280 with the plan" in decision.why


def test_a_shrink_near_the_end_does_not_pay() -> None:
    # 2 -> 1 core with 10 s left and a 10 s restart: 20 core-s either way.
    decision = restart_pays(
        plan(2), plan(1), processes=1, steps_left=100, steps_per_second=10.0, restart_seconds=10.0
    )
    assert not decision.apply


@pytest.mark.parametrize(
    ("proposed", "rate", "why"),
    [
        (plan(4, loader=0), 10.0, "same resources"),
        (plan(1, rate=5.0), 10.0, "slower"),
        (plan(1), 0.0, "no measured rate"),
    ],
)
def test_no_restart_for_the_same_resources_a_slower_plan_or_no_rate(
    proposed: ProcessPlan, rate: float, why: str
) -> None:
    decision = restart_pays(
        plan(4), proposed, processes=1, steps_left=10_000, steps_per_second=rate, restart_seconds=1
    )
    assert not decision.apply
    assert why in decision.why


def test_memory_or_loader_changes_alone_wait_for_the_next_restart() -> None:
    decision = restart_pays(
        plan(2),
        plan(2, memory=256 * MIB, loader=1),
        processes=1,
        steps_left=10_000,
        steps_per_second=10.0,
        restart_seconds=1.0,
    )
    assert not decision.apply


def _ask(job_id: str, running: bool) -> PlanAsk:
    return PlanAsk(job_id, running, 1, 10, 0.0, 10.0, 2.0, 1, common_pb2.JobSpec(), 0.0)


def test_due_asks_new_jobs_at_once_and_running_ones_every_interval() -> None:
    asks = [_ask("new", False), _ask("fresh", True), _ask("old", True), _ask("queued", False)]
    plans = {j: plan(1) for j in ("fresh", "old", "queued")}
    asked = {"fresh": 95.0, "old": 80.0, "queued": 0.0}
    initial, adjust = due(asks, plans, asked, 100.0, 10.0)
    assert [a.job_id for a in initial] == ["new"]
    assert [a.job_id for a in adjust] == ["old"]
    assert due(asks, plans, asked, 100.0, 0.0)[1] == []  # 0: never adjusted


def test_from_message_rounds_and_only_history_bounds_devices() -> None:
    message = brain_pb2.ResourcePlan(
        plan_id="x",
        stage=brain_pb2.PLAN_STAGE_INITIAL,
        workers=brain_pb2.NodeGroupPlan(
            count=2, cpu_cores=1.5, memory_bytes=300 * MIB + 1, loader_procs=1
        ),
        source=brain_pb2.PLAN_SOURCE_HISTORY,
        reason="from 3 similar finished job(s)",
    )
    got = from_message(message)
    assert (got.devices, got.cpu_cores, got.memory_bytes, got.loader_procs) == (2, 2, 301 * MIB, 1)
    assert got.stage == "initial" and got.source == "history"
    assert describe(got) == (
        "initial plan from history: 2 cores, 301 MiB, 1 loader proc per process; "
        "starting on at most 2 device(s) (from 3 similar finished job(s))"
    )
    message.source = brain_pb2.PLAN_SOURCE_DEFAULT
    defaults = from_message(message)
    assert (defaults.devices, defaults.memory_bytes) == (0, 0)  # the worker's share
    message.source = brain_pb2.PLAN_SOURCE_OPTIMIZER
    assert from_message(message).devices == 0  # the allocator's
    message.source = brain_pb2.PLAN_SOURCE_HISTORY
    message.ps.count = 1  # a PS job's workers are not devices
    assert from_message(message).devices == 0


def test_process_resources_apply_the_plan_within_the_workers_share() -> None:
    devices = [common_pb2.DeviceGroup(accelerator_type="cpu", count=2)]
    gib = 1024**3
    assert process_resources(8, 8 * gib, devices) == (4, 4 * gib)
    assert process_resources(8, 8 * gib, devices, plan_cores=1, plan_memory=gib) == (1, gib)
    assert process_resources(8, 8 * gib, devices, plan_cores=6) == (4, 4 * gib)  # the share
    assert process_resources(8, 8 * gib, devices, 3, plan_cores=1) == (3, 4 * gib)  # explicit
    assert process_resources(8, 8 * gib, devices, 1, 2, plan_memory=gib) == (1, 2 * gib)


# -- the Brain's side ------------------------------------------------------------------------


def _current(cores: float, loader: int = 1) -> dlrover.ResourcePlan:
    return dlrover.ResourcePlan(
        dlrover.Stage.INITIAL,
        dlrover.NodeGroup(1, cores, 4 * 1024**3, loader),
        dlrover.NodeGroup(0, 0.0, 0),
        dlrover.Source.DEFAULT,
        "",
    )


def test_data_parallel_adjust_shrinks_an_idle_process_to_its_use() -> None:
    budget = dlrover.Budget(8.0, 4.0)
    metrics = dlrover.PsMetrics(
        worker_cores_needed=0.3, worker_memory_bytes_used=200 * MIB, steps_per_second=5.0
    )
    got = dlrover.data_parallel_adjust(budget, metrics, _current(4.0, 2))
    assert got.stage is dlrover.Stage.ADJUST
    assert (got.workers.cpu_cores, got.workers.loader_procs) == (1.0, 0)
    assert got.workers.memory_bytes == 240 * MIB  # observed peak x 1.2
    assert got.predicted_steps_per_second == 5.0
    assert "CPU use 0.30 of 4 cores per process (8%): cores 4 -> 1" in got.reason


def test_data_parallel_adjust_grows_a_busy_process_up_to_c_max_and_keeps_a_fitting_one() -> None:
    budget = dlrover.Budget(8.0, 3.0)
    busy = dlrover.data_parallel_adjust(
        budget, dlrover.PsMetrics(worker_cores_needed=1.99), _current(2.0)
    )
    assert (busy.workers.cpu_cores, busy.workers.loader_procs) == (3.0, 2)
    fits = dlrover.data_parallel_adjust(
        budget, dlrover.PsMetrics(worker_cores_needed=1.5), _current(2.0)
    )
    assert fits.workers == _current(2.0).workers
    unmeasured = dlrover.data_parallel_adjust(budget, dlrover.PsMetrics(), _current(2.0))
    assert unmeasured.workers == _current(2.0).workers
    assert "no CPU measurement" in unmeasured.reason


def test_loader_procs_follow_the_cores_and_the_sample_plan_has_them() -> None:
    assert [dlrover.loader_procs_for(c) for c in (0.5, 1, 2, 3, 16)] == [0, 0, 1, 2, 2]
    sample = dlrover.sample_plan(dlrover.Budget(8.0, 2.0))
    assert sample.workers.loader_procs == 1


def test_metrics_from_samples_take_the_median_use_and_the_peak_memory() -> None:
    samples = [
        dlrover.ProcessSample(1.9, 100, 2.0),  # the first step: imports, warm-up
        dlrover.ProcessSample(0.2, 300, 5.0),
        dlrover.ProcessSample(0.3, 200, 6.0),
    ]
    got = dlrover.metrics_from_samples(samples)
    assert (got.worker_cores_needed, got.worker_memory_bytes_used, got.steps_per_second) == (
        0.3,
        300,
        5.0,
    )
    assert dlrover.metrics_from_samples([]) == dlrover.PsMetrics()


def test_initial_plan_from_data_parallel_history_has_no_ps_and_their_loader_procs() -> None:
    past = [
        dlrover.PastJob(
            f"j{i}",
            float(10 - i),
            dlrover.NodeGroup(2, 1.0, 240 * MIB, 0),
            dlrover.NodeGroup(0, 0.0, 0),
            steps_per_second=4.0,
        )
        for i in range(3)
    ]
    got = dlrover.initial_plan(dlrover.Budget(8.0, 4.0), past, "model type 'm'")
    assert got.source is dlrover.Source.HISTORY
    assert got.workers == dlrover.NodeGroup(2, 1.0, 240 * MIB, 0)
    assert got.ps.count == 0
    assert "from 3 similar finished job(s)" in got.reason


# -- the worker's side -----------------------------------------------------------------------


def _start(loader_procs: int) -> worker_pb2.StartTaskRequest:
    return worker_pb2.StartTaskRequest(
        task_id="t1",
        job_id="j1",
        spec=common_pb2.JobSpec(
            name="j",
            entrypoint=common_pb2.Entrypoint(module="gearshift.examples.mlp"),
            num_ests=1,
            global_batch_size=8,
            total_steps=10,
            dataset=common_pb2.DatasetSpec(size=256, shard_size=16, seed=1),
        ),
        placement=common_pb2.Placement(
            processes=[common_pb2.ProcessAssignment(rank=0, worker_id="w", est_ids=[0])]
        ),
        local_ranks=[0],
        checkpoint_dir="/tmp/ckpt",
        loader_procs_per_process=loader_procs,
    )


def test_the_worker_passes_the_plans_loader_procs_to_each_process() -> None:
    settings = CommandSettings(python="python")
    assert resolved(plan_task(_start(2), "w", ["cpu"]), settings).run.loader_procs == 2
    assert resolved(plan_task(_start(0), "w", ["cpu"]), settings).run.loader_procs == 0
    with pytest.raises(ValidationError, match=r"loader_procs_per_process: must be 0-64 \(got -1\)"):
        plan_task(_start(-1), "w", ["cpu"])


# -- the loop ----------------------------------------------------------------------------------


class Brain:
    """Answers PlanResources from a table by stage (None: the Brain cannot be asked)."""

    def __init__(self, replies: dict[int, brain_pb2.ResourcePlan | None]) -> None:
        self.replies = replies
        self.asked: list[tuple[str, int]] = []

    def __call__(
        self, request: brain_pb2.PlanResourcesRequest, spec: common_pb2.JobSpec, at: float
    ) -> brain_pb2.ResourcePlan | None:
        self.asked.append((request.job_id, request.stage))
        return self.replies[request.stage]


def _reply(stage: int, source: int, cores: float, rate: float) -> brain_pb2.ResourcePlan:
    return brain_pb2.ResourcePlan(
        plan_id=f"p{stage}",
        stage=stage,  # type: ignore[arg-type]
        source=source,  # type: ignore[arg-type]
        workers=brain_pb2.NodeGroupPlan(count=1, cpu_cores=cores, loader_procs=int(cores) - 1),
        predicted_steps_per_second=rate,
    )


def _running(job_id: str, steps_left: int) -> PlanAsk:
    return PlanAsk(job_id, True, 1, steps_left, 0.0, 10.0, 4.0, 1, common_pb2.JobSpec(), 0.0)


def test_the_loop_starts_on_the_initial_plan_then_restarts_for_a_shrink_that_pays() -> None:
    now = [0.0]
    brain = Brain(
        {
            brain_pb2.PLAN_STAGE_INITIAL: _reply(1, brain_pb2.PLAN_SOURCE_DEFAULT, 4.0, 0.0),
            brain_pb2.PLAN_STAGE_ADJUST: _reply(4, brain_pb2.PLAN_SOURCE_OPTIMIZER, 1.0, 10.0),
        }
    )
    plans = ResourcePlans(brain, 5.0, lambda: now[0])
    plans.refresh([_ask("j", False)])
    first = plans.plan("j")
    assert first is not None and (first.cpu_cores, first.loader_procs) == (4, 3)
    assert plans.started("j") == first  # announced once (its PLAN event) ...
    assert plans.started("j") is None  # ... not again at a restart on the same plan
    plans.refresh([_running("j", 10_000)])  # not due: asked at the start
    assert brain.asked == [("j", brain_pb2.PLAN_STAGE_INITIAL)]
    now[0] = 5.0
    plans.refresh([_running("j", 10_000)])
    assert plans.restart_wanted("j")
    shrunk = plans.plan("j")
    assert shrunk is not None and shrunk.cpu_cores == 1 and "core-s as is" in shrunk.reason
    assert plans.started("j") == shrunk
    assert not plans.restart_wanted("j")


def test_a_history_plan_bounds_the_devices_until_the_first_adjust() -> None:
    now = [0.0]
    initial = _reply(1, brain_pb2.PLAN_SOURCE_HISTORY, 2.0, 0.0)
    initial.workers.count = 3  # similar jobs ended on 3 devices
    brain = Brain(
        {
            brain_pb2.PLAN_STAGE_INITIAL: initial,
            brain_pb2.PLAN_STAGE_ADJUST: _reply(4, brain_pb2.PLAN_SOURCE_OPTIMIZER, 2.0, 10.0),
        }
    )
    plans = ResourcePlans(brain, 5.0, lambda: now[0])
    plans.refresh([_ask("j", False)])
    first = plans.started("j")
    assert first is not None and first.devices == 3
    now[0] = 5.0
    plans.refresh([_running("j", 10_000)])  # same resources: no restart, no new event
    after = plans.plan("j")
    assert after is not None and after.devices == 0 and after.cpu_cores == 2
    assert not plans.restart_wanted("j") and plans.started("j") is None


def test_a_shrink_that_does_not_pay_waits_for_the_next_start_and_no_brain_means_defaults() -> None:
    now = [0.0]
    brain = Brain(
        {
            brain_pb2.PLAN_STAGE_INITIAL: _reply(1, brain_pb2.PLAN_SOURCE_DEFAULT, 4.0, 0.0),
            brain_pb2.PLAN_STAGE_ADJUST: _reply(4, brain_pb2.PLAN_SOURCE_OPTIMIZER, 1.0, 10.0),
        }
    )
    plans = ResourcePlans(brain, 5.0, lambda: now[0])
    plans.refresh([_ask("j", False)])
    plans.started("j")
    now[0] = 6.0
    plans.refresh([_running("j", 10)])  # 1 s left: a 10 s restart never pays
    assert not plans.restart_wanted("j")
    waiting = plans.plan("j")
    assert waiting is not None and waiting.cpu_cores == 1  # the next start uses it
    down = ResourcePlans(Brain({brain_pb2.PLAN_STAGE_INITIAL: None}), 5.0, lambda: 0.0)
    down.refresh([_ask("k", False)])
    defaults = down.started("k")
    assert defaults is not None and defaults.source == "defaults"
    assert (defaults.cpu_cores, defaults.memory_bytes, defaults.loader_procs) == (0, 0, 0)
    assert "Brain unavailable" in describe(defaults)


def test_an_unreachable_brain_gives_no_plan_and_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    advisor = BrainAdvisor(f"127.0.0.1:{free_port()}", timeout=2.0)
    request = brain_pb2.PlanResourcesRequest(
        job_id="j", stage=brain_pb2.PLAN_STAGE_INITIAL, cpu_total=1, cpu_max_per_node=1
    )
    try:
        with caplog.at_level("WARNING", logger="gearshift.scheduler.round.brain"):
            assert advisor.plan_resources(request, common_pb2.JobSpec(), 0.0) is None
    finally:
        advisor.close()
    assert any("PlanResources" in str(r.__dict__.get("call", "")) for r in caplog.records)


class HistoryBrain(TableBrain):
    """Every job's initial plan is a history plan: similar jobs ended on 1 device."""

    def plan_resources(
        self, request: brain_pb2.PlanResourcesRequest, spec: common_pb2.JobSpec, at: float
    ) -> brain_pb2.ResourcePlan | None:
        reply = _reply(request.stage, brain_pb2.PLAN_SOURCE_HISTORY, 1.0, 0.0)
        reply.workers.count = 1
        return reply


def test_a_history_plan_starts_best_effort_jobs_on_its_devices_not_guaranteed_ones() -> None:
    settings = SchedulerSettings(
        policy="max_min_fairness", elastic=True, round_seconds=60.0, plan_interval=0.0
    )
    scheduler, _ = make_scheduler(
        settings, clock=Clock(), brain=HistoryBrain(lambda job, kind, n: float(n))
    )
    try:
        register(scheduler, "w", {"cpu": 8})
        best, _ = scheduler.submit(job_spec("best", 2), "")
        owed, _ = scheduler.submit(
            job_spec("owed", 2, service_class=common_pb2.SERVICE_CLASS_GUARANTEED), ""
        )
        scheduler.run_round()
        # Both could have 2 of the 8 devices; history holds the best-effort one to 1.
        assert len(scheduler.get(best.job_id).placement.processes) == 1
        assert len(scheduler.get(owed.job_id).placement.processes) == 2
    finally:
        scheduler.stop()


class CountingHistoryBrain(HistoryBrain):
    """A HistoryBrain that counts what it is asked."""

    def __init__(self) -> None:
        super().__init__(lambda job, kind, n: float(n))
        self.plans_asked = 0

    def plan_resources(
        self, request: brain_pb2.PlanResourcesRequest, spec: common_pb2.JobSpec, at: float
    ) -> brain_pb2.ResourcePlan | None:
        self.plans_asked += 1
        return super().plan_resources(request, spec, at)


def test_a_restarted_scheduler_keeps_the_plan_a_running_job_runs() -> None:
    """The plan is stored with the job (migration 0009): a restarted scheduler does not plan
    the running job afresh, and drops the history's device bound (the allocator's now)."""
    settings = SchedulerSettings(
        policy="max_min_fairness", elastic=True, round_seconds=60.0, plan_interval=0.0
    )
    clock, brain = Clock(), CountingHistoryBrain()
    scheduler, _ = make_scheduler(settings, clock=clock, brain=brain)
    again = None
    try:
        register(scheduler, "w", {"cpu": 8})
        job, _ = scheduler.submit(job_spec("best", 2), "")
        scheduler.run_round()
        assert len(scheduler.get(job.job_id).placement.processes) == 1
        stored = scheduler.store.get_job(job.job_id)
        assert stored is not None
        runs = load(ProcessPlan, stored.process_plan)
        assert runs is not None and runs.devices == 1 and runs.source == "history"
        asked = brain.plans_asked
        scheduler.stop()

        again, _ = make_scheduler(settings, clock=clock, brain=brain, store=scheduler.store)
        again.recover()
        assert again.resource_plans is not None
        assert again.resource_plans.plan(job.job_id) == replace(runs, devices=0)
        register(again, "w", {"cpu": 8})
        again.run_round()
        assert brain.plans_asked == asked  # not planned afresh
        assert len(again.get(job.job_id).placement.processes) == 2  # no longer bounded
    finally:
        scheduler.stop()
        if again is not None:
            again.stop()


def test_a_history_cap_gives_way_to_idle_devices_at_the_next_round_while_nothing_waits() -> None:
    """The history's 1 device is a guess: with 3 devices idle and no job waiting the next
    round grows the job to its max_devices, though its first ADJUST never comes."""
    settings = SchedulerSettings(
        policy="max_min_fairness", elastic=True, round_seconds=60.0, plan_interval=0.0
    )
    clock = Clock()
    scheduler, _ = make_scheduler(
        settings, clock=clock, brain=HistoryBrain(lambda job, kind, n: float(n))
    )
    try:
        register(scheduler, "w", {"cpu": 4})
        job, _ = scheduler.submit(job_spec("train", 4), "")
        scheduler.run_round()
        assert len(scheduler.get(job.job_id).placement.processes) == 1  # it starts capped
        clock.now += 1.0  # within the workers' heartbeat timeout
        scheduler.run_round()
        assert len(scheduler.get(job.job_id).placement.processes) == 4
        plan = scheduler.resource_plans.plan(job.job_id) if scheduler.resource_plans else None
        assert plan is not None and plan.devices == 0 and plan.source == "history"
    finally:
        scheduler.stop()


def test_a_history_cap_stands_while_a_job_waits() -> None:
    settings = SchedulerSettings(
        policy="max_min_fairness", elastic=True, round_seconds=60.0, plan_interval=0.0
    )
    clock = Clock()
    scheduler, _ = make_scheduler(
        settings, clock=clock, brain=HistoryBrain(lambda job, kind, n: float(n))
    )
    try:
        register(scheduler, "w", {"cpu": 4})
        job, _ = scheduler.submit(job_spec("train", 4), "")
        scheduler.run_round()
        rigid = job_spec("rigid", 8)
        rigid.elastic.min_devices = 8  # more than there are: it waits for the idle ones
        waiting, _ = scheduler.submit(rigid, "")
        clock.now += 1.0  # within the workers' heartbeat timeout
        scheduler.run_round()
        assert len(scheduler.get(job.job_id).placement.processes) == 1
        assert scheduler.get(waiting.job_id).state == common_pb2.JOB_STATE_QUEUED
        plan = scheduler.resource_plans.plan(job.job_id) if scheduler.resource_plans else None
        assert plan is not None and plan.devices == 1
    finally:
        scheduler.stop()
