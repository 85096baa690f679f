"""The daemon's `rubick` allocator: plans limited to what the runtime executes, the mapping to
the runtime's ExecutionPlan, and Algorithm 1 over a live snapshot (fitted and unfitted jobs)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest

from gearshift.client.render import as_dict, tenants_text
from gearshift.common.rubick.model import A800, ForwardSample, Params, Workload
from gearshift.common.rubick.perf import Mode, ModelPerf, PerfSource, Runtime
from gearshift.common.rubick.plans import Plan, Zero
from gearshift.scheduler.plugins.rubick.fits import (
    Fitted,
    JobFacts,
    model_note,
    original_plan,
    wants_profile,
)
from gearshift.scheduler.plugins.rubick.rubick_live import LiveRubick
from gearshift.scheduler.plugins.rubick.tenants import Quotas
from gearshift.scheduler.round.hooks import execution_plan
from gearshift.scheduler.service import SchedulerSettings
from gearshift.scheduler.state.records import WorkerRecord
from gearshift.scheduler.types import Device, JobSnapshot, Snapshot
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.sched_harness import Clock, job_spec, make_scheduler, register

C = common_pb2
PARAMS = Params(2.0, 2.0, 0.05, 3.0, 2.0, 2.0, 5.0)
# 100 M parameters (1.6 GB of model states); 340 MB of activations per sample without GC,
# 54 MB with it: 16 samples per EST step need 5.4 GB without GC, 0.9 GB with.
ACTIVATIONS = Workload("lm", 100.0, 64, 1e7, 10, (ForwardSample(16, 40.0),))
# 1,000 M parameters: 16 GB of model states on the GPU, 2 GB with them offloaded.
BIG = Workload("big", 1000.0, 64, 1e5, 10, (ForwardSample(16, 40.0),))


def facts(job_id: str, *, ests: int = 4, gc: bool = False, offload: bool = False) -> JobFacts:
    return JobFacts(job_id, "", ests, 1, ests, gc, offload, C.ExecutionPlan())


def snap(job_id: str, *, ests: int = 4, arrival: float = 0.0) -> JobSnapshot:
    return JobSnapshot(
        job_id=job_id,
        num_ests=ests,
        min_devices=1,
        max_devices=ests,
        types=("v100",),
        capability={"v100": 1.0},
        throughputs={"v100": 1.0},
        steps_remaining=100.0,
        arrival_time=arrival,
    )


def worker(name: str, devices: int, memory_gb: float, kind: str = "v100") -> WorkerRecord:
    group = C.DeviceGroup(accelerator_type=kind, count=devices, memory_bytes=int(memory_gb * 1e9))
    return WorkerRecord(name, "127.0.0.1:1", "h", [group], True, 0.0, 0.0)


def devices(workers: list[WorkerRecord]) -> tuple[Device, ...]:
    return tuple(
        Device(w.worker_id, i, g.accelerator_type)
        for w in workers
        for g in w.devices
        for i in range(g.count)
    )


def live(fits: Mapping[str, Fitted]) -> LiveRubick:
    return LiveRubick(fits.get)


def test_runtime_limits_give_only_data_parallel_plans_over_the_ests() -> None:
    gc_only = Runtime(4, gc=True)
    plans = gc_only.plans(Plan(dp=4), 4, 2)
    assert plans == [Plan(dp=2, ga=2), Plan(dp=2, ga=2, gc=True)]
    assert gc_only.plans(Plan(dp=4), 4, 3) == []  # 3 devices do not divide 4 ESTs
    assert Runtime(4).plans(Plan(dp=4), 4, 4) == [Plan(dp=4)]  # neither GC nor offload
    offload = {p.zero for p in Runtime(4, offload=True).plans(Plan(dp=4), 4, 1)}
    assert offload == {Zero.NONE, Zero.OFFLOAD}  # never ZeRO-DP
    assert Runtime(4, max_devices=2).plans(Plan(dp=4), 4, 4) == []  # the job's bounds
    fixed = Runtime(4, fixed_ms=10.0)
    assert fixed.plans(Plan(dp=4), 4, 4) == [Plan(dp=4)] and fixed.plans(Plan(dp=4), 4, 2) == []
    perf = PerfSource({"j": ModelPerf(ACTIVATIONS, PARAMS, {}, Runtime(4, gc=True))})
    plans = perf.candidates("j", Plan(dp=4), 4, (2,), Mode.ANY)
    assert all(p.tp == p.pp == 1 and p.dp * p.ga == 4 for p in plans) and len(plans) == 2
    assert perf.candidates("j", Plan(dp=4), 4, (2,), Mode.DP) == [Plan(dp=2, ga=2)]
    with pytest.raises(ValueError, match="ests"):
        Runtime(0)


def test_plans_map_to_the_runtimes_execution_plan_and_back() -> None:
    current = C.ExecutionPlan(threads_per_process=2)
    out = execution_plan(Plan(dp=2, ga=2, gc=True, zero=Zero.OFFLOAD), current)
    assert out == C.ExecutionPlan(
        gradient_checkpointing=True, threads_per_process=2, offload_optimizer=True
    )
    assert execution_plan(Plan(dp=2, ga=2)) == C.ExecutionPlan()
    for bad in (Plan(dp=1, tp=2), Plan(dp=2, zero=Zero.DP)):
        with pytest.raises(ValueError, match="cannot execute"):
            execution_plan(bad)
    job = JobFacts("j", "", 8, 1, 8, True, False, C.ExecutionPlan(gradient_checkpointing=True))
    assert original_plan(job, 4) == Plan(dp=4, ga=2, gc=True)
    assert original_plan(job, 3) == Plan(dp=3, ga=2, gc=True)  # uneven: rounded down


def run(
    rubick: LiveRubick, jobs: list[tuple[JobFacts, JobSnapshot]], workers: list[WorkerRecord]
) -> dict[str, tuple[int, C.ExecutionPlan, dict[str, tuple[int, ...]]]]:
    rubick.refresh([f for f, _ in jobs], workers, 0.0)
    targets = rubick.allocate(Snapshot(0.0, devices(workers), tuple(s for _, s in jobs)))
    out = {}
    for job_id, t in targets.items():
        assert t.plan is not None
        out[job_id] = (t.size, execution_plan(t.plan), dict(t.ests))
    return out


def test_a_fitted_job_turns_gc_on_where_gc_off_does_not_fit() -> None:
    fit = {"j": Fitted("job j", ACTIVATIONS, PARAMS, A800)}
    job = [(facts("j", gc=True), snap("j"))]
    size, plan, ests = run(live(fit), job, [worker("w", 4, 4.0)])["j"]
    assert plan.gradient_checkpointing and size == 4 and ests == {"v100": (1, 1, 1, 1)}
    # With room in memory GC only costs time: off.
    size, plan, _ = run(live(fit), job, [worker("w", 4, 80.0)])["j"]
    assert not plan.gradient_checkpointing and size == 4
    # A job that may not turn GC on and does not fit gets nothing.
    assert run(live(fit), [(facts("j"), snap("j"))], [worker("w", 4, 4.0)]) == {}


def test_offload_only_where_allowed_and_on_gpus() -> None:
    fit = {"j": Fitted("job j", BIG, PARAMS, A800)}
    got = run(live(fit), [(facts("j", offload=True), snap("j"))], [worker("w", 2, 8.0)])
    size, plan, ests = got["j"]
    assert plan.offload_optimizer and size == 2 and ests == {"v100": (2, 2)}
    cpu = [worker("w", 2, 8.0, kind="cpu")]
    assert run(live(fit), [(facts("j", offload=True), snap("j"))], cpu) == {}


def test_an_unfitted_job_keeps_its_request_and_its_plan() -> None:
    fit = {"a": Fitted("job a", ACTIVATIONS, PARAMS, A800)}
    jobs = [(facts("a", gc=True), snap("a")), (facts("b", ests=2), snap("b", ests=2, arrival=1))]
    got = run(live(fit), jobs, [worker("w", 8, 4.0)])
    assert got["b"] == (2, C.ExecutionPlan(), {"v100": (1, 1)})  # its own plan on its request
    assert got["a"][1].gradient_checkpointing


def test_an_unfitted_job_larger_than_the_cluster_gets_what_exists() -> None:
    got = run(live({}), [(facts("b", ests=8), snap("b", ests=8))], [worker("w", 4, 4.0)])
    assert got["b"] == (4, C.ExecutionPlan(), {"v100": (2, 2, 2, 2)})


def test_a_model_keys_fit_serves_its_jobs_asked_once_a_pass_and_retried() -> None:
    asked: list[str] = []
    key_fit = Fitted("model lm", ACTIVATIONS, PARAMS, A800)

    def of_key(key: str) -> Fitted | None:
        asked.append(key)
        return key_fit if len(asked) > 1 else None  # not fitted at the first ask

    rubick = LiveRubick(lambda job_id: None, of_key, retry_seconds=5.0)
    jobs = [dataclasses.replace(facts(j, gc=True), model_key="lm") for j in ("a", "b")]
    rubick.refresh(jobs, [], 0.0)
    assert asked == ["lm"] and rubick.fitted("a") is None
    rubick.refresh(jobs, [], 4.0)  # not due yet
    assert asked == ["lm"]
    rubick.refresh(jobs, [], 5.0)
    assert asked == ["lm", "lm"] and rubick.fitted("a") == rubick.fitted("b") == key_fit
    rubick.refresh(jobs[:1], [], 6.0)  # b ended: forgotten
    assert rubick.fitted("b") is None


def test_guaranteed_jobs_need_a_quota_to_be_guaranteed() -> None:
    fit = {"a": Fitted("job a", ACTIVATIONS, PARAMS, A800)}
    rubick = LiveRubick(fit.get, quotas=lambda: Quotas({"t": {"v100": 2}}))
    s = snap("a")
    s = JobSnapshot(**{**s.__dict__, "guaranteed": True, "entity": "t"})
    run(rubick, [(facts("a", gc=True), s)], [worker("w", 4, 80.0)])
    assert rubick.policy.quotas == {"t": 2}


def test_a_running_jobs_plan_changes_only_while_restarts_pay() -> None:
    """The paper's rule: reconfigure while (T - N*delta)/T > 0.97 (T its running time, N its
    reconfigurations, delta a restart's cost)."""
    fit = {"j": Fitted("job j", ACTIVATIONS, PARAMS, A800)}
    rubick = live(fit)
    f = facts("j", gc=True)
    roomy, tight = [worker("w", 4, 80.0)], [worker("w", 4, 4.0)]
    assert not run(rubick, [(f, snap("j"))], roomy)["j"][1].gradient_checkpointing

    def running(attained: float) -> JobSnapshot:
        s = snap("j").__dict__ | {"current": (("v100", 4),), "restart_seconds": 10.0}
        return JobSnapshot(**s | {"attained_seconds": attained})

    # First change (N = 0): always allowed - the memory shrank, GC on.
    assert run(rubick, [(f, running(100.0))], tight)["j"][1].gradient_checkpointing
    assert rubick.policy.reconfigurations("j") == 1
    # Room again, but (100 - 1*10)/100 = 0.9: it keeps GC on ...
    assert run(rubick, [(f, running(100.0))], roomy)["j"][1].gradient_checkpointing
    # ... until (1000 - 10)/1000 = 0.99 says a restart pays.
    assert not run(rubick, [(f, running(1000.0))], roomy)["j"][1].gradient_checkpointing
    assert rubick.policy.reconfigurations("j") == 2


