"""The stages the scheduler's settings name, built from the plugin registry
(gearshift.scheduler.plugins.registry): the allocate and collocate stages, by the scheduler
and by the decision process (round/decider.py) for its own copy; the execution-plans stage;
the plans point's provider of the round's hooks (round/hooks.py). The round and the state
import none of this: the service wires what is built here in (tools/check_imports.py)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor

from gearshift.scheduler.plugins.dlrover.plans_hooks import DlroverPlans
from gearshift.scheduler.plugins.registry import (
    Can,
    GuaranteesArgs,
    Point,
    capabilities,
    decision_process_refusals,
    plugin,
)
from gearshift.scheduler.plugins.rubick.guarantees import Guarantees
from gearshift.scheduler.plugins.rubick.tenants import Quotas, TenantsFile
from gearshift.scheduler.round.brain import BrainAdvisor
from gearshift.scheduler.round.decider import DecisionProcess
from gearshift.scheduler.round.hooks import ChoosesPlans
from gearshift.scheduler.state.state import SchedulerSettings
from gearshift.scheduler.types import Allocator, Collocator


def collocator_for(settings: SchedulerSettings) -> Collocator | None:
    """The collocate stage the settings name (profile.collocate and its arguments)."""
    found = plugin(Point.COLLOCATE, settings.collocation)
    if found is None or found.build is None:
        return None
    collocator: Collocator = found.build(settings)
    return collocator


def execution_plans_for(settings: SchedulerSettings, brain: BrainAdvisor) -> ChoosesPlans | None:
    """The execution-plans stage the settings name (profile.executionPlans); None when off
    or without a Brain (its fits come from there)."""
    found = plugin(Point.EXECUTION_PLANS, settings.execution_plans)
    if found is None or found.build is None or not brain.address:
        return None
    stage: ChoosesPlans = found.build(settings, brain)
    return stage


def allocator_for(
    settings: SchedulerSettings,
    tenants: TenantsFile | None = None,
    brain: BrainAdvisor | None = None,
) -> Allocator:
    """The allocate stage the settings name (profile.allocate), with guaranteed jobs admitted
    first when there are tenants' quotas; a plugin that admits tenants itself (Rubick's) is
    handed the quotas instead."""
    quotas = (lambda: tenants.quotas) if tenants is not None else None
    return _allocator(settings, quotas, brain or BrainAdvisor())


def _allocator(
    settings: SchedulerSettings, quotas: Callable[[], Quotas] | None, brain: BrainAdvisor
) -> Allocator:
    found = plugin(Point.ALLOCATE, settings.policy)
    if found is None or found.build is None:
        raise ValueError(f"profile.allocate: no allocate plugin {settings.policy!r}")
    admits = Can.ADMITS_TENANTS in capabilities(Point.ALLOCATE, settings.policy)
    allocator: Allocator = found.build(settings, quotas if admits else None, brain)
    if quotas is None or admits:
        return allocator
    return Guarantees(allocator, quotas)


def decision_stages(settings: SchedulerSettings) -> tuple[Allocator, Collocator | None]:
    """The decision process's own allocate and collocate stages (module level: the spawned
    child is handed this function by name). No Brain and no tenants file here: what its
    allocator needs of them, the scheduler's copy ships (round/hooks.KeepsDecisionState);
    until then, no quotas."""
    quotas = Quotas if settings.tenants_file else None
    return _allocator(settings, quotas, BrainAdvisor()), collocator_for(settings)


def check_decision_process(settings: SchedulerSettings) -> None:
    """Only plugins a child can run alone: the registry's rule, which the file's
    round.decisionProcess check asks too (the place stage is consolidate's, which every
    child runs)."""
    chosen = [
        (Point.ALLOCATE, settings.policy, None),
        (Point.COLLOCATE, settings.collocation, None),
        (Point.TENANTS, "guarantees", GuaranteesArgs(file=settings.tenants_file)),
    ]
    refused = [
        f"profile.{p.value} {name} ({why})" for p, name, why in decision_process_refusals(chosen)
    ]
    if refused:
        raise ValueError("decision process: cannot run " + "; ".join(refused))


def decider_for(settings: SchedulerSettings, allocator: Allocator) -> DecisionProcess | None:
    """The decision process the settings ask for (None: the round decides in-process);
    `allocator`, the scheduler's own, ships it what it keeps."""
    if not settings.decision_process:
        return None
    check_decision_process(settings)
    return DecisionProcess(settings, decision_stages, allocator)


def plans_for(
    settings: SchedulerSettings,
    brain: BrainAdvisor,
    clock: Callable[[], float],
    pool: Executor | None = None,
) -> DlroverPlans:
    """The plans point's provider (profile.plans): the round's resource plans and the task
    control's process plans."""
    found = plugin(Point.PLANS, settings.plans)
    if found is None or found.build is None:
        raise ValueError(f"profile.plans: no plans plugin {settings.plans!r}")
    plans: DlroverPlans = found.build(settings, brain, clock, pool)
    return plans
