"""The scheduler's tables: the models agree with migration 0002, and the store keeps jobs,
events, workers, tasks and state on SQLite and on the real PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from gearshift.common import codepkg
from gearshift.common.db import create_engine, downgrade, migrate
from gearshift.common.errors import ConflictError
from gearshift.scheduler.state import models
from gearshift.scheduler.state.memory_store import MemoryStore
from gearshift.scheduler.state.records import EventRecord, JobRecord, TaskRecord, WorkerRecord
from gearshift.scheduler.state.state import SchedulerSettings
from gearshift.scheduler.state.store import SqlStore, Store
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.sched_harness import Clock, job_spec, make_scheduler

C = common_pb2
S = scheduler_pb2


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sched.db'}"
    value: str = request.getfixturevalue("postgres_db")
    return value


def _sched_differences(url: str) -> list[object]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(context, models.metadata)
    finally:
        engine.dispose()
    # Only our tables: the Brain's evolve in parallel in the same history.
    return [d for d in diff if "sched_" in repr(d)]


def test_models_and_migrations_agree(url: str) -> None:
    migrate(url)
    assert _sched_differences(url) == []


def test_the_check_catches_a_drift(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'drift.db'}"
    migrate(url)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE sched_workers ADD COLUMN rack VARCHAR(16)"))
    engine.dispose()
    assert _sched_differences(url) != []


def test_downgrade_removes_the_scheduler_tables(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'down.db'}"
    migrate(url)
    downgrade(url, "0001_brain")
    engine = create_engine(url)
    names = sa.inspect(engine).get_table_names()
    engine.dispose()
    assert not [n for n in names if n.startswith("sched_")]


@pytest.fixture
def store(url: str) -> Iterator[SqlStore]:
    migrate(url)
    out = SqlStore(url)
    yield out
    out.close()


def _job(job_id: str, when: float, key: str | None = None, name: str = "job") -> JobRecord:
    spec = C.JobSpec(name=name, tenant="t", num_ests=2)
    return JobRecord(job_id, spec, C.JOB_STATE_QUEUED, when, idempotency_key=key, last_sequence=1)


def _event(job_id: str, sequence: int, kind: int = S.JOB_EVENT_TYPE_SUBMITTED) -> EventRecord:
    return EventRecord(job_id, sequence, 1.0, kind, C.JOB_STATE_QUEUED, "m")


@contextmanager
def _statements(store: SqlStore) -> Iterator[list[str]]:
    """The SQL statements the store's engines send while the block runs."""
    statements: list[str] = []

    def executed(*args: object) -> None:
        statements.append(str(args[2]))

    engines = [store.engine, *([store._submissions] if store._submissions else [])]
    for engine in engines:
        sa.event.listen(engine, "before_cursor_execute", executed)
    try:
        yield statements
    finally:
        for engine in engines:
            sa.event.remove(engine, "before_cursor_execute", executed)


def test_a_submission_is_one_statement_on_postgresql(store: SqlStore) -> None:
    """The job and its first event in one statement on a connection already in autocommit:
    one round trip after the pool's ping (each waited for a busy host's CPU, bench/load.py;
    it was BEGIN, two inserts and COMMIT)."""
    with _statements(store) as statements:
        store.create_job(_job("j1", 1.0), _event("j1", 1))
    one = store.engine.dialect.name == "postgresql"
    assert len(statements) == (1 if one else 2), statements
    assert [e.sequence for e in store.events_after("j1", 0)] == [1]


def test_a_keyed_submission_is_one_statement_too(postgres_db: str) -> None:
    """The SDK's submissions carry an idempotency key: the scheduler inserts at once and
    looks the key up only when the insert is refused (a lookup first cost each submission
    a round trip)."""
    migrate(postgres_db)
    store = SqlStore(postgres_db)
    scheduler, _ = make_scheduler(SchedulerSettings(), clock=Clock(), store=store)
    try:
        with _statements(store) as statements:
            first, created = scheduler.submit(job_spec("keyed", 1), "key-1")
            assert created and len(statements) == 1, statements
            again, created = scheduler.submit(job_spec("keyed", 1), "key-1")
        assert (again.job_id, created) == (first.job_id, False)
        assert len(statements) == 3, statements  # the refused insert, then the lookup
    finally:
        scheduler.stop()
        store.close()