def test_model_notes_and_who_is_profiled() -> None:
    own = Fitted("job j", ACTIVATIONS, PARAMS, A800, runs=14, own=True)
    keyed = Fitted("model k", ACTIVATIONS, PARAMS, A800, runs=9)
    assert wants_profile(None, "rubick") and wants_profile(keyed, "rubick_e")
    assert not wants_profile(own, "rubick") and not wants_profile(None, "rubick_n")
    assert model_note(own, "rubick").endswith("fitted on 14 configurations of the job's own runs")
    assert model_note(keyed, "rubick").endswith("fitted on 9 configurations of model k")
    assert "none fitted yet" in model_note(None, "rubick")


def test_the_first_start_profiles_and_the_next_round_uses_the_fit() -> None:
    """No fit of the job's own: its first start tells rank 0 to profile (profile_rubick), an
    event says which model its plan came from; once the Brain holds its fit (after the retry
    interval), the next round uses it and says so; later starts do not profile again."""
    fits: dict[str, Fitted] = {}
    rubick = LiveRubick(fits.get, retry_seconds=5.0)
    clock = Clock()
    settings = SchedulerSettings(policy="rubick", round_seconds=60.0)
    scheduler, agents = make_scheduler(settings, clock=clock, allocator=rubick)
    try:
        register(scheduler, "w", {"cpu": 2})
        job, _ = scheduler.submit(job_spec("j", 2), "")
        scheduler.run_round()
        assert [r.profile_rubick for r in agents.started] == [True]

        def notes() -> list[str]:
            return [
                e.message
                for e in scheduler.state.store.events_after(job.job_id, 0)
                if e.type == scheduler_pb2.JOB_EVENT_TYPE_PLAN
            ]

        assert notes() == [model_note(None, "rubick")]
        fits[job.job_id] = Fitted(f"job {job.job_id}", ACTIVATIONS, PARAMS, A800, 14, own=True)
        scheduler.run_round()  # asked again only after the retry interval
        assert len(notes()) == 1
        clock.now += 6.0
        scheduler.run_round()
        assert notes()[-1].endswith("fitted on 14 configurations of the job's own runs")
        assert all(not r.profile_rubick for r in agents.started[1:])
    finally:
        scheduler.stop()


