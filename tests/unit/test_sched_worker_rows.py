"""Worker rows written outside the scheduler's lock (gearshift.scheduler.api.registry.WorkerRows):
whatever order racing writes arrive in, the row ends as the newest version, and writes that
queue up while one is in progress are saved together (a group commit)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from gearshift.scheduler.api.registry import WorkerRows
from gearshift.scheduler.state.records import WorkerRecord


def worker(worker_id: str, *, alive: bool = True) -> WorkerRecord:
    return WorkerRecord(
        worker_id=worker_id, address="a:1", hostname="h", devices=[], alive=alive,
        registered_at=0.0, last_heartbeat_at=0.0,
    )  # fmt: skip


class Table:
    """A store's worker rows, with every save call recorded."""

    def __init__(self) -> None:
        self.rows: dict[str, bool] = {}
        self.calls: list[list[str]] = []
        self.fail = False

    def save(self, workers: Sequence[WorkerRecord]) -> None:
        if self.fail:
            raise ConnectionError("database down")
        self.calls.append([w.worker_id for w in workers])
        for w in workers:
            self.rows[w.worker_id] = w.alive


def test_an_older_version_written_late_changes_nothing() -> None:
    """Registered (version 1, alive), then lost (version 2, dead): the loss is written
    first, the registration's write arrives late and is dropped."""
    rows, table = WorkerRows(), Table()
    registered = rows.stamp([worker("w1")])
    lost = rows.stamp([worker("w1", alive=False)])
    rows.write(lost, table.save)
    rows.write(registered, table.save)
    assert table.rows == {"w1": False}
    assert table.calls == [["w1"]]


def test_the_copies_are_taken_when_stamped() -> None:
    rows, table = WorkerRows(), Table()
    record = worker("w1")
    stamped = rows.stamp([record])
    record.alive = False  # changed after the stamp: a later stamp carries that
    rows.write(stamped, table.save)
    assert table.rows == {"w1": True}


def test_writes_queued_during_a_write_are_saved_together() -> None:
    """While one save is in progress, 20 registrations queue; they go out in one call."""
    rows, table = WorkerRows(), Table()
    entered, release = threading.Event(), threading.Event()

    def slow_save(workers: Sequence[WorkerRecord]) -> None:
        entered.set()
        assert release.wait(10.0)
        table.save(workers)

    first = threading.Thread(target=rows.write, args=(rows.stamp([worker("w0")]), slow_save))
    first.start()
    assert entered.wait(10.0)
    others = [
        threading.Thread(target=rows.write, args=(rows.stamp([worker(f"w{i}")]), table.save))
        for i in range(1, 21)
    ]
    for t in others:
        t.start()
    release.set()
    for t in [first, *others]:
        t.join(10.0)
        assert not t.is_alive()
    assert table.calls[0] == ["w0"]
    assert sorted(w for call in table.calls[1:] for w in call) == sorted(
        f"w{i}" for i in range(1, 21)
    )
    assert len(table.calls) < 21  # grouped: fewer saves than writes
    assert len(table.rows) == 21


def test_a_failed_save_is_retried_by_the_next_write() -> None:
    rows, table = WorkerRows(), Table()
    table.fail = True
    with pytest.raises(ConnectionError):
        rows.write(rows.stamp([worker("w1")]), table.save)
    table.fail = False
    rows.write(rows.stamp([worker("w2")]), table.save)
    assert table.rows == {"w1": True, "w2": True}
