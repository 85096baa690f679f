"""The Brain's storage: one interface (`BrainStore`), two backends (PostgreSQL, SQLite)
through one SQLAlchemy 2.x implementation (`SqlBrainStore`).

Every method is one transaction. Lost connections and locked databases become
UnavailableError (retryable); the engine's pool pre-pings, so after a
PostgreSQL restart the next call reconnects.
"""

from __future__ import annotations

import math
import statistics
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from gearshift.brain import models as m
from gearshift.brain.estimator import Column
from gearshift.brain.records import (
    ENDINGS,
    CapabilitySample,
    Cursor,
    EventKind,
    FinishedJob,
    History,
    JobEvent,
    JobFilter,
    JobPage,
    JobRow,
    JobStatus,
    NodeInfo,
    PlanRow,
    ProfileRow,
    RubickFitRow,
    RubickProfileRow,
    RubickRunRow,
    Sample,
    Subject,
)
from gearshift.brain.references import ReferenceThroughput
from gearshift.common.db import outages
from gearshift.common.errors import (
    ConflictError,
    NotFoundError,
    PreconditionError,
)

#: Samples per (type, count) that summarize an ended job's throughput.
SUMMARY_SAMPLES = 50


class BrainStore(Protocol):
    """What the Brain's domain code needs from storage."""

    def record_event(self, event: JobEvent) -> bool:
        """Record a lifecycle event; False when its event_id was recorded before."""
        ...

    def add_samples(self, batch_id: str, job_id: str, samples: Sequence[Sample], now: float) -> int:
        """Commit a batch of samples in one transaction; 0 for a batch recorded before."""
        ...

    def job(self, job_id: str) -> JobRow:
        """A recorded job; NotFoundError when unknown."""
        ...

    def history(self, job_id: str, since_step: int, max_samples: int) -> History:
        """A job's record, nodes, most recent samples (from since_step) and plans."""
        ...

    def list_jobs(self, where: JobFilter, limit: int, after: Cursor | None) -> JobPage:
        """Jobs matching `where`, newest first, `limit` at a time."""
        ...

    def recent_throughputs(
        self, job_id: str, accelerator_type: str, device_count: int, limit: int
    ) -> list[float]:
        """The job's most recent positive steps/s on that type and count, oldest first."""
        ...

    def capability_samples(
        self, job_id: str, accelerator_type: str, limit: int
    ) -> list[CapabilitySample]:
        """The job's most recent samples on that type with an EST mapping, oldest first."""
        ...

    def model_throughputs(
        self, model_type: str, accelerator_type: str, device_count: int | None, limit: int
    ) -> list[tuple[float, float]]:
        """(steps/s, mini-batches/s per device) of the newest ended jobs of a model type on
        that type and count (any count when None)."""
        ...

    def fingerprint(self, model_type: str, job_id: str) -> dict[Column, float]:
        """Known steps/s per column for a model type: ended jobs' means, then the job's own."""
        ...

    def reference_rows(self) -> list[ReferenceThroughput]:
        """Every reference throughput."""
        ...

    def reference_signature(self) -> tuple[int, float]:
        """A cheap fingerprint of the reference table (changes when it is reloaded)."""
        ...

    def put_references(self, rows: Sequence[ReferenceThroughput], source: str) -> int:
        """Insert or replace reference throughputs; returns how many were written."""
        ...

    def finished_similar(
        self, model_type: str, dataset_name: str | None, limit: int
    ) -> list[FinishedJob]:
        """Succeeded jobs of a model type (and dataset, unless None), newest first."""
        ...

    def record_plan(
        self, job_id: str, stage: str, source: str, plan: dict[str, Any], now: float
    ) -> PlanRow:
        """Record an issued plan under a new id."""
        ...

    def put_profile(self, row: ProfileRow) -> tuple[bool, bool]:
        """Store a layer profile under its key: (written, replaced). The same digest under
        the key writes nothing; another replaces it."""
        ...

    def profile(self, key: str) -> ProfileRow:
        """A stored layer profile; NotFoundError when none is stored under the key."""
        ...

    def put_rubick(
        self,
        subject: Subject,
        workload: tuple[dict[str, Any], str] | None,
        runs: Sequence[RubickRunRow],
        now: float,
        fit: RubickFitRow | None = None,
    ) -> tuple[int, int, bool]:
        """In one transaction: store a subject's workload (data, digest) if given, its runs
        (a run_key stored before is replaced) and its fit if given. Returns (runs written,
        runs stored now, whether a different workload was replaced)."""
        ...

    def rubick_profile(self, subject: Subject, *, with_runs: bool = True) -> RubickProfileRow:
        """A subject's workload (None when none is stored) and runs (oldest first)."""
        ...

    def rubick_fit(self, subject: Subject) -> RubickFitRow | None:
        """A subject's stored fit, if any."""
        ...