def test_admissions_name_the_plan_the_speed_and_the_best_effort_jobs_shrunk() -> None:
    """Tenant t (quota 2) submits a guaranteed job while a best-effort job holds all four
    devices: the guaranteed job is admitted on 2 at (at least) its requested speed, and the
    best-effort job, shrunk to 2, is named; with a second best-effort job on the other two,
    one of them is preempted."""
    fit = {j: Fitted(f"job {j}", ACTIVATIONS, PARAMS, A800) for j in ("be", "be2", "g")}
    rubick = LiveRubick(fit.get, quotas=lambda: Quotas({"t": {"v100": 2}}))
    w = [worker("w", 4, 80.0)]
    be = (facts("be", gc=True), snap("be"))
    assert run(rubick, [be], w)["be"][0] == 4 and rubick.admissions() == {}
    running = JobSnapshot(**snap("be").__dict__ | {"current": (("v100", 4),)})
    guaranteed = JobSnapshot(
        **snap("g", ests=2, arrival=1.0).__dict__ | {"guaranteed": True, "entity": "t"}
    )
    got = run(rubick, [(be[0], running), (facts("g", ests=2, gc=True), guaranteed)], w)
    assert got["g"][0] == 2 and got["be"][0] == 2
    a = rubick.admissions()["g"]
    assert (a.accelerator_type, a.devices) == ("v100", 2)
    r = a.rubick
    assert r is not None and (r.tenant, r.requested_gpus, r.gpus) == ("t", 2, 2)
    assert r.requested_plan == "dp2" and r.plan in {"dp2", "dp2+gc"}
    assert r.predicted_rate >= r.requested_rate * (1 - 1e-6) > 0
    assert (r.shrunk, r.preempted) == (("be",), ())