def test_concurrent_submissions_keep_their_connections(store: SqlStore) -> None:
    """Eight submitters at once, fifty jobs each, open at most eight connections: the pool
    keeps what it opens (with two kept, a hundred submissions a second opened and closed
    35 PostgreSQL sessions a second, each a backend forked: bench/load.py)."""
    submitters, each = 8, 50
    opened: list[object] = []

    def count_one(connection: object, _record: object) -> None:
        opened.append(connection)

    engines = [store.engine, *([store._submissions] if store._submissions else [])]
    for engine in engines:
        sa.event.listen(engine, "connect", count_one)
    meet = threading.Barrier(submitters)

    def submit(first: int) -> None:
        for i in range(first, first + each):
            meet.wait(timeout=30)  # all eight at once, every time
            store.create_job(_job(f"c{i}", float(i)), _event(f"c{i}", 1))

    with ThreadPoolExecutor(submitters) as pool:
        list(pool.map(submit, range(0, submitters * each, each)))
    for engine in engines:
        sa.event.remove(engine, "connect", count_one)
    with store.engine.connect() as connection:
        count = connection.execute(sa.select(sa.func.count()).select_from(models.Job)).scalar()
    assert count == submitters * each
    assert len(opened) <= submitters, f"{len(opened)} connections opened"


def test_jobs_events_and_keys(store: SqlStore) -> None:
    store.create_job(_job("j1", 1.0, key="k"), _event("j1", 1))
    with pytest.raises(ConflictError):
        store.create_job(_job("j2", 2.0, key="k"), _event("j2", 1))
    assert store.get_job("j2") is None and store.events_after("j2", 0) == []  # neither
    found = store.find_job_by_key("k")
    assert found is not None and found.job_id == "j1"
    job = store.get_job("j1")
    assert job is not None and job.spec.num_ests == 2
    job.state = C.JOB_STATE_RUNNING
    job.placement.processes.add(rank=0, worker_id="w", est_ids=[0, 1])
    job.last_sequence = 2
    store.save_job(job, [_event("j1", 2, S.JOB_EVENT_TYPE_STARTED)])
    again = store.get_job("j1")
    assert again is not None and again.state == C.JOB_STATE_RUNNING
    assert list(again.placement.processes[0].est_ids) == [0, 1]
    assert [e.sequence for e in store.events_after("j1", 0)] == [1, 2]
    assert [e.type for e in store.events_after("j1", 1)] == [S.JOB_EVENT_TYPE_STARTED]
    assert [j.job_id for j in store.active_jobs()] == ["j1"]


def test_a_jobs_restart_count_is_stored(store: SqlStore) -> None:
    """limits.maxRestarts counts across scheduler restarts, so the count lives in the job row."""
    store.create_job(_job("r1", 1.0), _event("r1", 1))
    job = store.get_job("r1")
    assert job is not None and job.restart_count == 0
    job.restart_count = 2
    job.last_sequence = 2
    store.save_job(job, [_event("r1", 2, S.JOB_EVENT_TYPE_PREEMPTED)])
    again = store.get_job("r1")
    assert again is not None and again.restart_count == 2


