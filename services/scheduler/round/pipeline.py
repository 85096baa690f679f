"""The scheduling round as a pipeline of named stages, over plain data.

In the manner of the Kubernetes scheduling framework, one round is

    snapshot -> allocate -> collocate -> place -> reconcile

- snapshot: what the round knows - every job not ended (bounds, the types it may
  use, its estimated speed per device type, work left, where it runs now and for
  how long) and every device of every live worker (`Snapshot`). The daemon builds
  it from its state and the simulator from its trace; nothing after this stage
  reads a clock, a database or the network.
- allocate: a policy plugin (`Allocator`) decides each job's `Target`: devices by
  type and ESTs per device, and (Rubick) an execution plan and CPU cores per
  process (later: a background job). Gavel's objectives run in rounds (rigid or elastic),
  EasyScale's greedy allocator and YARN-CS are plugins too
  (gearshift.scheduler.plugins.allocators).
- collocate: pairs a background job with a foreground one (`Collocator`: DeepPool's
  multiplexing, gearshift.scheduler.plugins.deeppool.collocation).
- place: maps targets to devices, consolidating and keeping jobs where they are
  (gearshift.scheduler.round.placement.place).
- reconcile: diffs the desired placements against the actual ones
  (gearshift.scheduler.round.reconcile.diff); the daemon then stops, starts and renews
  tasks, the simulator moves its clock.

Allocate, collocate and place are pure functions of the snapshot (plus the
allocator's own memory of past rounds, as Gavel's mechanism keeps), so the
daemon and `gearshift simulate` share them: `plan_round` is the one call both
make.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from gearshift.common.rubick.plans import Plan
from gearshift.common.rubick.request import Request
from gearshift.scheduler.plugins.easyscale.elastic import ElasticJob
from gearshift.scheduler.plugins.gavel.mechanism import Device
from gearshift.scheduler.plugins.gavel.policies.configs import Config
from gearshift.scheduler.round.placement import Assignment, place


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
    colocated: Mapping[tuple[str, str], float] = field(default_factory=dict)
    # DeepPool: it may run as a background job (best-effort, one device), and the share of
    # its devices' time its burst-parallel plan leaves idle (0: unknown or none).
    background: bool = False
    idle_fraction: float = 0.0
    # Measured: how much slower it ran with a background job beside it (0: not measured).
    collocated_slowdown: float = 0.0
    request: Request | None = None  # Rubick: model, original plan, GPUs, CPUs, guaranteed
    guaranteed: bool = False  # its service class (its tenant's quota may cover it)

    @property
    def rigid(self) -> bool:
        return self.min_devices >= self.max_devices

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

    def elastic_job(self) -> ElasticJob:
        """The elastic model of the job (types it may not use have capability 0)."""
        return ElasticJob(
            job_id=self.job_id,
            num_ests=self.num_ests,
            min_devices=self.min_devices,
            max_devices=self.max_devices,
            capability={t: (c if t in self.types else 0.0) for t, c in self.capability.items()},
            arrival_time=self.arrival_time,
            efficiency=self.efficiency,
            type_efficiency=self.type_efficiency,
            mixing=self.mixing,
            slowdown=self.slowdown,
        )


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


class NoCollocation:
    """No background jobs: targets pass through."""

    def collocate(self, snapshot: Snapshot, targets: Mapping[str, Target]) -> dict[str, Target]:
        return dict(targets)


def plan_round(
    snapshot: Snapshot,
    allocator: Allocator,
    current: Mapping[str, Sequence[tuple[Device, int]]],
    collocator: Collocator | None = None,
) -> tuple[dict[str, Target], dict[str, Assignment]]:
    """allocate -> collocate -> place: the targets and the desired placement of every job
    that gets devices. `current` is where jobs run now."""
    targets = allocator.allocate(snapshot)
    targets = (collocator or NoCollocation()).collocate(snapshot, targets)
    return targets, place(targets, snapshot.devices, current, snapshot.avoid)
