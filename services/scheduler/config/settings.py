"""SchedulerSettings from a validated configuration: what the scheduler's parts read.

The file is the surface (typed, per plugin); the settings are the flat record the round,
the state and the decision process share. This is the one place that maps one onto the
other.
"""

from __future__ import annotations

from gearshift.scheduler.config.configuration import Loaded
from gearshift.scheduler.plugins.gavel.prices import GAVEL_PRICES
from gearshift.scheduler.plugins.registry import (
    Can,
    CostArgs,
    DeepPoolArgs,
    DlroverArgs,
    GuaranteesArgs,
    HierarchicalArgs,
    LasArgs,
    ObjectiveArgs,
    Point,
    RestartArgs,
    RubickPlansArgs,
    StragglerArgs,
)
from gearshift.scheduler.state.state import SchedulerSettings
from gearshift.scheduler.types import LasShares, StragglerPolicy


def settings_of(loaded: Loaded) -> SchedulerSettings:
    """The scheduler's settings from a validated configuration."""
    c = loaded.config
    allocate = loaded.plugin_args(Point.ALLOCATE)
    objective = allocate if isinstance(allocate, ObjectiveArgs) else None
    collocate = loaded.plugin_args(Point.COLLOCATE)
    plans = loaded.plugin_args(Point.PLANS)
    execution = loaded.plugin_args(Point.EXECUTION_PLANS)
    # An allocator that chooses plans itself (Rubick's) leaves the stage off.
    chooses = Can.CHOOSES_PLANS in loaded.can(Point.ALLOCATE)
    rubick_plans = execution if isinstance(execution, RubickPlansArgs) else RubickPlansArgs()
    tenants = loaded.plugin_args(Point.TENANTS)
    stragglers = loaded.plugin_args(Point.STRAGGLERS)
    assert isinstance(stragglers, StragglerArgs)
    deeppool = collocate if isinstance(collocate, DeepPoolArgs) else DeepPoolArgs()
    restart = allocate.restart_cost() if isinstance(allocate, RestartArgs) else None
    return SchedulerSettings(
        policy=loaded.name(Point.ALLOCATE),
        elastic=bool(objective and objective.elastic),
        hysteresis=objective.hysteresis if objective else 0.1,
        min_recompute_seconds=objective.min_recompute_seconds if objective else 0.0,
        recompute_in_background=bool(objective and objective.in_background),
        prices={**GAVEL_PRICES, **(allocate.prices if isinstance(allocate, CostArgs) else {})},
        tenant_weights=dict(allocate.weights) if isinstance(allocate, HierarchicalArgs) else {},
        tenant_policies=dict(allocate.policies) if isinstance(allocate, HierarchicalArgs) else {},
        round_seconds=c.round.seconds,
        event_rounds=c.round.event_rounds,
        event_round_gap=c.round.event_round_gap,
        max_starts_per_round=c.round.max_starts,
        max_moves_per_round=c.round.max_moves,
        rescale_in_place=c.round.rescale_in_place,
        preempt_exempt_seconds=c.round.preempt_exempt_seconds,
        decision_process=loaded.decision_process,
        seed=c.round.seed,
        estimate_starts_seconds=c.round.estimate_starts_seconds,
        heartbeat_interval=c.heartbeats.interval_seconds,
        heartbeat_timeout=c.heartbeats.timeout_seconds,
        estimate_refresh_seconds=c.estimates.refresh_seconds,
        restart_seconds=c.estimates.restart_seconds,
        in_place_seconds=c.estimates.in_place_seconds,
        restart_cost=restart,
        las=allocate.shares() if isinstance(allocate, LasArgs) else LasShares(),
        max_queued_jobs=c.limits.max_queued_jobs,
        max_restarts=c.limits.max_restarts,
        stop_timeout_seconds=c.limits.stop_timeout_seconds,
        brain_address=c.cluster.brain_address,
        shard_manager_address=c.cluster.shard_manager_address,
        checkpoint_root=c.cluster.checkpoint_root,
        rendezvous_port_base=c.cluster.rendezvous_port_base,
        collocation="none"
        if Can.OFF in loaded.can(Point.COLLOCATE)
        else loaded.name(Point.COLLOCATE),
        amp_limit=deeppool.amp_limit,
        min_idle=deeppool.min_idle,
        max_foreground_slowdown=deeppool.max_foreground_slowdown,
        execution_plans="none"
        if chooses or Can.OFF in loaded.can(Point.EXECUTION_PLANS)
        else loaded.name(Point.EXECUTION_PLANS),
        plan_min_gain=rubick_plans.min_gain,
        plan_profile=rubick_plans.profile,
        plans=loaded.name(Point.PLANS),
        plan_interval=plans.interval_seconds if isinstance(plans, DlroverArgs) else 0.0,
        tenants_file=tenants.file if isinstance(tenants, GuaranteesArgs) else "",
        stragglers=StragglerPolicy(stragglers.margin, stragglers.reports, stragglers.clear_seconds),
    )
