"""Tenants' quotas (the tenants file) and guaranteed jobs admitted before the policy runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gearshift.common.errors import ValidationError
from gearshift.scheduler.plugins.allocators import make_allocator
from gearshift.scheduler.plugins.rubick.guarantees import Admission, Guarantees, admit
from gearshift.scheduler.plugins.rubick.tenants import Quotas, TenantsFile, parse_quotas
from gearshift.scheduler.round.decider import DecisionProcess
from gearshift.scheduler.service import SchedulerSettings
from gearshift.scheduler.types import Device, JobSnapshot, Snapshot
from gearshift.v1 import common_pb2
from tests.sched_harness import Clock, job_spec, make_scheduler, register

C = common_pb2
DEVICES = tuple(Device(f"w{i // 2}", i % 2, "cpu") for i in range(4))


def snap(job_id: str, tenant: str, most: int, **fields: object) -> JobSnapshot:
    base: dict[str, object] = {
        "job_id": job_id,
        "num_ests": most,
        "min_devices": 1,
        "max_devices": most,
        "types": ("cpu",),
        "capability": {"cpu": 1.0},
        "throughputs": {"cpu": float(most)},
        "steps_remaining": 100.0,
        "arrival_time": 0.0,
        "entity": tenant,
    }
    base.update(fields)
    return JobSnapshot(**base)  # type: ignore[arg-type]


def test_the_file_gives_devices_per_type_per_tenant() -> None:
    quotas = parse_quotas("tenants:\n  a:\n    quota: {v100: 4, cpu: 2}\n  b: {}\n")
    assert quotas.of("a") == {"v100": 4, "cpu": 2}
    assert quotas.of("b") == {} and quotas.of("nobody") == {}
    assert parse_quotas("").by_tenant == {}


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("tenants:\n  a:\n    quota: {cpu: -1}\n", "tenants.a.quota.cpu"),
        ("tenants:\n  a:\n    quota: {cpu: two}\n", "tenants.a.quota.cpu"),
        ("tenants:\n  a:\n    limit: {cpu: 1}\n", "tenants.a"),
        ("tenants:\n  'a b': {}\n", "tenants.a b"),
        ("tenants: [a, b]\n", "tenants"),
        ("quotas: {}\n", "tenants file"),
        ("tenants: {a: [\n", "tenants file"),
    ],
)
def test_a_bad_file_names_the_field(text: str, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_quotas(text)
    assert caught.value.field == field


def test_a_bad_reload_keeps_the_old_quotas(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants: {a: {quota: {cpu: 2}}}\n")
    tenants = TenantsFile(path)
    path.write_text("tenants: {a: {quota: {cpu: lots}}}\n")
    with pytest.raises(ValidationError, match=r"tenants\.a\.quota\.cpu"):
        tenants.reload()
    assert tenants.quotas.of("a") == {"cpu": 2}
    path.write_text("tenants: {a: {quota: {cpu: 3}}}\n")
    assert tenants.reload().of("a") == {"cpu": 3}


def test_admission_counts_quota_and_free_devices_running_jobs_first() -> None:
    quotas = Quotas({"a": {"cpu": 3}})
    jobs = (
        snap("g1", "a", 2, guaranteed=True, arrival_time=1.0),
        snap("g2", "a", 2, guaranteed=True, arrival_time=2.0, current=(("cpu", 2),)),
        snap("g3", "a", 1, guaranteed=True, arrival_time=3.0),
        snap("be", "b", 4, guaranteed=True),  # tenant b has no quota: best-effort
        snap("x", "a", 1),  # a's best-effort job
    )
    admitted = admit(Snapshot(0.0, DEVICES, jobs), quotas)
    # g2 runs: it keeps its share; g1 would pass a's quota (2 + 2 > 3); g3 fits
    assert admitted == {"g2": Admission("cpu", 2), "g3": Admission("cpu", 1)}


def test_a_guaranteed_job_gets_its_request_and_best_effort_jobs_shrink() -> None:
    quotas = Quotas({"a": {"cpu": 2}})
    allocator = Guarantees(make_allocator("max_min_fairness", elastic=True), lambda: quotas)
    b1 = snap("b1", "b", 2, current=(("cpu", 2),), arrival_time=0.0)
    b2 = snap("b2", "b", 2, current=(("cpu", 2),), arrival_time=1.0)
    before = allocator.allocate(Snapshot(0.0, DEVICES, (b1, b2)))
    assert {t.size for t in before.values()} == {2}  # they fill the cluster
    g = snap("g", "a", 2, guaranteed=True, arrival_time=2.0)
    after = allocator.allocate(Snapshot(10.0, DEVICES, (b1, b2, g)))
    assert after["g"].devices == (("cpu", 2),)
    assert sum(after[j].size for j in ("b1", "b2") if j in after) == 2
    assert allocator.admitted == {"g": Admission("cpu", 2)}


def test_past_its_quota_a_guaranteed_job_is_served_as_best_effort() -> None:
    quotas = Quotas({"a": {"cpu": 1}})
    allocator = Guarantees(make_allocator("max_min_fairness", elastic=True), lambda: quotas)
    jobs = (
        snap("b1", "b", 4, current=(("cpu", 4),)),
        snap("g", "a", 2, guaranteed=True, arrival_time=2.0),
    )
    out = allocator.allocate(Snapshot(0.0, DEVICES, jobs))
    assert allocator.admitted == {}
    assert out["g"].size >= 1 and out["b1"].size >= 1  # the policy shares: nobody is first


def tenant_settings(path: Path, decision_process: bool = False) -> SchedulerSettings:
    """Elastic max-min fairness with the tenants file at `path`."""
    return SchedulerSettings(
        policy="max_min_fairness",
        elastic=True,
        round_seconds=60.0,
        heartbeat_interval=1.0,
        heartbeat_timeout=5.0,
        tenants_file=str(path),
        decision_process=decision_process,
    )


@pytest.mark.parametrize("decision_process", [False, True])
def test_the_daemon_admits_against_a_reloaded_file_and_shows_tenants(
    tmp_path: Path, decision_process: bool
) -> None:
    """In the scheduler's process or in the decision process, which the reloaded quotas
    reach with the next snapshot and whose admissions the tenants view shows."""
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants: {a: {quota: {cpu: 0}}, b: {}}\n")
    settings = tenant_settings(path, decision_process)
    clock = Clock()
    scheduler, agents = make_scheduler(settings, clock=clock)
    assert isinstance(scheduler.rounds.decider, DecisionProcess) is decision_process
    try:
        register(scheduler, "w", {"cpu": 4})
        b, _ = scheduler.submit(job_spec("b", 4, tenant="b"), "")
        scheduler.run_round()
        clock.now += 3.0
        scheduler.heartbeat("w", [])
        spec = job_spec("g", 2, tenant="a", service_class=C.SERVICE_CLASS_GUARANTEED)
        g, _ = scheduler.submit(spec, "")
        scheduler.run_round()
        shown = {t.tenant: t for t in scheduler.cluster_state().tenants}
        assert shown["a"].guaranteed_jobs == 0  # quota 0: not covered

        path.write_text("tenants: {a: {quota: {cpu: 2}}, b: {}}\n")
        assert scheduler.reload_tenants() == 2
        clock.now += 3.0
        scheduler.heartbeat("w", [])
        scheduler.run_round()
        assert len(scheduler.get(g.job_id).placement.processes) == 2
        assert len(scheduler.get(b.job_id).placement.processes) <= 2
        shown = {t.tenant: t for t in scheduler.cluster_state().tenants}
        assert dict(shown["a"].quota) == {"cpu": 2}
        assert dict(shown["a"].guaranteed_devices) == {"cpu": 2}
        assert shown["a"].guaranteed_jobs == 1 and shown["a"].running_jobs == 1
        assert dict(shown["b"].quota) == {} and shown["b"].running_jobs == 1
        assert agents.started
    finally:
        scheduler.stop()


def test_a_guaranteed_job_arriving_as_a_best_effort_job_ends_gets_its_request(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants: {a: {quota: {cpu: 2}}, b: {}}\n")
    settings = tenant_settings(path)
    clock = Clock()
    scheduler, _ = make_scheduler(settings, clock=clock)
    try:
        register(scheduler, "w1", {"cpu": 2})
        register(scheduler, "w2", {"cpu": 2})
        b1, _ = scheduler.submit(job_spec("b1", 2, tenant="b"), "")
        scheduler.submit(job_spec("b2", 2, tenant="b"), "")
        scheduler.run_round()
        clock.now += 1.0
        task = next(t for t in scheduler.state.tasks.values() if t.job_id == b1.job_id)
        done = C.TaskStatus(
            task_id=task.task_id, job_id=b1.job_id, state=C.TASK_STATE_COMPLETED, exit_code=0
        )
        scheduler.task_finished(task.worker_id, done)
        spec = job_spec("g", 2, tenant="a", service_class=C.SERVICE_CLASS_GUARANTEED)
        g, _ = scheduler.submit(spec, "")
        scheduler.run_round()
        assert len(scheduler.get(g.job_id).placement.processes) == 2
    finally:
        scheduler.stop()


@pytest.mark.parametrize("decision_process", [False, True])
def test_under_rubick_the_tenants_view_shows_admissions_and_whom_they_preempted(
    tmp_path: Path, decision_process: bool
) -> None:
    """`--policy rubick`, no fits (each job runs its own plan on its request): the guaranteed
    job of tenant a is admitted on its 2 devices at its requested speed, and tenant b's
    best-effort job, which cannot run on fewer than its 4, is preempted for it - both shown
    in the tenants view (ClusterState.tenants[].rubick_admissions), also when the decision
    process admits them."""
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants: {a: {quota: {cpu: 2}}, b: {}}\n")
    settings = dataclasses.replace(
        tenant_settings(path, decision_process), policy="rubick", elastic=False
    )
    clock = Clock()
    scheduler, _ = make_scheduler(settings, clock=clock)
    assert isinstance(scheduler.rounds.decider, DecisionProcess) is decision_process
    try:
        register(scheduler, "w", {"cpu": 4})
        b, _ = scheduler.submit(job_spec("b", 4, tenant="b"), "")
        scheduler.run_round()
        assert len(scheduler.get(b.job_id).placement.processes) == 4
        assert not any(t.rubick_admissions for t in scheduler.cluster_state().tenants)
        clock.now += 3.0
        scheduler.heartbeat("w", [])
        spec = job_spec("g", 2, tenant="a", service_class=C.SERVICE_CLASS_GUARANTEED)
        g, _ = scheduler.submit(spec, "")
        scheduler.run_round()
        assert len(scheduler.get(g.job_id).placement.processes) == 2
        shown = {t.tenant: t for t in scheduler.cluster_state().tenants}
        assert shown["a"].guaranteed_jobs == 1 and dict(shown["a"].guaranteed_devices) == {"cpu": 2}
        (a,) = shown["a"].rubick_admissions
        assert (a.job_id, a.requested_devices, a.devices, a.plan) == (g.job_id, 2, 2, "dp2")
        assert a.predicted_iterations_per_second == a.requested_iterations_per_second > 0
        assert list(a.preempted_jobs) == [b.job_id] and not a.shrunk_jobs
        assert not shown["b"].rubick_admissions
    finally:
        scheduler.stop()
