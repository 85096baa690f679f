"""Plain data that crosses the storage interface: what is recorded and what is read back.

No SQLAlchemy and no protobuf here: the servicer converts messages to these,
the storage backends persist them, the algorithms read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class JobStatus(StrEnum):
    """Last known status of a recorded job."""

    SUBMITTED = "submitted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class EventKind(StrEnum):
    """A lifecycle event of a job."""

    SUBMITTED = "submitted"
    STARTED = "started"
    NODE_STARTED = "node_started"
    NODE_EXITED = "node_exited"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: The job status an ending event leads to.
ENDINGS = {
    EventKind.SUCCEEDED: JobStatus.SUCCEEDED,
    EventKind.FAILED: JobStatus.FAILED,
    EventKind.CANCELLED: JobStatus.CANCELLED,
}


@dataclass(frozen=True)
class NodeInfo:
    """A node of a job: role ("worker" / "ps"), resources, device, status."""

    node_id: str
    role: str
    cpu_cores: float = 0.0
    memory_bytes: int = 0
    accelerator_type: str = ""
    device_count: int = 0
    status: str = ""
    exit_reason: str = ""


@dataclass(frozen=True)
class JobKeys:
    """What a SUBMITTED event records about the job besides its spec."""

    tenant: str
    model_type: str
    dataset_name: str
    num_ests: int
    spec: dict[str, Any]


@dataclass(frozen=True)
class JobEvent:
    """A lifecycle event to record (validated)."""

    event_id: str
    job_id: str
    kind: EventKind
    time: float
    keys: JobKeys | None = None
    node: NodeInfo | None = None
    exit_reason: str = ""


@dataclass(frozen=True)
class Sample:
    """One runtime measurement (validated)."""

    time: float
    step: int
    steps_per_second: float
    accelerator_type: str
    device_count: int
    node_id: str = ""
    samples_per_second: float = 0.0
    cpu_cores_used: float = 0.0
    memory_bytes_used: int = 0
    ests_per_device: tuple[int, ...] = ()


@dataclass(frozen=True)
class JobRow:
    """A recorded job."""

    job_id: str
    tenant: str
    model_type: str
    dataset_name: str
    num_ests: int
    spec: dict[str, Any]
    status: JobStatus
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    exit_reason: str


@dataclass(frozen=True)
class PlanRow:
    """An issued resource plan (the plan as a JSON-able dict)."""

    plan_id: str
    job_id: str
    issued_at: float
    stage: str
    source: str
    plan: dict[str, Any]


@dataclass(frozen=True)
class ProfileRow:
    """A stored layer profile: its key, model type, when, and the profile as plain data
    (gearshift.brain.deeppool.profiles.graph_to_dict) with its digest."""

    key: str
    model_type: str
    stored_at: float
    digest: str
    profile: dict[str, Any]


@dataclass(frozen=True)
class History:
    """A job's record, nodes, samples (oldest first) and plans (oldest first)."""

    job: JobRow
    nodes: list[NodeInfo]
    samples: list[Sample]
    plans: list[PlanRow]


@dataclass(frozen=True)
class JobFilter:
    """Filters of a job listing; empty strings match anything."""

    model_type: str = ""
    dataset_name: str = ""
    tenant: str = ""
    status: str = ""


@dataclass(frozen=True)
class Cursor:
    """Keyset position in the newest-first job listing."""

    submitted_at: float
    job_id: str


@dataclass(frozen=True)
class JobPage:
    """A page of jobs and where the next one starts (None on the last page)."""

    jobs: list[JobRow]
    next: Cursor | None


@dataclass(frozen=True)
class FinishedJob:
    """A similar job that ended, for initial plans: its last plan, nodes and peaks."""

    job: JobRow
    last_plan: dict[str, Any] | None
    nodes: list[NodeInfo]
    memory_peak_by_role: dict[str, int] = field(default_factory=dict)
    steps_per_second: float = 0.0
    device_count: int = 0  # of its last runtime sample: the devices it ended on


@dataclass(frozen=True)
class CapabilitySample:
    """A throughput measured with a known EST mapping."""

    steps_per_second: float
    device_count: int
    ests_per_device: tuple[int, ...]


@dataclass(frozen=True)
class Subject:
    """Whose Rubick model: a job (`kind` "job") or a model key shared by jobs ("model")."""

    kind: str
    key: str

    def __str__(self) -> str:
        return f"job {self.key!r}" if self.kind == "job" else f"model key {self.key!r}"


@dataclass(frozen=True)
class RubickRunRow:
    """A profiled configuration as stored: `config` is gearshift.brain.rubick.config_to_dict's
    plain data, `run_key` its digest; `source` "profile" or "samples"."""

    run_key: str
    config: dict[str, Any]
    iteration_ms: float
    source: str


@dataclass(frozen=True)
class RubickFitRow:
    """A stored fit: Eq. 1's 7 parameters by name, the cluster they price (Env fields), the
    digest of the workload they were fitted for, and what the fit saw."""

    params: dict[str, float]
    cluster: dict[str, float]
    workload_digest: str
    rmsle: float
    run_count: int
    runs_from_samples: int
    offload_runs: int
    fit_seconds: float
    fitted_at: float


@dataclass(frozen=True)
class RubickProfileRow:
    """A subject's stored workload (None: none yet; with its digest) and runs."""

    workload: dict[str, Any] | None
    digest: str
    runs: list[RubickRunRow] = field(default_factory=list)