def test_the_restart_count_column_comes_and_goes_with_its_migration(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'restarts.db'}"
    migrate(url, "0002_scheduler")
    engine = create_engine(url)
    with engine.begin() as conn:  # a job written before the column existed
        conn.execute(
            sa.text(
                "INSERT INTO sched_jobs VALUES ('old', 'n', 't', 1, x'', NULL, 1.0, 0.0, 0.0,"
                " x'', x'', 0, 0, '', '', 1)"
            )
        )
    migrate(url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT restart_count FROM sched_jobs")).scalar_one() == 0
    downgrade(url, "0002_scheduler")
    columns = {c["name"] for c in sa.inspect(engine).get_columns("sched_jobs")}
    engine.dispose()
    assert "restart_count" not in columns and "rescale_count" in columns


def test_a_jobs_execution_plan_is_stored(store: SqlStore) -> None:
    """A restarted scheduler resumes a job on its plan (Rubick), so the plan is in the row."""
    store.create_job(_job("p1", 1.0), _event("p1", 1))
    job = store.get_job("p1")
    assert job is not None and job.plan == C.ExecutionPlan()
    job.plan = C.ExecutionPlan(gradient_checkpointing=True, threads_per_process=2)
    job.last_sequence = 2
    store.save_job(job, [_event("p1", 2, S.JOB_EVENT_TYPE_STARTED)])
    again = store.get_job("p1")
    assert again is not None and again.plan == job.plan
    assert [j.plan for j in store.active_jobs()] == [job.plan]


def test_a_jobs_resource_plans_and_pin_are_stored(store: SqlStore) -> None:
    """A restarted scheduler keeps the resource plan a job runs and a user's pin (migration
    0009): in the row, "" (NULL) for none."""
    store.create_job(_job("ps1", 1.0), _event("ps1", 1))
    job = store.get_job("ps1")
    assert job is not None and (job.process_plan, job.ps_plan, job.ps_pin) == ("", "", "")
    job.process_plan = '{"cpu_cores": 2}'
    job.ps_plan = '{"ps": 2, "workers": 2}'
    job.ps_pin = '{"ps": 3, "workers": 4}'
    job.last_sequence = 2
    store.save_job(job, [_event("ps1", 2, S.JOB_EVENT_TYPE_PLAN)])
    kept = (job.process_plan, job.ps_plan, job.ps_pin)
    again = store.get_job("ps1")
    assert again is not None and (again.process_plan, again.ps_plan, again.ps_pin) == kept
    assert [(j.process_plan, j.ps_plan, j.ps_pin) for j in store.active_jobs()] == [kept]
    job.ps_pin = ""
    store.save_job(job)
    again = store.get_job("ps1")
    assert again is not None and again.ps_pin == ""


def test_the_stored_plan_columns_come_and_go_with_their_migration(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ps.db'}"
    migrate(url)
    store = SqlStore(url)
    store.create_job(_job("ps1", 1.0), _event("ps1", 1))
    store.close()
    downgrade(url, "0008_job_plan")
    engine = create_engine(url)
    columns = {c["name"] for c in sa.inspect(engine).get_columns("sched_jobs")}
    engine.dispose()
    assert {"process_plan", "ps_plan", "ps_pin"}.isdisjoint(columns) and "plan" in columns
    migrate(url)
    store = SqlStore(url)
    old = store.get_job("ps1")  # a row written before the columns: none of either
    store.close()
    assert old is not None and (old.process_plan, old.ps_plan, old.ps_pin) == ("", "", "")


def test_the_plan_column_comes_and_goes_with_its_migration(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'plans.db'}"
    migrate(url, "0007_rubick_models")
    engine = create_engine(url)
    with engine.begin() as conn:  # a job written before the column existed
        conn.execute(
            sa.text(
                "INSERT INTO sched_jobs (job_id, name, tenant, state, spec, submitted_at,"
                " started_at, finished_at, progress, placement, generation, rescale_count,"
                " message, final_digest, last_sequence)"
                " VALUES ('old', 'n', 't', 1, x'', 1.0, 0.0, 0.0, x'', x'', 0, 0, '', '', 1)"
            )
        )
    engine.dispose()
    migrate(url)
    store = SqlStore(url)
    old = store.get_job("old")
    store.close()
    assert old is not None and old.plan == C.ExecutionPlan()  # NULL: the default plan
    downgrade(url, "0007_rubick_models")
    engine = create_engine(url)
    columns = {c["name"] for c in sa.inspect(engine).get_columns("sched_jobs")}
    engine.dispose()
    assert "plan" not in columns and "locked_type" in columns


def test_listing_newest_first_with_cursor_and_filters(store: SqlStore) -> None:
    for i in range(5):
        store.create_job(
            _job(f"j{i}", float(i), name=f"x_{i}" if i % 2 else f"y{i}"), _event(f"j{i}", 1)
        )
    page = store.list_jobs(tenant="", states=[], name_prefix="", limit=2, after=None)
    assert [j.job_id for j in page] == ["j4", "j3"]
    rest = store.list_jobs(
        tenant="",
        states=[],
        name_prefix="",
        limit=10,
        after=(page[-1].submitted_at, page[-1].job_id),
    )
    assert [j.job_id for j in rest] == ["j2", "j1", "j0"]
    # '_' is matched literally, not as a wildcard.
    assert [
        j.job_id
        for j in store.list_jobs(tenant="", states=[], name_prefix="x_", limit=9, after=None)
    ] == ["j3", "j1"]
    assert store.list_jobs(tenant="other", states=[], name_prefix="", limit=9, after=None) == []
    assert (
        store.list_jobs(
            tenant="", states=[C.JOB_STATE_RUNNING], name_prefix="", limit=9, after=None
        )
        == []
    )


def test_workers_tasks_and_state(store: SqlStore) -> None:
    worker = WorkerRecord(
        "w1", "h:1", "host", [C.DeviceGroup(accelerator_type="cpu", count=2)], True, 1.0, 2.0
    )
    store.save_worker(worker)
    worker.alive = False
    store.save_worker(worker)
    (loaded,) = store.workers()
    assert not loaded.alive and loaded.devices[0].count == 2
    store.create_job(_job("j1", 1.0), _event("j1", 1))
    task = TaskRecord("t1", "j1", "w1", 1, C.TASK_STATE_RUNNING, (0, 1), "h:29500", 9.0, 1.0)
    store.save_tasks([task])
    assert [t.local_ranks for t in store.open_tasks()] == [(0, 1)]
    task.state = C.TASK_STATE_CHECKPOINTED
    store.save_tasks([task])
    assert store.open_tasks() == []
    assert store.get_state("round") is None
    store.set_state("round", "7")
    store.set_state("round", "8")
    assert store.get_state("round") == "8"


@pytest.fixture(params=["sqlite", "postgres", "memory"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Every backend of the Store interface: SQLite, PostgreSQL and the in-memory one."""
    if request.param == "memory":
        yield MemoryStore()
        return
    url = (
        f"sqlite:///{tmp_path / 'any.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("postgres_db")
    )
    migrate(url)
    out = SqlStore(url)
    yield out
    out.close()


def test_code_packages_are_stored_once_by_hash(any_store: Store) -> None:
    data = b"PK\x03\x04" + bytes(range(256)) * 10
    sha = codepkg.sha256_of(data)
    assert not any_store.has_code(sha) and any_store.get_code(sha) is None
    assert any_store.put_code(sha, data) is True
    assert any_store.put_code(sha, data) is False  # the second upload stores nothing
    assert any_store.has_code(sha) and any_store.get_code(sha) == data


def test_a_jobs_tasks_ended_ones_too(any_store: Store) -> None:
    any_store.create_job(_job("j1", 1.0), _event("j1", 1))
    any_store.create_job(_job("j2", 2.0), _event("j2", 1))
    first = TaskRecord("t1", "j1", "w1", 1, C.TASK_STATE_CHECKPOINTED, (0,), "h:1", 9.0, 1.0)
    second = TaskRecord("t2", "j1", "w2", 2, C.TASK_STATE_RUNNING, (0, 1), "h:2", 9.0, 2.0)
    other = TaskRecord("t3", "j2", "w2", 1, C.TASK_STATE_RUNNING, (0,), "h:2", 9.0, 3.0)
    any_store.save_tasks([second, other, first])
    assert [t.task_id for t in any_store.job_tasks("j1")] == ["t1", "t2"]
    assert any_store.job_tasks("nope") == []


def test_a_batch_writes_its_jobs_events_and_tasks_together_at_its_end(any_store: Store) -> None:
    """A round's writes (gearshift.scheduler.state.write_batch): nothing is visible before the
    batch ends, everything after; a record saved twice is written as it ends; another
    thread's writes meanwhile go through at once."""
    import threading

    any_store.create_job(_job("j1", 1.0), _event("j1", 1))
    any_store.create_job(_job("j2", 2.0), _event("j2", 1))
    job = _job("j1", 1.0)
    task = TaskRecord("t1", "j1", "w1", 1, C.TASK_STATE_STARTING, (0,), "h:1", 9.0, 1.0)
    with any_store.batch():
        job.state, job.last_sequence = C.JOB_STATE_RESCALING, 2
        any_store.save_job(job, [_event("j1", 2, S.JOB_EVENT_TYPE_RESCALING)])
        any_store.save_tasks([task])
        with any_store.batch():  # joins the outer one
            task.state = C.TASK_STATE_RUNNING
            any_store.save_tasks([task])
            job.state, job.last_sequence = C.JOB_STATE_RUNNING, 3
            any_store.save_job(job, [_event("j1", 3, S.JOB_EVENT_TYPE_STARTED)])
        other = threading.Thread(
            target=lambda: any_store.save_job(_job("j2", 2.0), [_event("j2", 2)])
        )
        other.start()
        other.join()
        assert [e.sequence for e in any_store.events_after("j2", 0)] == [1, 2]  # not held
        assert [e.sequence for e in any_store.events_after("j1", 0)] == [1]
        assert any_store.job_tasks("j1") == []
        stored = any_store.get_job("j1")
        assert stored is not None and stored.state == C.JOB_STATE_QUEUED
    assert [e.sequence for e in any_store.events_after("j1", 0)] == [1, 2, 3]
    stored = any_store.get_job("j1")
    assert stored is not None and stored.state == C.JOB_STATE_RUNNING
    assert [(t.task_id, t.state) for t in any_store.job_tasks("j1")] == [
        ("t1", C.TASK_STATE_RUNNING)
    ]


def test_a_batch_broken_by_an_error_still_writes_what_was_saved(any_store: Store) -> None:
    any_store.create_job(_job("j1", 1.0), _event("j1", 1))
    task = TaskRecord("t1", "j1", "w1", 1, C.TASK_STATE_RUNNING, (0,), "h:1", 9.0, 1.0)
    with pytest.raises(RuntimeError, match="half-way"), any_store.batch():
        any_store.save_tasks([task])
        raise RuntimeError("half-way")
    assert [t.task_id for t in any_store.job_tasks("j1")] == ["t1"]
    any_store.save_tasks([task])  # no batch left open: written at once
    assert len(any_store.open_tasks()) == 1


def test_a_locked_batch_commits_after_the_lock_is_let_go_in_the_order_of_the_holds(
    any_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a hold's commit waits (a slow disk), the lock is free for others; a later
    hold's commit of the same job waits for it, so the database ends with the newer state."""
    import threading

    from tests.helpers import wait_until

    any_store.create_job(_job("j1", 1.0), _event("j1", 1))
    lock = threading.RLock()
    disk = threading.Event()
    commits: list[int] = []
    commit = any_store._commit  # type: ignore[attr-defined]

    def slow_commit(rows: object) -> None:
        if not commits:
            assert disk.wait(30), "the test never let the first commit through"
        commits.append(len(commits))
        commit(rows)

    monkeypatch.setattr(any_store, "_commit", slow_commit)
    job = _job("j1", 1.0)

    def hold(state: int, sequence: int) -> None:
        with any_store.locked_batch(lock):
            job.state, job.last_sequence = state, sequence
            any_store.save_job(job, [_event("j1", sequence)])

    first = threading.Thread(target=hold, args=(C.JOB_STATE_RESCALING, 2))
    first.start()
    order = any_store._order  # type: ignore[attr-defined]
    wait_until(lambda: order._taken == 1, 10, "the first hold took no ticket")
    assert lock.acquire(timeout=10), "the lock is held while the first hold commits"
    lock.release()
    wrote_nothing = threading.Thread(target=_hold_writing_nothing, args=(any_store, lock))
    wrote_nothing.start()  # a heartbeat that changed nothing durable: waits for no commit
    wrote_nothing.join(10)
    assert not wrote_nothing.is_alive(), "a hold that wrote nothing waited for a commit"
    assert order._taken == 1
    second = threading.Thread(target=hold, args=(C.JOB_STATE_RUNNING, 3))
    second.start()
    wait_until(lambda: order._taken == 2, 10, "the second hold took no ticket")
    assert commits == [] and second.is_alive()  # its commit waits for the first one's
    disk.set()
    first.join(30)
    second.join(30)
    assert commits == [0, 1]
    stored = any_store.get_job("j1")
    assert stored is not None and stored.state == C.JOB_STATE_RUNNING
    assert [e.sequence for e in any_store.events_after("j1", 0)] == [1, 2, 3]


def _hold_writing_nothing(store: Store, lock: object) -> None:
    with store.locked_batch(lock):  # type: ignore[arg-type]
        pass
    store.save_tasks([])  # nor a write of nothing outside a batch


def test_a_locked_batch_that_fails_to_commit_says_so_and_the_next_one_commits(
    any_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    any_store.create_job(_job("j1", 1.0), _event("j1", 1))
    lock = threading.Lock()
    commit = any_store._commit  # type: ignore[attr-defined]
    broken = [True]

    def flaky_commit(rows: object) -> None:
        if broken.pop() if broken else False:
            raise ConnectionError("the database went away")
        commit(rows)

    monkeypatch.setattr(any_store, "_commit", flaky_commit)
    job = _job("j1", 1.0)
    with pytest.raises(ConnectionError, match="went away"), any_store.locked_batch(lock):
        job.last_sequence = 2
        any_store.save_job(job, [_event("j1", 2)])
    assert not lock.locked()
    with pytest.raises(RuntimeError, match="half-way"), any_store.locked_batch(lock):
        job.last_sequence = 3
        any_store.save_job(job, [_event("j1", 3)])
        raise RuntimeError("half-way")  # what was saved is still written
    assert [e.sequence for e in any_store.events_after("j1", 0)] == [1, 3]
