"""The Brain's storage and domain layer on the real PostgreSQL and on SQLite: migrations up and
down, models vs migrations, ingest, history queries, estimates and plans from history."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from gearshift.brain import convert, models
from gearshift.brain.dlrover import GIB, Budget, PsMetrics, Source, Stage
from gearshift.brain.records import (
    EventKind,
    JobEvent,
    JobFilter,
    JobKeys,
    JobStatus,
    NodeInfo,
    Sample,
)
from gearshift.brain.references import gavel_references
from gearshift.brain.service import (
    BrainService,
    EstimateSource,
    IssuedPlan,
    PlanRequest,
    ReferenceCache,
)
from gearshift.brain.storage import SqlBrainStore
from gearshift.common.db import create_engine, downgrade, migrate
from gearshift.common.errors import (
    ConflictError,
    NotFoundError,
    PreconditionError,
    ValidationError,
)
from gearshift.common.estplan import DeviceOffer

BRAIN_TABLES = {
    "brain_jobs",
    "brain_job_events",
    "brain_job_nodes",
    "brain_sample_batches",
    "brain_samples",
    "brain_plans",
    "brain_job_throughputs",
    "brain_reference_throughputs",
}


@pytest.fixture
def store(db_url: str) -> Iterator[SqlBrainStore]:
    migrate(db_url)
    engine = create_engine(db_url)
    yield SqlBrainStore(engine)
    engine.dispose()


@pytest.fixture
def service(store: SqlBrainStore) -> BrainService:
    return BrainService(store, references=ReferenceCache(store, refresh_seconds=0, calibrate=False))


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migrations_up_and_down(db_url: str) -> None:
    migrate(db_url, "0001_brain")
    assert _tables(db_url) >= BRAIN_TABLES
    downgrade(db_url, "base")
    assert not {t for t in _tables(db_url) if t.startswith("brain_")}
    migrate(db_url)  # head, with every later revision
    assert _tables(db_url) >= BRAIN_TABLES
    downgrade(db_url)
    assert not {t for t in _tables(db_url) if t.startswith("brain_")}


def _brain_only(name: str | None, type_: str, parent_names: object) -> bool:
    return type_ != "table" or (name or "").startswith("brain_")


def _diff(url: str, metadata: sa.MetaData) -> list[object]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "include_name": _brain_only}
            )
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def test_models_and_migrations_agree(db_url: str) -> None:
    migrate(db_url)
    assert _diff(db_url, models.metadata) == []
    # The comparison does see a difference when there is one.
    changed = copy.deepcopy(models.metadata)
    changed.tables["brain_jobs"].append_column(sa.Column("extra", sa.Integer()))
    diff = _diff(db_url, changed)
    assert diff and "extra" in repr(diff)


def _submit(
    service: BrainService,
    job_id: str,
    *,
    model: str = "wd",
    dataset: str = "criteo",
    num_ests: int = 4,
    at: float = 0.0,
    tenant: str = "team-a",
) -> None:
    keys = JobKeys(tenant, model, dataset, num_ests, {"name": job_id, "num_ests": num_ests})
    assert service.report_event(
        JobEvent(f"{job_id}-submit", job_id, EventKind.SUBMITTED, at or time.time(), keys)
    )


def _event(service: BrainService, job_id: str, kind: EventKind, **kw: object) -> bool:
    node = kw.get("node")
    suffix = node.node_id if isinstance(node, NodeInfo) else ""
    return service.report_event(
        JobEvent(f"{job_id}-{kind.value}-{suffix}", job_id, kind, time.time(), **kw)  # type: ignore[arg-type]
    )


def _samples(
    n: int,
    *,
    rate: float = 5.0,
    kind: str = "v100",
    count: int = 2,
    start: int = 0,
    node: str = "",
    memory: int = 0,
    ests: tuple[int, ...] = (2, 2),
) -> list[Sample]:
    now = time.time()
    return [
        Sample(
            now + start + i,
            start + i,
            rate,
            kind,
            count,
            node_id=node,
            memory_bytes_used=memory,
            cpu_cores_used=1.0,
            ests_per_device=ests,
        )
        for i in range(n)
    ]


def _count(store: SqlBrainStore, table: sa.Table) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def test_ingest_is_idempotent_and_history_reads_it_back(service: BrainService, store) -> None:
    _submit(service, "j1")
    assert service.report_samples("b1", "j1", _samples(100)) == 100
    assert service.report_samples("b1", "j1", _samples(100)) == 0  # a retried batch
    assert service.report_samples("b2", "j1", _samples(50, start=100)) == 50
    assert _count(store, models.samples) == 150
    with pytest.raises(ConflictError, match="b1"):
        _submit(service, "j2")
        service.report_samples("b1", "j2", _samples(1))
    history = service.history("j1", since_step=120, max_samples=10)
    assert [s.step for s in history.samples] == list(range(140, 150))
    assert history.job.status is JobStatus.SUBMITTED and history.samples[0].ests_per_device == (
        2,
        2,
    )
    assert len(service.history("j1", 0, 1000).samples) == 150


def test_lifecycle_events(service: BrainService, store) -> None:
    _submit(service, "j1")
    with pytest.raises(ConflictError, match="already submitted"):
        service.report_event(
            JobEvent("other", "j1", EventKind.SUBMITTED, 1.0, JobKeys("t", "m", "d", 1, {}))
        )
    assert _event(service, "j1", EventKind.STARTED)
    assert not _event(service, "j1", EventKind.STARTED)  # same event id: a no-op
    worker = NodeInfo("worker-0", "worker", cpu_cores=4, memory_bytes=GIB)
    assert _event(service, "j1", EventKind.NODE_STARTED, node=worker)
    assert _event(service, "j1", EventKind.NODE_EXITED, node=worker, exit_reason="oom")
    assert _event(service, "j1", EventKind.FAILED, exit_reason="oom")
    with pytest.raises(PreconditionError, match="already ended"):
        _event(service, "j1", EventKind.SUCCEEDED)
    history = service.history("j1", 0, 10)
    assert history.job.status is JobStatus.FAILED and history.job.exit_reason == "oom"
    assert history.job.started_at and history.job.finished_at
    (node,) = history.nodes
    assert (node.status, node.exit_reason, node.cpu_cores) == ("exited", "oom", 4)
    with pytest.raises(NotFoundError, match="nope"):
        _event(service, "nope", EventKind.STARTED)
    assert _count(store, models.job_events) == 5


def test_samples_for_an_unknown_job_or_bad_mapping_write_nothing(service, store) -> None:
    with pytest.raises(NotFoundError, match="ghost"):
        service.report_samples("b", "ghost", _samples(3))
    _submit(service, "j1", num_ests=4)
    with pytest.raises(ValidationError, match=r"samples\[0\]\.ests_per_device"):
        service.report_samples("b", "j1", _samples(3, ests=(1, 1)))
    assert _count(store, models.samples) == 0 and _count(store, models.sample_batches) == 0


def test_list_jobs_filters_and_pages(service: BrainService) -> None:
    for i in range(7):
        _submit(
            service,
            f"job-{i}",
            model="wd" if i % 2 else "xdfm",
            at=1000.0 + i // 2,
            tenant="a" if i < 4 else "b",
        )
    _event(service, "job-3", EventKind.STARTED)
    seen = []
    after = None
    while True:
        page = service.list_jobs(JobFilter(), 3, after)
        seen += [j.job_id for j in page.jobs]
        if page.next is None:
            break
        after = page.next
    assert seen == [f"job-{i}" for i in (6, 5, 4, 3, 2, 1, 0)]  # newest first, ties by id
    assert [j.job_id for j in service.list_jobs(JobFilter(model_type="wd"), 10, None).jobs] == [
        "job-5",
        "job-3",
        "job-1",
    ]
    only = service.list_jobs(JobFilter(model_type="wd", tenant="a", status="running"), 10, None)
    assert [j.job_id for j in only.jobs] == ["job-3"]


def test_estimates_follow_the_source_order(service: BrainService, store, gavel_data) -> None:
    # Nothing known: the declared default.
    default = service.estimate("", "wd", "v100", 2)
    assert default.source is EstimateSource.DEFAULT and default.value == 1.0
    # Completed jobs of the model type.
    for i, rate in enumerate((8.0, 12.0)):
        _submit(service, f"old-{i}")
        service.report_samples(f"old-{i}-b", f"old-{i}", _samples(30, rate=rate))
        _event(service, f"old-{i}", EventKind.SUCCEEDED)
    history = service.estimate("", "wd", "v100", 2)
    assert history.source is EstimateSource.MODEL_HISTORY
    assert history.value == pytest.approx(10.0) and history.relative_error == pytest.approx(
        0.283, abs=1e-3
    )
    # The job's own samples win once it has some.
    _submit(service, "new")
    service.report_samples("new-b", "new", _samples(20, rate=20.0))
    own = service.estimate("new", "", "v100", 2)
    assert own.source is EstimateSource.OWN_SAMPLES and own.value == pytest.approx(20.0)
    # With references loaded, other columns come from matrix completion.
    references = gavel_references(gavel_data / "simulation_throughputs.json")
    assert store.put_references(references, "gavel") == 411
    done = service.estimate("new", "", "k80", 1)
    assert done.source is EstimateSource.MATRIX_COMPLETION and "nearest references" in done.detail
    assert 0 < done.value < 20.0  # a K80 is slower than two V100s
    unknown = service.estimate("new", "", "t4", 1)
    assert unknown.source is EstimateSource.DEFAULT
    with pytest.raises(NotFoundError, match="ghost"):
        service.estimate("ghost", "", "v100", 1)


def _plan(
    service: BrainService,
    job_id: str,
    stage: Stage,
    metrics: PsMetrics | None = None,
) -> IssuedPlan:
    request = PlanRequest(job_id, stage, Budget(200, 32), metrics or PsMetrics(), None, None)
    return service.plan_resources(request)


def test_plans_from_history(service: BrainService, store) -> None:
    # A finished W&D job on criteo that ran 20 workers x 3 and 6 PS x 16.
    _submit(service, "past", model="wd", dataset="criteo")
    issued = _plan(
        service, "past", Stage.OPTIMIZE, metrics=PsMetrics(2.5, 5.7, steps_per_second=12)
    )
    assert (issued.plan.workers.count, issued.plan.ps.count) == (24, 8)
    for i in range(3):
        node = NodeInfo(f"worker-{i}", "worker", 3, 2 * GIB)
        _event(service, "past", EventKind.NODE_STARTED, node=node)
        service.report_samples(
            f"m{i}", "past", _samples(5, rate=200, node=f"worker-{i}", memory=GIB + i * 100)
        )
    _event(service, "past", EventKind.SUCCEEDED)
    # A new job of the same model and dataset starts from that history.
    _submit(service, "new", model="wd", dataset="criteo")
    initial = _plan(service, "new", Stage.INITIAL)
    assert initial.plan.source is Source.HISTORY and "past" in initial.plan.reason
    assert (initial.plan.workers.count, initial.plan.ps.count) == (24, 8)
    assert initial.plan.workers.memory_bytes == -(-int((GIB + 200) * 1.2) // 2**20) * 2**20
    assert "dataset 'criteo'" in initial.plan.reason
    # Same model type on another dataset still matches on the model type.
    _submit(service, "other", model="wd", dataset="avazu")
    fallback = _plan(service, "other", Stage.INITIAL)
    assert fallback.plan.source is Source.HISTORY and "dataset" not in fallback.plan.reason
    # An unseen model type gets the sampling defaults.
    _submit(service, "fresh", model="xdfm")
    fresh = _plan(service, "fresh", Stage.INITIAL)
    assert fresh.plan.source is Source.DEFAULT and fresh.plan.workers.count == 1
    # Every plan is recorded in the job's history.
    assert [p.plan_id for p in service.history("new", 0, 1).plans] == [initial.plan_id]
    assert _count(store, models.plans) == 4
    with pytest.raises(NotFoundError, match="ghost"):
        _plan(service, "ghost", Stage.INITIAL)
    assert _count(store, models.plans) == 4


def test_a_data_parallel_history_gives_the_devices_its_jobs_ended_on(service: BrainService) -> None:
    # Its only plan was the sampling defaults (1 worker); its samples say 2, then 3 devices.
    _submit(service, "dp", model="cnn", dataset="digits")
    assert _plan(service, "dp", Stage.INITIAL).plan.workers.count == 1
    service.report_samples("a", "dp", _samples(3, count=2))
    service.report_samples("b", "dp", _samples(3, count=3, start=10))
    _event(service, "dp", EventKind.SUCCEEDED)
    _submit(service, "next", model="cnn", dataset="digits")
    initial = _plan(service, "next", Stage.INITIAL).plan
    assert initial.source is Source.HISTORY and initial.workers.count == 3
    assert initial.ps.count == 0


def test_est_plans_estimate_missing_capabilities(service: BrainService) -> None:
    _submit(service, "est", num_ests=4)
    service.report_samples("b", "est", _samples(10, rate=3.0, ests=(2, 2)))  # C(v100) = 6
    result = service.plan_ests(
        "est", 4, [DeviceOffer("v100", 4, 0.0), DeviceOffer("k80", 4, 1.0)], {}, top_k=2
    )
    assert result.estimated["v100"].value == pytest.approx(6.0)
    assert result.estimated["v100"].source is EstimateSource.OWN_SAMPLES
    assert result.plan.devices_by_type() == {"v100": 4}
    assert result.plan.minibatches_per_second == pytest.approx(24.0)
    running = service.plan_ests(
        "est", 4, [DeviceOffer("v100", 2, 6.0), DeviceOffer("k80", 4, 1.0)], {"v100": 1}, top_k=3
    )
    assert running.plan.devices_by_type() == {"v100": 1}
    assert running.proposals[0].accelerator_type == "v100"
    # 4 ESTs on one V100 step in 4/6 s; with one more (2 + 2 ESTs) in 2/6 s, and two more
    # (2, 1, 1) are no faster: the fewer devices win the tie.
    assert running.proposals[0].additional_devices == 1
    assert running.proposals[0].speedup == pytest.approx(2.0)
    assert running.proposals[0].plan.ests_per_device() == [2, 2]
    with pytest.raises(NotFoundError):
        service.plan_ests("ghost", 4, [DeviceOffer("v100", 4, 0.0)], {}, top_k=0)


def test_request_conversion_names_fields() -> None:
    # Malformed spec in a SUBMITTED event: the field is named; nothing to write.
    from gearshift.v1 import brain_pb2, common_pb2

    bad = brain_pb2.ReportJobEventRequest(
        event_id="e",
        job_id="j",
        kind=brain_pb2.JOB_EVENT_KIND_SUBMITTED,
        spec=common_pb2.JobSpec(name="j"),
    )
    with pytest.raises(ValidationError, match=r"^spec\.entrypoint"):
        convert.job_event(bad)
    long_status = brain_pb2.ReportJobEventRequest(
        event_id="e",
        job_id="j",
        kind=brain_pb2.JOB_EVENT_KIND_NODE_STARTED,
        node=brain_pb2.JobNode(node_id="w", role=brain_pb2.NODE_ROLE_WORKER, status="x" * 33),
    )
    with pytest.raises(ValidationError, match=r"^node\.status: must be at most 32"):
        convert.job_event(long_status)
    no_role = brain_pb2.ReportJobEventRequest(
        event_id="e",
        job_id="j",
        kind=brain_pb2.JOB_EVENT_KIND_NODE_EXITED,
        node=brain_pb2.JobNode(node_id="w"),
    )
    with pytest.raises(ValidationError, match=r"^node\.role: unknown or unset value 0"):
        convert.job_event(no_role)
