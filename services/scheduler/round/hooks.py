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
- `execution_plan`: the runtime's execution plan for the plan a target names
  (`Target.plan`, Rubick's `Plan`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from gearshift.common.rubick.plans import Plan, Zero
from gearshift.scheduler.state.records import JobRecord, WorkerRecord
from gearshift.scheduler.types import Device, Reason, Snapshot, Target
from gearshift.v1 import common_pb2


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
