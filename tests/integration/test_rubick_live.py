"""`profile.allocate: {name: rubick}` in the scheduler with a real Brain process (SQLite): a
job without a fit runs its own plan on its request; once its model key's profile is in the
Brain, the next round fetches the fit and - gradient checkpointing off not fitting in the
workers' device memory - restarts the job with GC on (same devices, a checkpoint), recorded
as an event."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearshift.common.channel import connect
from gearshift.common.ports import free_port_in
from gearshift.common.rubick.model import Config, ForwardSample, Params, Workload, iter_time
from gearshift.common.rubick.plans import Plan, Resources, Zero
from gearshift.scheduler.config.configuration import validate
from gearshift.scheduler.config.settings import settings_of
from gearshift.scheduler.plugins.rubick.plan_choice import RubickPlans
from gearshift.scheduler.plugins.rubick.rubick_live import LiveRubick
from gearshift.scheduler.round.brain import BrainAdvisor
from gearshift.scheduler.service import SchedulerSettings
from gearshift.v1 import brain_pb2, brain_pb2_grpc, common_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.conftest import DaemonFactory
from tests.helpers import wait_until
from tests.integration.test_sched_service import (
    WAIT,
    FakeWorker,
    events,
    fresh_channel,
    job_state,
    spec,
    start_scheduler,
)
from tests.sched_harness import Clock, job_spec, make_scheduler

B = brain_pb2
C = common_pb2
S = scheduler_pb2
TRUE = Params(k_bwd=2.0, k_sync=3.0, k_opt=0.02, k_opt_off=4.0, k_off=2.5, k_swap=3.5, k_const=5.0)
# 100 M parameters, 64 samples a step over 4 ESTs: 5.4 GB of activations per device without
# GC, 0.9 GB with it - on 4 GB devices only GC on fits.
WORKLOAD = Workload("lm", 100.0, 64, 1e7, 10, (ForwardSample(4, 10.0), ForwardSample(16, 40.0)))
PROFILED = [
    Plan(dp=1, ga=4),
    Plan(dp=2, ga=2),
    Plan(dp=4),
    Plan(dp=4, gc=True),
    Plan(dp=2, ga=2, gc=True),
    Plan(dp=4, zero=Zero.OFFLOAD),
    Plan(dp=2, ga=2, zero=Zero.OFFLOAD),
    Plan(dp=1, ga=4, zero=Zero.OFFLOAD, gc=True),
]


@pytest.fixture
def brain(daemons: DaemonFactory, tmp_path: Path) -> Iterator[str]:
    daemon = daemons("brain", ["--database-url", f"sqlite:///{tmp_path / 'brain.db'}"])
    yield daemon.address


@pytest.fixture
def fake_workers() -> Iterator[list[FakeWorker]]:
    started: list[FakeWorker] = []
    yield started
    for worker in started:
        worker.close()


def store_profile(address: str, key: str) -> None:
    runs = []
    for plan in PROFILED:
        ms = iter_time(TRUE, WORKLOAD, Config(plan, Resources((plan.gpus,), 1)))
        runs.append(
            B.RubickRun(
                plan=B.RubickPlan(
                    dp=plan.dp,
                    ga=plan.ga,
                    gc=plan.gc,
                    zero=B.ZERO_MODE_OFFLOAD
                    if plan.zero is Zero.OFFLOAD
                    else B.ZERO_MODE_UNSPECIFIED,
                ),
                resources=B.RubickResources(placement=[plan.gpus], cpus_per_gpu=1),
                iteration_seconds=ms / 1e3,
            )
        )
    w = WORKLOAD
    workload = B.RubickWorkload(
        params_millions=w.params_m,
        global_batch=w.global_batch,
        seq_hid_layers=w.seq_hid_layers,
        layers=w.layers,
        forward=[B.RubickForward(samples_per_gpu=f.work, milliseconds=f.ms) for f in w.forward],
    )
    with connect(address, retry=False) as channel:
        stub = brain_pb2_grpc.BrainStub(channel)
        stub.StoreRubickProfile(
            B.StoreRubickProfileRequest(model_key=key, workload=workload, runs=runs), timeout=30
        )


@pytest.mark.parametrize("workers", [{"w1": ("v100", 4)}, {"w1": ("cpu", 2), "w2": ("cpu", 2)}])
def test_a_fitted_model_changes_a_running_jobs_plan(
    brain: str, workers: dict[str, tuple[str, int]]
) -> None:
    clock = Clock()
    settings = SchedulerSettings(policy="rubick", round_seconds=60.0, heartbeat_timeout=1e9)
    scheduler, agents = make_scheduler(settings, clock=clock, brain=BrainAdvisor(brain))
    try:
        assert isinstance(scheduler.rounds.allocator, LiveRubick)
        for i, (name, (kind, count)) in enumerate(sorted(workers.items())):
            scheduler.register_worker(
                name,
                f"127.0.0.1:{1001 + i}",
                "test",
                [C.DeviceGroup(accelerator_type=kind, count=count, memory_bytes=4 << 30)],
                [],
            )
        spec = job_spec("lm", 4, global_batch_size=64)
        spec.plan_dimensions.gradient_checkpointing = True
        job, _ = scheduler.submit(spec, "")

        # No fit yet: its own plan (GC off) on its request (4 devices, one EST each).
        report = scheduler.run_round()
        assert report.started == [job.job_id]
        first = agents.started[-1]
        assert len(first.placement.processes) == 4
        assert not first.plan.gradient_checkpointing
        assert scheduler.rounds.allocator.fitted(job.job_id) is None

        # The profile arrives; the fit is asked again after retry_seconds.
        store_profile(brain, "lm")
        clock.now += 6.0
        report = scheduler.run_round()
        assert scheduler.rounds.allocator.fitted(job.job_id) is not None
        assert report.rescaled == [job.job_id]  # a new plan alone: restarted in place
        assert agents.stopped and all(checkpoint for _, checkpoint in agents.stopped)
        second = agents.started[-1]
        assert second.plan.gradient_checkpointing
        assert [p.worker_id for p in second.placement.processes] == [
            p.worker_id for p in first.placement.processes
        ]
        record = scheduler.get(job.job_id)
        assert record.plan.gradient_checkpointing
        events = scheduler.store.events_after(job.job_id, 0)
        rescaled = [e for e in events if e.type == S.JOB_EVENT_TYPE_RESCALED]
        assert len(rescaled) == 1 and "plan: gc on" in rescaled[0].message

        # The plan it runs is the one the model prefers: nothing changes next round.
        clock.now += 60.0
        report = scheduler.run_round()
        assert report.renewed == [job.job_id] and not report.rescaled
        assert len({r.task_id.rsplit(".", 1)[0] for r in agents.started}) == 2  # two starts
    finally:
        scheduler.stop()


def test_the_default_profile_chooses_a_plan_beside_its_objective(brain: str) -> None:
    """No configuration file: the elastic LAS objective gives the jobs their devices, and
    Rubick's plan choice (profile.executionPlans) gives the job whose spec allows gradient
    checkpointing GC on the workers' 4 GiB devices (its model key's fit says GC off does not
    fit); the job whose spec allows nothing runs its own plan, and is not profiled."""
    clock = Clock()
    defaults = settings_of(validate({}))
    assert defaults.execution_plans == "rubick"
    settings = dataclasses.replace(defaults, heartbeat_timeout=1e9, decision_process=False)
    store_profile(brain, "lm-default")
    scheduler, agents = make_scheduler(settings, clock=clock, brain=BrainAdvisor(brain))
    try:
        assert isinstance(scheduler.rounds.execution_plans, RubickPlans)
        device = C.DeviceGroup(accelerator_type="cpu", count=4, memory_bytes=4 << 30)
        scheduler.register_worker("w1", "127.0.0.1:1001", "test", [device], [])
        allows = job_spec("allows", 4, global_batch_size=64, model_type="lm-default")
        allows.plan_dimensions.gradient_checkpointing = True
        plain = job_spec("plain", 4, global_batch_size=64, model_type="lm-default")
        with_gc, _ = scheduler.submit(allows, "")
        without, _ = scheduler.submit(plain, "")
        report = scheduler.run_round()
        assert sorted(report.started) == sorted([with_gc.job_id, without.job_id])
        starts = {r.job_id: r for r in agents.started}
        assert starts[with_gc.job_id].plan.gradient_checkpointing
        assert starts[with_gc.job_id].profile_rubick  # its own fit is still to come
        assert not starts[without.job_id].plan.gradient_checkpointing
        assert not starts[without.job_id].profile_rubick
        assert scheduler.get(with_gc.job_id).plan.gradient_checkpointing
        notes = [
            e.message
            for e in scheduler.store.events_after(with_gc.job_id, 0)
            if e.type == S.JOB_EVENT_TYPE_PLAN and e.message.startswith("rubick")
        ]
        assert notes == ["rubick model: Eq. 1 fitted on 8 configurations of model lm-default"]
        assert not any(
            e.message.startswith("rubick") for e in scheduler.store.events_after(without.job_id, 0)
        )
    finally:
        scheduler.stop()


def test_a_restarted_scheduler_resumes_the_job_on_its_stored_plan(
    brain: str,
    daemons: DaemonFactory,
    tmp_path: Path,
    postgres_db: str,
    fake_workers: list[FakeWorker],
) -> None:
    """Issue 19: the job's plan (GC on, which the fit demands on 4 GiB devices) is stored with
    it, so a scheduler killed and started again on the same database shows the same plan and
    keeps the running job as it is - no restart because it forgot the plan."""
    store_profile(brain, "lm-restart")
    port = free_port_in(20000, 30000)  # the same address after the restart
    flags = ["--listen", f"127.0.0.1:{port}"]
    cluster = {"brainAddress": brain}
    daemon = start_scheduler(
        daemons, tmp_path, postgres_db, *flags, policy="rubick", cluster=cluster
    )
    device = C.DeviceGroup(accelerator_type="cpu", count=4, memory_bytes=4 << 30)
    fake_workers.append(FakeWorker("w1", daemon.address, [device]))
    agent = fake_workers[0].agent
    lm = spec("lm", 4)
    lm.global_batch_size = 64
    lm.model_type = "lm-restart"
    lm.plan_dimensions.gradient_checkpointing = True
    with connect(daemon.address) as channel:
        jobs = scheduler_pb2_grpc.JobServiceStub(channel)
        job_id = jobs.SubmitJob(S.SubmitJobRequest(spec=lm)).job.job_id
        wait_until(lambda: job_state(jobs, job_id) == C.JOB_STATE_RUNNING, WAIT, "it runs")
        before = jobs.GetJob(S.GetJobRequest(job_id=job_id))
        seen = len(events(jobs, job_id))
    assert before.plan.gradient_checkpointing and len(before.placement.processes) == 4
    assert [r.plan.gradient_checkpointing for r in agent.starts] == [True]
    daemon.kill()  # as a crash would
    restarted = start_scheduler(
        daemons, tmp_path, postgres_db, *flags, policy="rubick", cluster=cluster
    )
    with fresh_channel(restarted.address) as fresh:
        jobs = scheduler_pb2_grpc.JobServiceStub(fresh)
        after = jobs.GetJob(S.GetJobRequest(job_id=job_id))
        assert after.plan == before.plan  # read back from the store
        round_now = jobs.GetClusterState(S.GetClusterStateRequest()).round
        wait_until(
            lambda: jobs.GetClusterState(S.GetClusterStateRequest()).round >= round_now + 4,
            WAIT,
            "rounds continue (the fit asked for again)",
        )
        now = jobs.GetJob(S.GetJobRequest(job_id=job_id))
        kinds_after = {e.type for e in events(jobs, job_id)[seen:]}
    assert now.state == C.JOB_STATE_RUNNING and now.plan == before.plan
    assert now.placement == before.placement
    assert len(agent.starts) == 1 and not agent.stops  # never restarted
    assert S.JOB_EVENT_TYPE_RESCALING not in kinds_after
