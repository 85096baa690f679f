"""The records the scheduler keeps: jobs, their events, workers, tasks. Plain dataclasses
over the contracts' messages, below the stores (store.py, memory_store.py) and the batched
writes they share (write_batch.py), so that none of those imports another in a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gearshift.common.facts import ENDED_TASK_STATES, TERMINAL_STATES
from gearshift.scheduler.types import Reason, RescaleCost
from gearshift.v1 import common_pb2


@dataclass
class JobRecord:
    """A job as the scheduler keeps it."""

    job_id: str
    spec: common_pb2.JobSpec
    state: int
    submitted_at: float
    idempotency_key: str | None = None
    started_at: float = 0.0
    finished_at: float = 0.0
    progress: common_pb2.JobProgress = field(default_factory=common_pb2.JobProgress)
    # Replaced, never changed in place: readers outside the scheduler's lock (a round's
    # gather, GetClusterState) take the reference and read a placement that stays whole.
    placement: common_pb2.Placement = field(default_factory=common_pb2.Placement)
    generation: int = 0
    rescale_count: int = 0
    restart_count: int = 0  # resumptions after a failed task, bounded by --max-restarts
    locked_type: str = ""  # D0/D1: the only accelerator type the job may run on (once placed)
    message: str = ""
    final_digest: str = ""
    last_sequence: int = 0
    # The execution plan of the job's current (or last) placement; default: all off, one
    # thread. Stored (migration 0008): a restarted scheduler resumes the job on it.
    plan: common_pb2.ExecutionPlan = field(default_factory=common_pb2.ExecutionPlan)
    # The resource plan its placement runs: a data-parallel job's per-process resources,
    # or a PS job's counts and cores; and a PS job's plan a user pinned until `gearshift
    # scale --auto` (gearshift.scheduler.plugins.dlrover.plan_book.dump's JSON; "": none). Stored
    # (migration 0009): a restarted scheduler keeps them.
    process_plan: str = ""
    ps_plan: str = ""
    ps_pin: str = ""
    # Not stored: each round decides them again, and heartbeats say whether it is paused.
    collocation: common_pb2.Collocation = field(default_factory=common_pb2.Collocation)
    paused: bool = False
    # The resource plan its placement started with, in words (not stored).
    resource_plan: str = ""
    # Why the last round left it waiting, moved or preempted it (round/why.py), since when,
    # its place in the round's queue while it waits (0: not waiting), and when the
    # simulator expects it to start (0: no estimate). Not stored: each round decides them
    # again; the changes of reason are stored as REASON events.
    reason: Reason | None = None
    reason_since: float = 0.0
    queue_position: int = 0
    estimated_start: float = 0.0
    # Its rescales' measured cost, decision to first step (state/rescale_costs.py; not
    # stored: a restarted scheduler measures again).
    rescale_cost: RescaleCost | None = None  # by checkpoint and restart
    in_place_rescale_cost: RescaleCost | None = None  # in place (round.rescaleInPlace)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(frozen=True)
class EventRecord:
    """One lifecycle event of a job."""

    job_id: str
    sequence: int
    time: float
    type: int
    state: int
    message: str = ""
    progress: common_pb2.JobProgress | None = None
    placement: common_pb2.Placement | None = None


@dataclass
class WorkerRecord:
    """A registered worker daemon."""

    worker_id: str
    address: str
    hostname: str
    devices: list[common_pb2.DeviceGroup]
    alive: bool
    registered_at: float
    last_heartbeat_at: float
    cpu_cores: int = 0  # as registered; kept in memory only (a worker registers again)
    memory_bytes: int = 0
    # Degraded: a straggler ran on it (gearshift.scheduler.plugins.dlrover.stragglers); in memory
    # only.
    degraded_reason: str = ""
    degraded_at: float = 0.0  # time of its latest slow verdict


@dataclass
class TaskRecord:
    """A job's processes on one worker for one placement generation."""

    task_id: str
    job_id: str
    worker_id: str
    generation: int
    state: int
    local_ranks: tuple[int, ...]
    rendezvous_address: str
    lease_expires_at: float
    created_at: float
    ended_at: float = 0.0
    checkpoint_path: str = ""
    message: str = ""
    last_listed_at: float = 0.0  # when its worker last listed it (in memory only)

    @property
    def ended(self) -> bool:
        return self.state in ENDED_TASK_STATES
