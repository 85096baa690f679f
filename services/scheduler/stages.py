"""The allocate and collocate stages the scheduler's settings name: built by the scheduler,
and by the decision process (decider.py) for its own copy."""

from __future__ import annotations

from gearshift.scheduler.allocators import make_allocator
from gearshift.scheduler.brain import BrainAdvisor
from gearshift.scheduler.collocation import Multiplexing
from gearshift.scheduler.guarantees import Guarantees
from gearshift.scheduler.pipeline import Allocator, Collocator
from gearshift.scheduler.rubick_live import LIVE_VARIANTS, make_live_rubick
from gearshift.scheduler.state import SchedulerSettings
from gearshift.scheduler.tenants import TenantsFile


def collocator_for(settings: SchedulerSettings) -> Collocator | None:
    """The collocate stage the settings name (--collocation and its knobs)."""
    if settings.collocation == "deeppool":
        return Multiplexing(settings.min_idle, settings.max_foreground_slowdown)
    return None


def allocator_for(
    settings: SchedulerSettings,
    tenants: TenantsFile | None = None,
    brain: BrainAdvisor | None = None,
) -> Allocator:
    """The allocate stage the settings name (--policy, --elastic and their knobs), with
    guaranteed jobs admitted first when there are tenants' quotas. Rubick's policies
    (gearshift.scheduler.rubick_live) admit guaranteed jobs themselves, against the quotas
    (devices summed over types), and ask the Brain for fitted models."""
    if settings.policy in LIVE_VARIANTS:
        return make_live_rubick(
            settings.policy,
            brain or BrainAdvisor(),
            (lambda: tenants.quotas) if tenants is not None else None,
        )
    policy = make_allocator(
        settings.policy,
        elastic=settings.elastic,
        round_seconds=settings.round_seconds,
        min_recompute_seconds=settings.min_recompute_seconds,
        recompute_in_background=settings.recompute_in_background,
        seed=settings.seed,
        hysteresis=settings.hysteresis,
        preempt_exempt_seconds=settings.preempt_exempt_seconds,
        max_moves_per_round=settings.max_moves_per_round,
        prices=settings.prices,
        entity_weights=settings.tenant_weights,
        entity_policies=settings.tenant_policies,
    )
    if tenants is None:
        return policy
    return Guarantees(policy, lambda: tenants.quotas)
