"""The allocate, collocate and execution-plans stages the scheduler's settings name, built
from the plugin registry (gearshift.scheduler.plugins.registry): by the scheduler, and (the
first two) by the decision process (decider.py) for its own copy."""

from __future__ import annotations

from gearshift.scheduler.plugins.registry import Can, Point, capabilities, plugin
from gearshift.scheduler.plugins.rubick.guarantees import Guarantees
from gearshift.scheduler.plugins.rubick.tenants import TenantsFile
from gearshift.scheduler.round.brain import BrainAdvisor
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
    found = plugin(Point.ALLOCATE, settings.policy)
    if found is None or found.build is None:
        raise ValueError(f"profile.allocate: no allocate plugin {settings.policy!r}")
    quotas = (lambda: tenants.quotas) if tenants is not None else None
    admits = Can.ADMITS_TENANTS in capabilities(Point.ALLOCATE, settings.policy)
    allocator: Allocator = found.build(
        settings, quotas if admits else None, brain or BrainAdvisor()
    )
    if tenants is None or admits:
        return allocator
    return Guarantees(allocator, lambda: tenants.quotas)
