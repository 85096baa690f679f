"""The types every stage of the round shares: the bottom of the scheduler.

A device, a configuration (devices per type), what the round knows (`Snapshot`,
`JobSnapshot`, `Ran`), what it decides (`Target`, `Assignment`), the two plugin
protocols of the pipeline (`Allocator`, `Collocator`), and the plugins' settings that the
scheduler's settings carry (`EntityPolicy`, `StragglerPolicy`). Plain data: this module imports no
other module of gearshift.scheduler (tools/check_imports.py), so the round, the state, the
plugins and the simulator can all build on it without a cycle.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, get_args

from gearshift.common.rubick.plans import Plan
from gearshift.common.rubick.request import Request


@dataclass(frozen=True, order=True)
class Device:
    """One accelerator: the worker (server) that has it, its index there, its type."""

    worker_id: str
    index: int
    worker_type: str


Config = tuple[tuple[str, int], ...]


def config_of(devices: Mapping[str, int]) -> Config:
    """The canonical (hashable) form of a device count per type: sorted, zeros dropped."""
    return tuple(sorted((t, int(n)) for t, n in devices.items() if n > 0))


def config_size(config: Config) -> int:
    return sum(n for _, n in config)


Assignment = list[tuple[Device, int]]


@dataclass(frozen=True)
class JobSnapshot:
    """What the round knows of one job. Work is counted in mini-batches (one EST's step):
    `steps_remaining`, `capability` and `throughputs` share that unit."""

    job_id: str
    num_ests: int
    min_devices: int
    max_devices: int
    types: tuple[str, ...]  # accelerator types it may use now (its spec, its D0/D1 lock)
    capability: Mapping[str, float]  # one EST's mini-batches/s on one device of each type
    throughputs: Mapping[str, float]  # mini-batches/s on max_devices devices of each type
    steps_remaining: float
    arrival_time: float
    mixing: bool = False  # may span several types in one placement (D2)
    efficiency: Mapping[int, float] = field(default_factory=dict)
    type_efficiency: Mapping[str, Mapping[int, float]] = field(default_factory=dict)
    slowdown: float = 1.0
    priority_weight: float = 1.0
    deadline: float = math.inf
    entity: str = "default"
    current: Config = ()  # devices per type it holds now (empty: not running)
    attained_seconds: float = 0.0  # time it has run so far, anywhere
    placed_at: float = -math.inf  # when its current placement started (-inf: not known)
    restart_seconds: float = 0.0  # what a checkpoint-and-restart costs it
    # What a resize that keeps its devices costs it, applied in place (round.rescaleInPlace;
    # None: such a resize restarts too, at restart_seconds)
    resize_seconds: float | None = None
    colocated: Mapping[tuple[str, str], float] = field(default_factory=dict)
    # DeepPool: it may run as a background job (best-effort, one device), and the share of
    # its devices' time its burst-parallel plan leaves idle (0: unknown or none).
    background: bool = False
    idle_fraction: float = 0.0
    # Measured: how much slower it ran with a background job beside it (0: not measured).
    collocated_slowdown: float = 0.0
    partners: tuple[str, ...] = ()  # the jobs it shares its devices with now (its pairing)
    request: Request | None = None  # Rubick: model, original plan, GPUs, CPUs, guaranteed
    guaranteed: bool = False  # its service class (its tenant's quota may cover it)

    @property
    def rigid(self) -> bool:
        return self.min_devices >= self.max_devices

    def change_seconds(self, keeps_devices: bool) -> float:
        """What a change of its devices costs: in place when it keeps the devices it holds
        (a grow; a shrink keeps some) and the job can change in place, else a restart."""
        if keeps_devices and self.resize_seconds is not None:
            return self.resize_seconds
        return self.restart_seconds

    def with_attained(self, seconds: float) -> JobSnapshot:
        """A copy with its attained service moved on, the other fields the same objects (as
        `dataclasses.replace` gives): every running job's, each round. Built without
        `__init__`, whose frozen field-by-field assignment made it 17 us a job, 37 ms a round
        at 2,200 running jobs (this: 2 us)."""
        new = object.__new__(type(self))
        fields = new.__dict__
        fields.update(self.__dict__)
        fields["attained_seconds"] = seconds
        return new

    def moved_on_from(self, before: JobSnapshot) -> bool:
        """Whether this is `before` with at most its attained service changed: what was
        worked out from `before` (its model, its configurations) still holds. Compared in C
        (a dict of the fields), 3 us a job."""
        return vars(self) == {**vars(before), "attained_seconds": self.attained_seconds}


@dataclass(frozen=True)
class Ran:
    """Accounting: a job ran `seconds` in `config` since the previous round (it may have
    ended since)."""

    job_id: str
    config: Config
    seconds: float


@dataclass(frozen=True)
class Snapshot:
    """Everything a round decides from. Jobs are in arrival order."""

    now: float
    devices: tuple[Device, ...]
    jobs: tuple[JobSnapshot, ...]
    ran: tuple[Ran, ...] = ()
    avoid: frozenset[str] = frozenset()  # degraded workers: placed on only when nothing else fits

    @property
    def capacity(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for device in self.devices:
            out[device.worker_type] = out.get(device.worker_type, 0) + 1
        return out

    @property
    def worker_types(self) -> list[str]:
        return sorted(self.capacity)

    def job(self, job_id: str) -> JobSnapshot:
        for job in self.jobs:
            if job.job_id == job_id:
                return job
        raise KeyError(job_id)

    @property
    def newcomer_waits(self) -> bool:
        """Whether a job that never ran waits: residencies then yield to it
        (round/restart_cost)."""
        return any(not job.current and job.attained_seconds <= 0 for job in self.jobs)


@dataclass(frozen=True)
class Reason:
    """Why a round left a job waiting, or moved or preempted it: `code` (the metric's label),
    the `facts` it rests on, and the sentence users read. `subject` is what it names (a
    tenant, a job, the types): a new code or subject is a new event, new counts are not."""

    code: str
    message: str
    facts: Mapping[str, str] = field(default_factory=dict)
    subject: str = ""

    def same_as(self, other: Reason | None) -> bool:
        return other is not None and (self.code, self.subject) == (other.code, other.subject)


@dataclass(frozen=True)
class RescaleCost:
    """Measured rescales: seconds from the decision to the first step of the new placement
    (state/rescale_costs.py measures them, per job and per model type)."""

    count: int
    last_s: float
    mean_s: float

    def plus(self, seconds: float) -> RescaleCost:
        """With one more measured rescale."""
        count = self.count + 1
        return RescaleCost(count, seconds, self.mean_s + (seconds - self.mean_s) / count)


Role = Literal["", "shared", "foreground", "background"]


@dataclass(frozen=True)
class Target:
    """What a job should run on: devices per type and ESTs per device (per type, in the
    order the place stage assigns devices). `partners` are jobs sharing the same devices:
    in `role` "shared" at equal priority (Gavel's space sharing), or a "foreground" job
    lending its devices' idle time to a "background" one (DeepPool); "" alone. `plan` is
    the execution plan to run (Rubick; None: the job's own) and `cpus_per_device` the CPU
    cores each process gets (0: the default). `workers` pins the devices per worker the
    allocator chose (Rubick: its speed, and so its guarantee, depends on the GPUs per
    node); empty leaves the choice to the place stage."""

    job_id: str
    devices: Config
    ests: Mapping[str, tuple[int, ...]]
    partners: tuple[str, ...] = ()
    role: Role = ""
    plan: Plan | None = None
    cpus_per_device: int = 0
    workers: tuple[tuple[str, int], ...] = ()

    @property
    def size(self) -> int:
        return sum(n for _, n in self.devices)


class Allocator(Protocol):
    """The allocate stage: a policy plugin."""

    @property
    def name(self) -> str:
        """The policy's name (logs, results)."""
        ...

    @property
    def replans_on_events(self) -> bool:
        """Whether to re-plan at arrivals and completions, not only at rounds."""
        ...

    def allocate(self, snapshot: Snapshot) -> dict[str, Target]:
        """Each job's target; jobs that get nothing are left out."""
        ...


class Collocator(Protocol):
    """The collocate stage: adds background jobs to targets (DeepPool)."""

    def collocate(self, snapshot: Snapshot, targets: Mapping[str, Target]) -> dict[str, Target]:
        """Targets with collocated jobs added."""
        ...


EntityPolicy = Literal["fairness", "fifo"]  # how a tenant shares among its jobs (Gavel)


@dataclass(frozen=True)
class StragglerPolicy:
    """The straggler detection's arguments (plugins/dlrover/stragglers.py; the profile's
    stragglers point)."""

    margin: float = 0.5  # slow: above (1 + margin) x the median of the other processes
    reports: int = 3  # consecutive slow reports that make a straggler (and normal: recovered)
    clear_seconds: float = 300.0  # a degraded mark lasts this long without a new verdict
    min_gap_s: float = 0.01  # and slower by at least this many seconds a step

    def check(self) -> None:
        """ValueError naming the flag of a bad value."""
        if not self.margin > 0:
            raise ValueError(f"--straggler-margin must be > 0 (got {self.margin})")
        if self.reports < 1:
            raise ValueError(f"--straggler-reports must be >= 1 (got {self.reports})")
        if not self.clear_seconds > 0:
            raise ValueError(f"--straggler-clear-seconds must be > 0 (got {self.clear_seconds})")


Surplus = Literal["speedup", "shortest"]


@dataclass(frozen=True)
class LasShares:
    """How elastic LAS divides the devices (plugins/gavel/policies/max_min_fairness.py):
    every job keeps at least `fair_share` of the max-min level, and the rest goes by
    `surplus`. The defaults are Gavel's LAS followed by our shortest-first spending; the
    default profile's are in plugins.registry.LasArgs."""

    fair_share: float = 1.0
    surplus: Surplus = "shortest"

    def __post_init__(self) -> None:
        if not 0.0 <= self.fair_share <= 1.0:
            raise ValueError(f"fair_share must be within [0, 1], got {self.fair_share}")
        if self.surplus not in get_args(Surplus):
            raise ValueError(f"surplus must be speedup or shortest, got {self.surplus!r}")
