"""The round's hooks: what a plugin may offer the round, named by what it does, never by
the plugin (the round names no plugin: tools/check_imports.py).

- `LearnsModels`: a plugin that fits its jobs' models as they run (Rubick's, from the
  Brain; the allocator, or the execution-plans stage): before a round the round hands it
  the jobs (under the scheduler's lock) and lets it refresh outside the lock, records its
  model notes as PLAN events, and asks whether a job's first start should run its
  profiling run.
- `ChoosesPlans`: the execution-plans stage (profile.executionPlans), after the decision:
  given the targets and the devices the decision placed them on, it returns the targets
  with the execution plan each job should run there (`Target.plan`).
- `Ranks`: an allocate plugin that ranks jobs (Gavel's priorities): the round's reasons
  and queue positions quote them.
- `Explains`: a plugin that knows why it left a job waiting better than the round does (a
  tenant's guarantee): its reasons replace the round's (round/why.py).
- `KeepsDecisionState`: an allocate plugin whose decision reads state the scheduler's
  process keeps (tenants' quotas, reloaded there on SIGHUP; fitted models, refreshed there
  from the Brain): with the decision in a child process (round/decider.py) the
  scheduler's copy ships that state, plain data, to the child's copy before each decision,
  and the child's says back what the scheduler shows of it (the admissions).
- `execution_plan`: the runtime's execution plan for the plan a target names
  (`Target.plan`, Rubick's `Plan`).
- `PlansResources`: a resource-plans provider (DLRover's): before a round it copies its
  asks under the lock and asks outside it; it may cap the devices of a job's next start
  (a history plan) and lift the cap when devices idle; a changed plan may be worth a
  restart; a start that applies a plan is announced by a PLAN event with its text.
- `PlansProcesses`: a process-plan provider, asked by the task control when it starts a
  job: the cores, memory and loader processes of each process (`StartPlan`), or a
  parameter-server job's processes, and what the job's row keeps of them.

The service wires the implementations in (built from the plugin registry); the round and
the task control know only these protocols and their plain data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from gearshift.common.rubick.plans import Plan, Zero
from gearshift.scheduler.state.records import JobRecord, WorkerRecord
from gearshift.scheduler.types import Device, Reason, Snapshot, Target
from gearshift.v1 import common_pb2

if TYPE_CHECKING:
    from gearshift.scheduler.state.state import SchedulerState


@runtime_checkable
class LearnsModels(Protocol):
    """A plugin that learns its jobs' models while they run (see the module docstring)."""

    def prepare(
        self, jobs: Sequence[JobRecord], workers: Sequence[WorkerRecord]
    ) -> Callable[[float], None]:
        """Under the scheduler's lock: copy what it needs of the jobs and workers; the
        refresh it returns is called outside the lock with the round's time (RPCs)."""
        ...

    def new_notes(self, job_ids: Sequence[str]) -> dict[str, str]:
        """The model notes of these jobs that changed since last asked (their events)."""
        ...

    def wants_profile(self, job_id: str) -> bool:
        """Whether the job's first start should run the profiling run its model needs."""
        ...


@runtime_checkable
class ChoosesPlans(LearnsModels, Protocol):
    """The execution-plans stage (see the module docstring)."""

    def choose(
        self,
        targets: Mapping[str, Target],
        desired: Mapping[str, Sequence[tuple[Device, int]]],
        current: Mapping[str, Sequence[tuple[Device, int]]],
    ) -> dict[str, Target]:
        """The targets, each job's plan chosen on its `desired` devices (`current`: where
        the running jobs are now)."""
        ...


@runtime_checkable
class Ranks(Protocol):
    """An allocator that ranks jobs each round."""

    def priorities(self) -> Mapping[str, float]:
        """Each job's priority in its last round (higher goes first; absent: not ranked)."""
        ...


@runtime_checkable
class Explains(Protocol):
    """A plugin that says why it left jobs waiting."""

    def reasons(self, snapshot: Snapshot, targets: Mapping[str, Target]) -> dict[str, Reason]:
        """Its reasons for the jobs of `snapshot` that `targets` (its last decision) leaves
        without devices; the others keep the round's."""
        ...


