"""Where a round's decision (allocate -> collocate -> place, `plan_round`) runs.

In the scheduler's process by default. With `--decision-process` it runs in a child process
of its own: the decision is pure Python over every job and held the GIL for most of a
round, so every RPC waited for it (bench/load.py --sweep: at 100-1,000 workers each RPC's
p99 was about a round's length, with the CPU far from busy). The child keeps the allocator
and what it worked out between rounds; each round it gets only the job snapshots that
changed (the rounds hand over the same object for a job while nothing it is made of
changed), so that what the allocator keeps per job stays valid there too. A child that
dies is started again with a fresh allocator and the whole snapshot: its state is a cache
of the snapshots (Gavel's time ledger starts afresh, as after a recomputation).

An allocator whose decision reads state the scheduler's process keeps (hooks.py,
`KeepsDecisionState`: tenants' quotas, which SIGHUP reloads there; Rubick's fitted models,
which the scheduler's copy refreshes from the Brain outside the lock) ships that state with
the snapshot, whenever it changed, and the child's copy says back its admissions after
each decision: the child needs no Brain and no tenants file of its own."""

from __future__ import annotations

import contextlib
import copy
import logging
import multiprocessing as mp
import os
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Protocol

from gearshift.common.logs import configure_logging, stderr_logging
from gearshift.scheduler.round.hooks import KeepsDecisionState, Ranks
from gearshift.scheduler.round.pipeline import plan_round
from gearshift.scheduler.round.reconcile import same_assignment
from gearshift.scheduler.types import (
    Allocator,
    Assignment,
    Collocator,
    Device,
    JobSnapshot,
    Snapshot,
    Target,
)

if TYPE_CHECKING:
    from gearshift.scheduler.state.state import SchedulerSettings

log = logging.getLogger("gearshift.scheduler")

# The child yields the CPU to the RPCs: a decision is a burst of CPU once a round, and
# on a busy host it took a core from the heartbeats' and submissions' processes.
DECISION_NICENESS = 10

Current = Mapping[str, Assignment]
Decision = tuple[dict[str, Target], dict[str, Assignment]]  # what plan_round returns
# The child's own allocate and collocate stages from the settings: a module-level function
# (the spawned child gets it by name), passed in by the wiring (plugins/stages.py).
Stages = Callable[["SchedulerSettings"], tuple[Allocator, Collocator | None]]


class Decider(Protocol):
    def decide(self, snapshot: Snapshot, current: Current) -> Decision: ...

    def priorities(self) -> Mapping[str, float]:
        """The allocator's priorities in the last decision (hooks.Ranks; empty: it does
        not rank): the round's reasons quote them."""
        ...

    def lend_allocator(self) -> Allocator | None:
        """A copy of the allocator with its memory of past rounds, for estimates that run
        the pipeline forward (sim/forward.py); None when it cannot be copied. Called in
        the round's thread, between decisions."""
        ...

    def close(self) -> None: ...


# What the scheduler asks the child for, instead of a decision: its allocator, pickled
# on the way (a copy made between decisions, so a forward run never touches the live one).
LEND = "lend-allocator"


class InProcess:
    """plan_round here, with the rounds' own allocator."""

    def __init__(self, allocator: Allocator, collocator: Collocator | None) -> None:
        self.allocator = allocator
        self.collocator = collocator

    def decide(self, snapshot: Snapshot, current: Current) -> Decision:
        return plan_round(snapshot, self.allocator, current, self.collocator)

    def priorities(self) -> Mapping[str, float]:
        return self.allocator.priorities() if isinstance(self.allocator, Ranks) else {}

    def lend_allocator(self) -> Allocator | None:
        return copy_at_rest(self.allocator)

    def close(self) -> None:
        return None


_NOTHING = object()  # nothing shipped yet (a new child)