def test_tenants_text_lists_rubick_admissions() -> None:
    state = scheduler_pb2.ClusterState()
    row = state.tenants.add(tenant="t", quota={"v100": 2})
    row.rubick_admissions.add(
        job_id="g",
        accelerator_type="v100",
        requested_devices=2,
        devices=2,
        requested_plan="dp2",
        plan="dp2+gc",
        requested_iterations_per_second=4.0,
        predicted_iterations_per_second=5.0,
        shrunk_jobs=["be"],
    )
    text = tenants_text(state)
    assert "Rubick admissions" in text
    line = text.splitlines()[-1].split()
    assert line == ["t", "g", "v100x2", "dp2", "v100x2", "dp2+gc", "4", "5", "1.25x", "be", "-"]
    assert as_dict(state.tenants[0])["rubick_admissions"][0]["shrunk_jobs"] == ["be"]


def test_a_job_is_placed_only_on_the_accelerator_types_it_allows() -> None:
    # v100 nodes come first and are as free: without the job's types it would land there.
    cluster = [worker("a", 4, 16.0), worker("b", 4, 16.0, kind="k80")]
    only_k80 = dataclasses.replace(
        snap("b", ests=2), types=("k80",), capability={"k80": 1.0}, throughputs={"k80": 1.0}
    )
    assert run(live({}), [(facts("b", ests=2), only_k80)], cluster)["b"][2] == {"k80": (1, 1)}
    anywhere = run(live({}), [(facts("b", ests=2), snap("b", ests=2))], cluster)["b"]
    assert anywhere[2] == {"v100": (1, 1)}