@runtime_checkable
class KeepsDecisionState(Protocol):
    """An allocator whose decision may run in a child process (see the module docstring)."""

    def shipment(self) -> object:
        """In the scheduler's process, before a decision: what the child's copy needs
        (picklable plain data; sent only when it differs from the last one sent)."""
        ...

    def take(self, shipment: object) -> None:
        """In the child: the scheduler's `shipment`, before the decision."""
        ...

    def outcome(self) -> object:
        """In the child, after a decision: what the scheduler's copy is to hold of it."""
        ...

    def told(self, outcome: object) -> None:
        """In the scheduler's process: the child's `outcome` of the last decision."""
        ...


def execution_plan(
    plan: Plan, current: common_pb2.ExecutionPlan | None = None
) -> common_pb2.ExecutionPlan:
    """The runtime's plan for Rubick's `plan` (threads per process kept from `current`);
    ValueError for a plan the runtime cannot execute (TP, PP, ZeRO-DP)."""
    if plan.tp > 1 or plan.pp > 1 or plan.zero is Zero.DP:
        raise ValueError(f"the runtime cannot execute plan {plan.label}: TP, PP and ZeRO-DP")
    out = common_pb2.ExecutionPlan()
    if current is not None:
        out.CopyFrom(current)
    out.gradient_checkpointing = plan.gc
    out.offload_optimizer = plan.zero is Zero.OFFLOAD
    return out


@dataclass(frozen=True)
class CapView:
    """A job as a round found its devices, for a provider's device caps (plain data)."""

    job_id: str
    cap: int  # the devices its plan caps it to; 0: none
    held: int  # devices it holds now; 0: it waits
    most: int  # its spec's most devices (max_devices, at most num_ests)
    types: frozenset[str]  # the accelerator types it may run on; empty: any


@dataclass(frozen=True)
class StartPlan:
    """What each process of a job's start runs with (0: the default, its worker's share),
    and the plans its row keeps so that a restarted scheduler need not plan it afresh."""

    cpu_cores: int = 0  # per process, within its worker's share
    memory_bytes: int = 0
    loader_procs: int = 0
    ps: common_pb2.ParameterServerPlan | None = None  # a parameter-server job's processes
    ps_cores: float = 0.0  # the cores a PS job's launcher asks (at most its slot's)
    process_plan: str = ""  # JobRecord.process_plan: the stored data-parallel plan
    ps_plan: str = ""  # JobRecord.ps_plan ("": left as it is)


class PlansProcesses(Protocol):
    """A process-plan provider (see the module docstring)."""

    def start_plan(self, job: JobRecord) -> StartPlan:
        """Under the lock: what each process of the job's next start runs with."""
        ...


@runtime_checkable
class PlansResources(Protocol):
    """A resource-plans provider (see the module docstring)."""

    def prepare(
        self,
        state: SchedulerState,
        jobs: Sequence[JobRecord],
        restart_seconds: Callable[[str], float],
    ) -> Callable[[], None]:
        """Under the scheduler's lock: copy what the asks need of the jobs (and of the
        state's workers and measurements); the refresh it returns asks outside the lock."""
        ...

    def device_cap(self, job_id: str) -> int:
        """The devices the job's next start is capped to (0: none)."""
        ...

    def caps(self) -> Mapping[str, int]:
        """Every capped job: job id -> its cap."""
        ...

    def lift_caps(self, jobs: Sequence[CapView], idle: Mapping[str, int]) -> list[str]:
        """Lift the caps that leave devices idle (`idle`: free devices by type; `jobs`: the
        capped jobs and those waiting, at least); the jobs lifted."""
        ...

    def restart_reason(self, job_id: str) -> str | None:
        """Why the job, keeping its devices, is restarted for a new plan (None: it is not)."""
        ...

    def started(self, job_id: str) -> Sequence[str]:
        """The job (re)started on its plans: the PLAN events' texts of those not yet
        announced (none: nothing new)."""
        ...

    def recover(self, job: JobRecord) -> None:
        """A restarted scheduler: the plans the job's row keeps, back in memory."""
        ...

    def forget(self, job_id: str) -> None: ...