class SqlBrainStore:
    """BrainStore over SQLAlchemy Core: PostgreSQL (psycopg2) or SQLite, schema from Alembic."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._dialect = engine.dialect.name

    # -- plumbing ---------------------------------------------------------------

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        """One transaction; connection-level failures become UnavailableError."""
        with outages(), self.engine.begin() as conn:
            yield conn

    def _upsert(self, table: sa.Table) -> Any:
        return (postgresql if self._dialect == "postgresql" else sqlite).insert(table)

    @staticmethod
    def _job_row(row: Any) -> JobRow:
        return JobRow(
            job_id=row.job_id,
            tenant=row.tenant,
            model_type=row.model_type,
            dataset_name=row.dataset_name,
            num_ests=row.num_ests,
            spec=dict(row.spec),
            status=JobStatus(row.status),
            submitted_at=row.submitted_at,
            started_at=row.started_at,
            finished_at=row.finished_at,
            exit_reason=row.exit_reason,
        )

    def _get_job(self, conn: Connection, job_id: str) -> JobRow | None:
        row = conn.execute(sa.select(m.jobs).where(m.jobs.c.job_id == job_id)).first()
        return self._job_row(row) if row is not None else None

    # -- events -----------------------------------------------------------------

    def record_event(self, event: JobEvent) -> bool:
        jobs, nodes, events = m.jobs, m.job_nodes, m.job_events
        try:
            with self._tx() as conn:
                seen = conn.execute(
                    sa.select(events.c.job_id).where(events.c.event_id == event.event_id)
                ).first()
                if seen is not None:
                    if seen.job_id != event.job_id:
                        raise ConflictError(
                            f"event_id {event.event_id!r} was recorded for job {seen.job_id!r}"
                        )
                    return False
                job = self._get_job(conn, event.job_id)
                if event.kind is EventKind.SUBMITTED:
                    if job is not None:
                        raise ConflictError(f"job {event.job_id!r} was already submitted")
                    assert event.keys is not None
                    conn.execute(
                        jobs.insert().values(
                            job_id=event.job_id,
                            tenant=event.keys.tenant,
                            model_type=event.keys.model_type,
                            dataset_name=event.keys.dataset_name,
                            num_ests=event.keys.num_ests,
                            spec=event.keys.spec,
                            status=JobStatus.SUBMITTED.value,
                            submitted_at=event.time,
                            started_at=None,
                            finished_at=None,
                            exit_reason="",
                        )
                    )
                elif job is None:
                    raise NotFoundError("job", event.job_id)
                elif event.kind in (EventKind.NODE_STARTED, EventKind.NODE_EXITED):
                    assert event.node is not None
                    self._record_node(conn, nodes, event)
                else:
                    self._transition(conn, jobs, job, event)
                conn.execute(
                    events.insert().values(
                        event_id=event.event_id,
                        job_id=event.job_id,
                        kind=event.kind.value,
                        time=event.time,
                        node_id=event.node.node_id if event.node else "",
                        exit_reason=event.exit_reason,
                    )
                )
        except sa.exc.IntegrityError:
            # A concurrent call recorded the same event or job first.
            with self._tx() as conn:
                seen = conn.execute(
                    sa.select(events.c.job_id).where(events.c.event_id == event.event_id)
                ).first()
            if seen is not None and seen.job_id == event.job_id:
                return False
            raise ConflictError(f"job {event.job_id!r}: concurrent conflicting event") from None
        return True

    def _record_node(self, conn: Connection, nodes: sa.Table, event: JobEvent) -> None:
        node = event.node
        assert node is not None
        started = event.kind is EventKind.NODE_STARTED
        key = (nodes.c.job_id == event.job_id) & (nodes.c.node_id == node.node_id)
        existing = conn.execute(sa.select(nodes.c.node_id).where(key)).first()
        values: dict[str, Any] = {
            "role": node.role,
            "status": node.status or ("running" if started else "exited"),
        }
        if node.cpu_cores or node.memory_bytes or node.accelerator_type or existing is None:
            values.update(
                cpu_cores=node.cpu_cores,
                memory_bytes=node.memory_bytes,
                accelerator_type=node.accelerator_type,
                device_count=node.device_count,
            )
        if started:
            values.update(started_at=event.time, finished_at=None, exit_reason="")
        else:
            values.update(finished_at=event.time, exit_reason=event.exit_reason or node.exit_reason)
        if existing is None:
            values.setdefault("started_at", None)
            values.setdefault("exit_reason", "")
            conn.execute(nodes.insert().values(job_id=event.job_id, node_id=node.node_id, **values))
        else:
            conn.execute(nodes.update().where(key).values(**values))

    def _transition(self, conn: Connection, jobs: sa.Table, job: JobRow, event: JobEvent) -> None:
        if job.status.terminal:
            raise PreconditionError(
                f"job {job.job_id!r} already ended ({job.status.value}); cannot record "
                f"{event.kind.value}"
            )
        where = jobs.c.job_id == job.job_id
        if event.kind is EventKind.STARTED:
            conn.execute(
                jobs.update()
                .where(where)
                .values(
                    status=JobStatus.RUNNING.value,
                    started_at=job.started_at if job.started_at is not None else event.time,
                )
            )
            return
        status = ENDINGS[event.kind]
        conn.execute(
            jobs.update()
            .where(where)
            .values(
                status=status.value,
                finished_at=event.time,
                exit_reason=event.exit_reason or status.value,
            )
        )
        self._summarize(conn, job, event.time)

    def _summarize(self, conn: Connection, job: JobRow, finished_at: float) -> None:
        """Store what the ending job reached per (type, count), from its recent samples."""
        samples = m.samples
        rows = conn.execute(
            sa.select(
                samples.c.accelerator_type,
                samples.c.device_count,
                samples.c.steps_per_second,
                samples.c.ests_per_device,
            )
            .where(samples.c.job_id == job.job_id, samples.c.steps_per_second > 0)
            .order_by(samples.c.time.desc())
            .limit(SUMMARY_SAMPLES * 20)
        ).all()
        groups: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
        for row in rows:
            group = groups[(row.accelerator_type, row.device_count)]
            if len(group) < SUMMARY_SAMPLES:
                per_device = (
                    max(row.ests_per_device)
                    if row.ests_per_device
                    else math.ceil(job.num_ests / row.device_count)
                )
                group.append((row.steps_per_second, row.steps_per_second * per_device))
        if groups:
            conn.execute(
                m.job_throughputs.insert(),
                [
                    {
                        "job_id": job.job_id,
                        "accelerator_type": kind,
                        "device_count": count,
                        "model_type": job.model_type,
                        "steps_per_second": statistics.fmean(s for s, _ in values),
                        "minibatches_per_second": statistics.fmean(b for _, b in values),
                        "sample_count": len(values),
                        "finished_at": finished_at,
                    }
                    for (kind, count), values in groups.items()
                ],
            )

    # -- samples ----------------------------------------------------------------

    def add_samples(self, batch_id: str, job_id: str, samples: Sequence[Sample], now: float) -> int:
        batches = m.sample_batches
        try:
            with self._tx() as conn:
                seen = conn.execute(
                    sa.select(batches.c.job_id).where(batches.c.batch_id == batch_id)
                ).first()
                if seen is not None:
                    if seen.job_id != job_id:
                        raise ConflictError(
                            f"batch_id {batch_id!r} was recorded for job {seen.job_id!r}"
                        )
                    return 0
                if (
                    conn.execute(
                        sa.select(m.jobs.c.job_id).where(m.jobs.c.job_id == job_id)
                    ).first()
                    is None
                ):
                    raise NotFoundError("job", job_id)
                conn.execute(
                    batches.insert().values(
                        batch_id=batch_id,
                        job_id=job_id,
                        received_at=now,
                        sample_count=len(samples),
                    )
                )
                conn.execute(
                    m.samples.insert(),
                    [
                        {
                            "job_id": job_id,
                            "node_id": s.node_id,
                            "time": s.time,
                            "step": s.step,
                            "steps_per_second": s.steps_per_second,
                            "samples_per_second": s.samples_per_second,
                            "cpu_cores_used": s.cpu_cores_used,
                            "memory_bytes_used": s.memory_bytes_used,
                            "accelerator_type": s.accelerator_type,
                            "device_count": s.device_count,
                            "ests_per_device": list(s.ests_per_device),
                        }
                        for s in samples
                    ],
                )
        except sa.exc.IntegrityError:
            with self._tx() as conn:
                seen = conn.execute(
                    sa.select(batches.c.job_id).where(batches.c.batch_id == batch_id)
                ).first()
            if seen is not None and seen.job_id == job_id:
                return 0  # a concurrent retry of the same batch won
            raise
        return len(samples)

    # -- queries ----------------------------------------------------------------

    def job(self, job_id: str) -> JobRow:
        with self._tx() as conn:
            job = self._get_job(conn, job_id)
        if job is None:
            raise NotFoundError("job", job_id)
        return job

    @staticmethod
    def _sample(row: Any) -> Sample:
        return Sample(
            time=row.time,
            step=row.step,
            steps_per_second=row.steps_per_second,
            accelerator_type=row.accelerator_type,
            device_count=row.device_count,
            node_id=row.node_id,
            samples_per_second=row.samples_per_second,
            cpu_cores_used=row.cpu_cores_used,
            memory_bytes_used=row.memory_bytes_used,
            ests_per_device=tuple(row.ests_per_device or ()),
        )

    @staticmethod
    def _node(row: Any) -> NodeInfo:
        return NodeInfo(
            node_id=row.node_id,
            role=row.role,
            cpu_cores=row.cpu_cores,
            memory_bytes=row.memory_bytes,
            accelerator_type=row.accelerator_type,
            device_count=row.device_count,
            status=row.status,
            exit_reason=row.exit_reason,
        )

    def history(self, job_id: str, since_step: int, max_samples: int) -> History:
        samples, nodes, plans = m.samples, m.job_nodes, m.plans
        with self._tx() as conn:
            job = self._get_job(conn, job_id)
            if job is None:
                raise NotFoundError("job", job_id)
            node_rows = conn.execute(
                sa.select(nodes).where(nodes.c.job_id == job_id).order_by(nodes.c.node_id)
            ).all()
            sample_rows = conn.execute(
                sa.select(samples)
                .where(samples.c.job_id == job_id, samples.c.step >= since_step)
                .order_by(samples.c.step.desc(), samples.c.id.desc())
                .limit(max_samples)
            ).all()
            plan_rows = conn.execute(
                sa.select(plans)
                .where(plans.c.job_id == job_id)
                .order_by(plans.c.issued_at, plans.c.plan_id)
            ).all()
        return History(
            job,
            [self._node(r) for r in node_rows],
            [self._sample(r) for r in reversed(sample_rows)],
            [
                PlanRow(r.plan_id, r.job_id, r.issued_at, r.stage, r.source, dict(r.plan))
                for r in plan_rows
            ],
        )

    def list_jobs(self, where: JobFilter, limit: int, after: Cursor | None) -> JobPage:
        jobs = m.jobs
        query = sa.select(jobs)
        for column, value in (
            (jobs.c.model_type, where.model_type),
            (jobs.c.dataset_name, where.dataset_name),
            (jobs.c.tenant, where.tenant),
            (jobs.c.status, where.status),
        ):
            if value:
                query = query.where(column == value)
        if after is not None:
            query = query.where(
                sa.or_(
                    jobs.c.submitted_at < after.submitted_at,
                    sa.and_(
                        jobs.c.submitted_at == after.submitted_at, jobs.c.job_id < after.job_id
                    ),
                )
            )
        query = query.order_by(jobs.c.submitted_at.desc(), jobs.c.job_id.desc()).limit(limit + 1)
        with self._tx() as conn:
            rows = [self._job_row(r) for r in conn.execute(query).all()]
        page = rows[:limit]
        more = len(rows) > limit
        return JobPage(page, Cursor(page[-1].submitted_at, page[-1].job_id) if more else None)

    def recent_throughputs(
        self, job_id: str, accelerator_type: str, device_count: int, limit: int
    ) -> list[float]:
        samples = m.samples
        with self._tx() as conn:
            values = conn.execute(
                sa.select(samples.c.steps_per_second)
                .where(
                    samples.c.job_id == job_id,
                    samples.c.accelerator_type == accelerator_type,
                    samples.c.device_count == device_count,
                    samples.c.steps_per_second > 0,
                )
                .order_by(samples.c.time.desc())
                .limit(limit)
            ).scalars()
            return list(reversed(list(values)))

    def capability_samples(
        self, job_id: str, accelerator_type: str, limit: int
    ) -> list[CapabilitySample]:
        samples = m.samples
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(
                    samples.c.steps_per_second,
                    samples.c.device_count,
                    samples.c.ests_per_device,
                )
                .where(
                    samples.c.job_id == job_id,
                    samples.c.accelerator_type == accelerator_type,
                    samples.c.steps_per_second > 0,
                )
                .order_by(samples.c.time.desc())
                .limit(limit)
            ).all()
        return [
            CapabilitySample(r.steps_per_second, r.device_count, tuple(r.ests_per_device))
            for r in reversed(rows)
            if r.ests_per_device
        ]

    def model_throughputs(
        self, model_type: str, accelerator_type: str, device_count: int | None, limit: int
    ) -> list[tuple[float, float]]:
        table = m.job_throughputs
        query = sa.select(table.c.steps_per_second, table.c.minibatches_per_second).where(
            table.c.model_type == model_type, table.c.accelerator_type == accelerator_type
        )
        if device_count is not None:
            query = query.where(table.c.device_count == device_count)
        with self._tx() as conn:
            rows = conn.execute(query.order_by(table.c.finished_at.desc()).limit(limit)).all()
        return [(r.steps_per_second, r.minibatches_per_second) for r in rows]

    def fingerprint(self, model_type: str, job_id: str) -> dict[Column, float]:
        table, samples = m.job_throughputs, m.samples
        out: dict[Column, float] = {}
        with self._tx() as conn:
            if model_type:
                for row in conn.execute(
                    sa.select(
                        table.c.accelerator_type,
                        table.c.device_count,
                        sa.func.avg(table.c.steps_per_second).label("value"),
                    )
                    .where(table.c.model_type == model_type)
                    .group_by(table.c.accelerator_type, table.c.device_count)
                ):
                    out[Column(row.accelerator_type, row.device_count)] = float(row.value)
            if job_id:
                for row in conn.execute(
                    sa.select(
                        samples.c.accelerator_type,
                        samples.c.device_count,
                        sa.func.avg(samples.c.steps_per_second).label("value"),
                    )
                    .where(samples.c.job_id == job_id, samples.c.steps_per_second > 0)
                    .group_by(samples.c.accelerator_type, samples.c.device_count)
                ):
                    out[Column(row.accelerator_type, row.device_count)] = float(row.value)
        return out

    # -- references -------------------------------------------------------------

    def reference_rows(self) -> list[ReferenceThroughput]:
        table = m.reference_throughputs
        with self._tx() as conn:
            rows = conn.execute(sa.select(table)).all()
        return [
            ReferenceThroughput(
                r.model_type, r.accelerator_type, r.device_count, r.steps_per_second
            )
            for r in rows
        ]

    def reference_signature(self) -> tuple[int, float]:
        table = m.reference_throughputs
        with self._tx() as conn:
            row = conn.execute(
                sa.select(
                    sa.func.count(), sa.func.coalesce(sa.func.sum(table.c.steps_per_second), 0.0)
                )
            ).one()
        return int(row[0]), float(row[1])

    def put_references(self, rows: Sequence[ReferenceThroughput], source: str) -> int:
        if not rows:
            return 0
        table = m.reference_throughputs
        insert = self._upsert(table)
        statement = insert.on_conflict_do_update(
            index_elements=["model_type", "accelerator_type", "device_count"],
            set_={"steps_per_second": insert.excluded.steps_per_second, "source": source},
        )
        with self._tx() as conn:
            conn.execute(
                statement,
                [
                    {
                        "model_type": r.model_type,
                        "accelerator_type": r.accelerator_type,
                        "device_count": r.device_count,
                        "steps_per_second": r.steps_per_second,
                        "source": source,
                    }
                    for r in rows
                ],
            )
        return len(rows)

    # -- plans ------------------------------------------------------------------

    def finished_similar(
        self, model_type: str, dataset_name: str | None, limit: int
    ) -> list[FinishedJob]:
        jobs, plans, nodes, samples = (
            m.jobs,
            m.plans,
            m.job_nodes,
            m.samples,
        )
        query = sa.select(jobs).where(
            jobs.c.model_type == model_type, jobs.c.status == JobStatus.SUCCEEDED.value
        )
        if dataset_name is not None:
            query = query.where(jobs.c.dataset_name == dataset_name)
        query = query.order_by(jobs.c.finished_at.desc(), jobs.c.job_id.desc()).limit(limit)
        out: list[FinishedJob] = []
        with self._tx() as conn:
            for job in (self._job_row(r) for r in conn.execute(query).all()):
                plan = conn.execute(
                    sa.select(plans.c.plan)
                    .where(plans.c.job_id == job.job_id)
                    .order_by(plans.c.issued_at.desc(), plans.c.plan_id.desc())
                    .limit(1)
                ).scalar()
                node_rows = [
                    self._node(r)
                    for r in conn.execute(sa.select(nodes).where(nodes.c.job_id == job.job_id))
                ]
                # A sample of no recorded node is a training process's (a data-parallel
                # job's rank 0 reports without a node): a worker's.
                role = sa.func.coalesce(nodes.c.role, "worker")
                peaks = conn.execute(
                    sa.select(role, sa.func.max(samples.c.memory_bytes_used))
                    .select_from(
                        samples.outerjoin(
                            nodes,
                            (nodes.c.job_id == samples.c.job_id)
                            & (nodes.c.node_id == samples.c.node_id),
                        )
                    )
                    .where(samples.c.job_id == job.job_id)
                    .group_by(role)
                ).all()
                rate = conn.execute(
                    sa.select(sa.func.avg(samples.c.steps_per_second)).where(
                        samples.c.job_id == job.job_id, samples.c.steps_per_second > 0
                    )
                ).scalar()
                devices = conn.execute(
                    sa.select(samples.c.device_count)
                    .where(samples.c.job_id == job.job_id)
                    .order_by(samples.c.time.desc(), samples.c.step.desc())
                    .limit(1)
                ).scalar()
                out.append(
                    FinishedJob(
                        job,
                        dict(plan) if plan is not None else None,
                        node_rows,
                        {role: int(peak or 0) for role, peak in peaks},
                        float(rate or 0.0),
                        int(devices or 0),
                    )
                )
        return out

    def record_plan(
        self, job_id: str, stage: str, source: str, plan: dict[str, Any], now: float
    ) -> PlanRow:
        row = PlanRow(uuid.uuid4().hex, job_id, now, stage, source, plan)
        with self._tx() as conn:
            conn.execute(
                m.plans.insert().values(
                    plan_id=row.plan_id,
                    job_id=job_id,
                    issued_at=now,
                    stage=stage,
                    source=source,
                    plan=plan,
                )
            )
        return row

    # -- layer profiles ---------------------------------------------------------

    def put_profile(self, row: ProfileRow) -> tuple[bool, bool]:
        table = m.layer_profiles
        values = {
            "profile_key": row.key,
            "model_type": row.model_type,
            "device": str(row.profile.get("device", "")),
            "num_layers": len(row.profile["names"]),
            "global_batch": int(row.profile["global_batch"]),
            "digest": row.digest,
            "profile": row.profile,
            "stored_at": row.stored_at,
        }
        insert = self._upsert(table)
        statement = insert.on_conflict_do_update(
            index_elements=["profile_key"],
            set_={k: insert.excluded[k] for k in values if k != "profile_key"},
        )
        with self._tx() as conn:
            digest = conn.execute(
                sa.select(table.c.digest).where(table.c.profile_key == row.key)
            ).scalar()
            if digest == row.digest:
                return False, False
            conn.execute(statement, values)
        return True, digest is not None

    def profile(self, key: str) -> ProfileRow:
        table = m.layer_profiles
        with self._tx() as conn:
            row = conn.execute(sa.select(table).where(table.c.profile_key == key)).first()
        if row is None:
            raise NotFoundError("layer profile", key)
        return ProfileRow(row.profile_key, row.model_type, row.stored_at, row.digest, row.profile)

    # -- Rubick's performance model ---------------------------------------------

    @staticmethod
    def _subject(table: sa.Table, subject: Subject) -> Any:
        return (table.c.subject_kind == subject.kind) & (table.c.subject == subject.key)

    def put_rubick(
        self,
        subject: Subject,
        workload: tuple[dict[str, Any], str] | None,
        runs: Sequence[RubickRunRow],
        now: float,
        fit: RubickFitRow | None = None,
    ) -> tuple[int, int, bool]:
        who = {"subject_kind": subject.kind, "subject": subject.key}
        replaced = False
        written = 0
        with self._tx() as conn:
            if workload is not None:
                data, digest = workload
                table = m.rubick_workloads
                old = conn.execute(
                    sa.select(table.c.digest).where(self._subject(table, subject))
                ).scalar()
                if old != digest:
                    insert = self._upsert(table)
                    values = {**who, "workload": data, "digest": digest, "stored_at": now}
                    conn.execute(
                        insert.on_conflict_do_update(
                            index_elements=["subject_kind", "subject"],
                            set_={
                                k: insert.excluded[k] for k in ("workload", "digest", "stored_at")
                            },
                        ),
                        values,
                    )
                    replaced = old is not None
            table = m.rubick_runs
            stored = {
                r.run_key: (r.iteration_ms, r.source)
                for r in conn.execute(
                    sa.select(table.c.run_key, table.c.iteration_ms, table.c.source).where(
                        self._subject(table, subject)
                    )
                )
            }
            fresh = {
                r.run_key: r for r in runs if stored.get(r.run_key) != (r.iteration_ms, r.source)
            }
            if fresh:
                insert = self._upsert(table)
                conn.execute(
                    insert.on_conflict_do_update(
                        index_elements=["subject_kind", "subject", "run_key"],
                        set_={
                            k: insert.excluded[k]
                            for k in ("config", "iteration_ms", "source", "stored_at")
                        },
                    ),
                    [
                        {
                            **who,
                            "run_key": r.run_key,
                            "config": r.config,
                            "iteration_ms": r.iteration_ms,
                            "source": r.source,
                            "stored_at": now,
                        }
                        for r in fresh.values()
                    ],
                )
                written = len(fresh)
            if fit is not None:
                table = m.rubick_fits
                insert = self._upsert(table)
                values = {**who, **asdict(fit)}
                conn.execute(
                    insert.on_conflict_do_update(
                        index_elements=["subject_kind", "subject"],
                        set_={k: insert.excluded[k] for k in values if k not in who},
                    ),
                    values,
                )
        return written, len(stored.keys() | fresh.keys()), replaced

    def rubick_profile(self, subject: Subject, *, with_runs: bool = True) -> RubickProfileRow:
        workloads, runs = m.rubick_workloads, m.rubick_runs
        with self._tx() as conn:
            row = conn.execute(
                sa.select(workloads.c.workload, workloads.c.digest).where(
                    self._subject(workloads, subject)
                )
            ).first()
            run_rows = (
                conn.execute(
                    sa.select(runs)
                    .where(self._subject(runs, subject))
                    .order_by(runs.c.stored_at, runs.c.run_key)
                ).all()
                if with_runs
                else []
            )
        return RubickProfileRow(
            dict(row.workload) if row is not None else None,
            row.digest if row is not None else "",
            [RubickRunRow(r.run_key, dict(r.config), r.iteration_ms, r.source) for r in run_rows],
        )

    def rubick_fit(self, subject: Subject) -> RubickFitRow | None:
        table = m.rubick_fits
        with self._tx() as conn:
            row = conn.execute(sa.select(table).where(self._subject(table, subject))).first()
        if row is None:
            return None
        return RubickFitRow(
            params=dict(row.params),
            cluster=dict(row.cluster),
            workload_digest=row.workload_digest,
            rmsle=row.rmsle,
            run_count=row.run_count,
            runs_from_samples=row.runs_from_samples,
            offload_runs=row.offload_runs,
            fit_seconds=row.fit_seconds,
            fitted_at=row.fitted_at,
        )