class DecisionProcess:
    """plan_round in a child process; see the module docstring. `allocator`: the
    scheduler's own copy, whose state is shipped when it keeps any (`KeepsDecisionState`)."""

    def __init__(
        self, settings: SchedulerSettings, stages: Stages, allocator: Allocator | None = None
    ) -> None:
        self.settings = settings
        self.stages = stages
        self.keeps: KeepsDecisionState | None = (
            allocator if isinstance(allocator, KeepsDecisionState) else None
        )
        self._shipped: object = _NOTHING  # what the child's copy was last shipped
        self._ctx = mp.get_context("spawn")  # grpc threads run here: no fork
        self._conn: Connection | None = None
        self._process: Any = None
        # What the child holds: the jobs, the devices, the running jobs' assignments
        self._sent: dict[str, JobSnapshot] = {}
        self._sent_devices: tuple[Device, ...] | None = None
        self._sent_current: dict[str, Assignment] = {}
        self._targets: dict[str, Target] = {}  # the child's last answer, as it stands here
        self._priorities: dict[str, float] = {}  # the child's allocator's, last decision
        self.restarts = 0

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._process = self._ctx.Process(
            target=_serve,
            args=(child, self.settings, self.stages, stderr_logging()),
            name="gearshift-decisions",
            daemon=True,
        )
        self._process.start()
        child.close()
        self._conn = parent
        self._sent, self._sent_devices, self._sent_current = {}, None, {}
        self._targets = {}
        self._shipped = _NOTHING

    def priorities(self) -> Mapping[str, float]:
        return self._priorities

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def lend_allocator(self) -> Allocator | None:
        """The child's allocator, pickled there and unpickled here (its time ledger makes
        the estimates the live decisions'); None before the first decision, when the
        child cannot pickle it, or when the child is gone (the next decision restarts it)."""
        if self._conn is None:
            return None
        try:
            self._conn.send(LEND)
            lent: Allocator | None = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError):
            self._stop_child()
            return None
        return lent

    def decide(self, snapshot: Snapshot, current: Current) -> Decision:
        try:
            return self._ask(snapshot, current)
        except (EOFError, OSError) as exc:  # the child died: a fresh one, everything sent
            log.warning("decision process lost; starting another", extra={"error": repr(exc)})
            self.restarts += 1
            self._stop_child()
            return self._ask(snapshot, current)

    def _ask(self, snapshot: Snapshot, current: Current) -> Decision:
        if self._conn is None:
            self._start()
        assert self._conn is not None
        conn = self._conn
        changed, moved = _changes(self._sent, snapshot.jobs)
        # The devices and each running job's assignment are the same objects while they
        # stand (views.py): sent only when new (4,000 devices and 2,200 assignments took
        # 14 ms a round to pickle and unpickle, offline)
        new_devices = snapshot.devices is not self._sent_devices
        shipment = self.keeps.shipment() if self.keeps is not None else None
        ship = self.keeps is not None and shipment != self._shipped
        conn.send((replace(snapshot, jobs=(), devices=(), ran=()), new_devices, ship))
        if new_devices:
            send_chunks(conn, snapshot.devices)
        if ship:
            conn.send(shipment)
            self._shipped = shipment
        ids = [j.job_id for j in snapshot.jobs]
        sent_current = self._sent_current
        placed = [(k, v) for k, v in current.items() if sent_current.get(k) is not v]
        for items in (snapshot.ran, ids, changed, moved, list(current), placed):
            send_chunks(conn, items)
        failed = conn.recv()  # waits without the GIL: the RPCs run meanwhile
        self._sent = {job.job_id: job for job in snapshot.jobs}
        self._sent_devices, self._sent_current = snapshot.devices, dict(current)
        if failed is not None:
            raise failed
        target_ids, new_targets, desired_ids, moved_to, ranks = (
            recv_chunks(conn) for _ in range(5)
        )
        self._priorities = dict(ranks)
        outcome = conn.recv()
        if self.keeps is not None:
            self.keeps.told(outcome)
        known = self._targets
        known.update(new_targets)
        self._targets = targets = {job_id: known[job_id] for job_id in target_ids}
        # A job kept on its devices gets its held assignment itself back: the reconcile's
        # comparison of the two is then one of identity (views.py keeps it per placement)
        new = dict(moved_to)
        desired = {j: new[j] if j in new else current[j] for j in desired_ids}
        return dict(targets), desired

    def _stop_child(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._process is not None:
            self._process.kill()
            self._process.join(timeout=10)
            self._process = None

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.send(None)
        if self._process is not None:
            self._process.join(timeout=10)
        self._stop_child()


def _serve(
    conn: Connection,
    settings: SchedulerSettings,
    stages: Stages,
    logs: tuple[str, str] | None = None,
) -> None:
    """The child: one decision per message, the allocator kept between them; it logs to
    the scheduler's stderr as the scheduler does (`logs`: level and format)."""
    if logs is not None:
        configure_logging(*logs)
    os.nice(DECISION_NICENESS)
    allocator, collocator = stages(settings)
    keeps: KeepsDecisionState | None = (
        allocator if isinstance(allocator, KeepsDecisionState) else None
    )
    jobs: dict[str, JobSnapshot] = {}
    devices: tuple[Device, ...] = ()
    current: dict[str, Assignment] = {}
    sent_targets: Mapping[str, Target] = {}  # the last answer's, as the scheduler holds them
    while True:
        try:
            message = conn.recv()
            if message is None:
                return
            if message == LEND:
                conn.send_bytes(_pickled_at_rest(allocator))
                continue
            header, new_devices, shipped = message
            if new_devices:
                devices = tuple(recv_chunks(conn))
            if shipped:
                shipment = conn.recv()
                assert keeps is not None, "shipped to an allocator that keeps nothing"
                keeps.take(shipment)
            ran, ids, changed, moved, running, placed = (recv_chunks(conn) for _ in range(6))
        except EOFError:  # the scheduler is gone
            return
        for job in changed:
            jobs[job.job_id] = job
        for job_id, seconds in moved:
            jobs[job_id] = jobs[job_id].with_attained(seconds)
        jobs = {job_id: jobs[job_id] for job_id in ids}
        current.update(placed)
        current = {job_id: current[job_id] for job_id in running}
        snapshot = replace(header, devices=devices, ran=tuple(ran), jobs=tuple(jobs.values()))
        try:
            targets, desired = plan_round(snapshot, allocator, current, collocator)
        except Exception as exc:  # the round fails in the scheduler, as in-process
            conn.send(exc)
            continue
        conn.send(None)
        for items in _answer(sent_targets, targets, current, desired):
            send_chunks(conn, items)
        ranks = allocator.priorities() if isinstance(allocator, Ranks) else {}
        send_chunks(conn, list(ranks.items()))  # the reasons quote them (hooks.Ranks)
        conn.send(keeps.outcome() if keeps is not None else None)
        sent_targets = targets


def _at_rest(allocator: Allocator) -> bool:
    """Whether no recomputation runs in a thread: only then may the allocator be copied."""
    return getattr(allocator, "_solving", None) is None


def copy_at_rest(allocator: Allocator) -> Allocator | None:
    """A deep copy of an allocator between decisions; None while a recomputation runs in a
    thread (not at rest) or when a plugin holds what cannot be copied (a lock, a channel)."""
    if not _at_rest(allocator):
        return None
    try:
        return copy.deepcopy(allocator)
    except (TypeError, copy.Error):
        return None


def _pickled_at_rest(allocator: Allocator) -> bytes:
    """The child's allocator pickled (the scheduler's copy of it), or a pickled None."""
    if _at_rest(allocator):
        try:
            return pickle.dumps(allocator)
        except (TypeError, AttributeError, pickle.PicklingError):
            pass
    return pickle.dumps(None)


def _changes(
    sent: Mapping[str, JobSnapshot], jobs: Sequence[JobSnapshot]
) -> tuple[list[JobSnapshot], list[tuple[str, float]]]:
    """The jobs the child must be sent whole, and (job id, attained seconds) of those whose
    attained service alone moved on since it was sent (every running job's, each round:
    sent whole, their pickling and unpickling took 27 ms a round at 2,200 running jobs)."""
    changed: list[JobSnapshot] = []
    moved: list[tuple[str, float]] = []
    for job in jobs:
        before = sent.get(job.job_id)
        if before is job:
            continue
        if before is not None and job.moved_on_from(before):
            moved.append((job.job_id, job.attained_seconds))
        else:
            changed.append(job)
    return changed, moved


def _answer(
    sent_targets: Mapping[str, Target],
    targets: Mapping[str, Target],
    current: Current,
    desired: Mapping[str, Assignment],
) -> tuple[list[str], list[tuple[str, Target]], list[str], list[tuple[str, Assignment]]]:
    """A decision as the scheduler can rebuild it: the targets' job ids in order and the
    targets not as last sent; the desired jobs' ids in order and the assignments other than
    the one the job holds. Sent whole, every running job's target and assignment took 2.3%
    of the scheduler's interpreter to unpickle, and the reconcile compared each assignment
    with the held one device by device (bench/load.py at 1,000 workers)."""
    changed_targets = [(j, t) for j, t in targets.items() if sent_targets.get(j) != t]
    moved = [
        (j, a) for j, a in desired.items() if j not in current or not same_assignment(a, current[j])
    ]
    return list(targets), changed_targets, list(desired), moved


# A round's messages go in pieces of at most this many items: pickling runs in C and holds
# the GIL throughout, and one message of a whole round (5,000 jobs) stalled every RPC of the
# scheduler's for 30-100 ms once a round (bench/load.py, a 5 ms probe thread).
CHUNK = 200


def send_chunks(conn: Connection, items: Sequence[Any]) -> None:
    """`items` as a count of messages, then the messages of CHUNK items each."""
    pieces = [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]
    conn.send(len(pieces))
    for piece in pieces:
        conn.send(piece)


def recv_chunks(conn: Connection) -> list[Any]:
    out: list[Any] = []
    for _ in range(conn.recv()):
        out.extend(conn.recv())
    return out
