"""One registry of the scheduler's plugins: what fills each extension point of a round.

As in the Kubernetes scheduler framework, a round is a cycle of named extension points
(allocate, collocate, place, executionPlans, plans, tenants, stragglers) and each point is
filled by one plugin of the profile. Every plugin registers once, here: its name, the class
of its typed arguments (pydantic, so that the configuration file is validated by the same
class the docs are generated from), what it can do, and the factory that builds it. The daemon, the
decision process and the simulator ask this registry, and only this registry, what a name
means: no module outside a plugin tests a policy's name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from gearshift.scheduler.plugins.allocators import make_allocator
from gearshift.scheduler.plugins.deeppool.collocation import Multiplexing
from gearshift.scheduler.plugins.dlrover.plans_hooks import make_plans
from gearshift.scheduler.plugins.gavel.policies import (
    describe,
    elastic_refusal,
    policy_names,
    traits,
)
from gearshift.scheduler.plugins.rubick.plan_choice import make_rubick_plans
from gearshift.scheduler.plugins.rubick.rubick_live import make_live_rubick
from gearshift.scheduler.round.restart_cost import RestartCost
from gearshift.scheduler.types import LasShares, Surplus


class Point(StrEnum):
    """The extension points of a round, in the order a round visits them."""

    ALLOCATE = "allocate"
    COLLOCATE = "collocate"
    PLACE = "place"
    EXECUTION_PLANS = "execution_plans"
    PLANS = "plans"
    TENANTS = "tenants"
    STRAGGLERS = "stragglers"

    @property
    def key(self) -> str:
        """The point's key in the configuration file (camelCase)."""
        return to_camel(self.value)


class Can(StrEnum):
    """What a plugin can do, for the checks that two plugins work together."""

    ELASTIC = "elastic"  # gives elastic jobs any device count within their bounds
    SPACE_SHARING = "space-sharing"  # pairs jobs on a device
    NEEDS_BRAIN = "needs-brain"  # asks the Brain (fitted models, plans, profiles)
    DECISION_PROCESS = "decision-process"  # can decide in the scheduler's child process
    ADMITS_TENANTS = "admits-tenants"  # admits guaranteed jobs against quotas itself
    CHOOSES_PLANS = "chooses-plans"  # chooses each job's execution plan itself
    OFF = "off"  # the point does nothing


class Args(BaseModel):
    """A plugin's arguments: camelCase keys in the file, unknown keys refused."""

    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )


class NoArgs(Args):
    """This plugin takes no arguments."""


class RestartArgs(Args):
    """How an allocator weighs a move against its restart (round/restart_cost.py)."""

    restart_aware: bool = Field(
        True,
        description="a running job is started elsewhere, resized or preempted only when the "
        "gain over its horizon exceeds its restart seconds, and a new placement is kept for "
        "its residency; false: moves are free, as in Gavel's and EasyScale's papers",
    )
    residency: float = Field(
        30.0,
        ge=0,
        description="restartAware: a placement is kept at least this many times its job's "
        "restart seconds, a restart counted one round at most (Gavel's time-fraction "
        "priorities do not flip it out sooner; rounds shorter than a restart still share "
        "devices)",
    )
    horizon_seconds: float = Field(
        3600.0,
        gt=0,
        description="restartAware: the most seconds of a job's expected remaining time over "
        "which a move's gain is counted against its restart",
    )

    def restart_cost(self) -> RestartCost | None:
        """The rule these arguments ask for (None: moves are free)."""
        if not self.restart_aware:
            return None
        return RestartCost(self.residency, self.horizon_seconds)


class GreedyArgs(RestartArgs):
    """EasyScale's greedy allocator: it starts from the current placement when restart-aware."""


class ObjectiveArgs(RestartArgs):
    """A Gavel objective solved over the allocation matrix, in Gavel's rounds."""

    elastic: bool = Field(
        True,
        description="jobs are elastic: the objective allocates over device configurations "
        "(counts and, for D2 jobs, mixes of types) instead of Gavel's rigid scale factors",
    )
    hysteresis: float = Field(
        0.1, ge=0, description="elastic: least relative gain for which a running job is resized"
    )
    min_recompute_seconds: float = Field(
        30.0,
        ge=0,
        description="least time between recomputations of the allocation (0: every round "
        "after a change); Gavel's simulator uses 1920",
    )
    recompute_in_background: bool | None = Field(
        None,
        description="elastic: a recomputation after the first is solved on a thread of its "
        "own while the rounds go on with the allocation in force (Gavel's allocation thread); "
        "default: when elastic",
    )

    realloc_factor: bool = Field(
        False,
        description="restartAware, elastic: Sia's re-allocation factor, "
        "(age - restarts x restart) / (age + restart): a running job's current configuration "
        "is preferred that much more in its priorities, and its rate on another one counts "
        "that many times when a grow, move or shrink is weighed, so a job whose restarts "
        "ate its time resists the next one",
    )

    share_multiple: float = Field(
        8.0,
        ge=0,
        description="restartAware, rigid (elastic: false): the devices are re-shared (the "
        "allocation recomputed, jobs preempted for others) at most every this many times the "
        "jobs' mean restart seconds, and rounds in between only start jobs on free devices: "
        "8 x 57 s is 7.6 minutes, near Gavel's 6-minute rounds, so shorter rounds add starts, "
        "not flips (0: every round)",
    )

    def restart_cost(self) -> RestartCost | None:
        """The rule, with Sia's re-allocation factor when asked (ElasticRounds) and the share
        period (GavelRounds)."""
        rule = super().restart_cost()
        if rule is None:
            return None
        return replace(rule, realloc_factor=self.realloc_factor, share_multiple=self.share_multiple)

    @property
    def in_background(self) -> bool:
        return (
            self.elastic if self.recompute_in_background is None else self.recompute_in_background
        )


class LasArgs(ObjectiveArgs):
    """LAS (the default profile's objective). Elastic, it guarantees each job 80% of its
    max-min level and gives the rest by Sia's normalized goodput, with Sia's re-allocation
    factor on: measured on Sia's Philly workloads, Gavel's trace and the generated ones
    (docs/results/sia.md). The other objectives keep the factor off (FTF and makespan
    measured slower with it)."""

    realloc_factor: bool = Field(
        True, description=ObjectiveArgs.model_fields["realloc_factor"].description
    )
    fair_share: float = Field(
        0.8,
        ge=0,
        le=1,
        description="elastic: every job keeps at least this fraction of its max-min fair "
        "level (1: Gavel's LAS; 0: no floor, the surplus objective alone)",
    )
    surplus: Surplus = Field(
        "speedup",
        description="elastic: what the devices the fair floor leaves go to: speedup (Sia's "
        "normalized goodput, each job's speedup over its own slowest configuration, so "
        "types go by comparative advantage) or shortest (the jobs nearest their end)",
    )

    def shares(self) -> LasShares:
        return LasShares(self.fair_share, self.surplus)


class RigidObjectiveArgs(ObjectiveArgs):
    """A Gavel objective without an elastic form: it schedules jobs at their scale factor."""

    elastic: bool = Field(False, description="must stay false: this objective has no elastic form")


class CostArgs(ObjectiveArgs):
    """A cost objective: dollars per device-hour of each type."""

    prices: dict[str, Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict,
        description="dollars per device-hour, {TYPE: PRICE} (types not named: Google Cloud's "
        "on-demand prices that Gavel used: v100 2.48, p100 1.46, k80 0.45, t4 0.35)",
    )


class HierarchicalArgs(ObjectiveArgs):
    """Hierarchical max-min fairness over tenants (entities)."""

    weights: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict,
        description="tenants' shares of the cluster, {TENANT: WEIGHT} (others: 1)",
    )
    policies: dict[str, Literal["fairness", "fifo"]] = Field(
        default_factory=dict,
        description="how a tenant shares among its jobs, {TENANT: fairness|fifo} "
        "(others: fairness)",
    )


class DeepPoolArgs(Args):
    """DeepPool's collocation: a best-effort one-device job runs at the lowest priority on a
    device that a job's burst-parallel plan leaves idle."""

    amp_limit: float = Field(
        2.0, ge=1, description="the amplification limit of the burst-parallel plans (>= 1)"
    )
    min_idle: float = Field(
        0.1,
        ge=0,
        le=1,
        description="the least share of its devices' time a job's plan must leave idle for it "
        "to lend one (0-1)",
    )
    max_foreground_slowdown: float = Field(
        0.2,
        gt=0,
        description="a background job is paused while its foreground runs this much slower "
        "than alone (a fraction), and a foreground measured slower lends no more",
    )


class RubickPlansArgs(Args):
    """Rubick's plan choice beside the objective: for a job whose spec allows plan
    dimensions (gradient checkpointing, optimizer offload), the execution plan on the
    devices the objective chose that the Brain's fitted Rubick model predicts fastest among
    those that fit in memory; jobs that allow none keep their own plan."""

    min_gain: float = Field(
        0.05,
        ge=0,
        description="a running job kept on its devices restarts with another plan only when "
        "the model predicts it this much faster (a fraction); a job started or moved takes "
        "the fastest plan",
    )
    profile: bool = Field(
        True,
        description="a job that allows a plan dimension and has no fit of its own runs "
        "Rubick's profiling run at its first placement, so that its own fit follows",
    )


class DlroverArgs(Args):
    """DLRover's resource plans: the initial plan from similar jobs' history, then adjusted."""

    interval_seconds: float = Field(
        60.0,
        ge=0,
        description="seconds between a running job's plan adjustments (0: only the initial "
        "plan from history)",
    )


class GuaranteesArgs(Args):
    """Tenants' quotas: a guaranteed job its tenant's quota covers is admitted first."""

    file: str = Field(
        "",
        description="YAML file of quotas, devices per type (`tenants: {a: {quota: {v100: "
        "4}}}`); SIGHUP reloads it; empty: no tenants, every job best effort",
    )


class StragglerArgs(Args):
    """Slow processes found from their step times; their workers marked degraded."""

    margin: float = Field(
        0.5,
        gt=0,
        description="a process whose compute time per step is above (1 + margin) x the "
        "median of its job's other processes is slow",
    )
    reports: int = Field(
        3,
        ge=1,
        description="consecutive slow reports that make a straggler and mark its worker "
        "degraded (jobs move off it when another placement exists); as many normal reports "
        "clear it",
    )
    clear_seconds: float = Field(
        300.0, gt=0, description="a degraded mark clears this long after its latest slow report"
    )


@dataclass(frozen=True)
class Plugin:
    """One registered plugin."""

    name: str
    point: Point
    doc: str
    args: type[Args] = NoArgs
    # What the plugin can do with these arguments.
    can: Callable[[Any], frozenset[Can]] = lambda args: frozenset()
    # Why these arguments cannot work (None: they can), beyond what their class checks.
    refuse: Callable[[Any], str | None] = lambda args: None
    tags: tuple[str, ...] = field(default=())  # the seed paper(s) it comes from
    # allocate: (settings, quotas or None, Brain) -> the Allocator; collocate: (settings) ->
    # the Collocator; executionPlans: (settings, Brain) -> the stage; plans: (settings, Brain,
    # clock, pool) -> the round's plans provider (round/hooks.py)
    # (gearshift.scheduler.plugins.stages builds them)
    build: Callable[..., Any] | None = None


_REGISTRY: dict[tuple[Point, str], Plugin] = {}


def register(plugin: Plugin) -> Plugin:
    key = (plugin.point, plugin.name)
    if key in _REGISTRY:
        raise ValueError(f"plugin {plugin.point}/{plugin.name} registered twice")
    _REGISTRY[key] = plugin
    return plugin


def plugin(point: Point | str, name: str) -> Plugin | None:
    return _REGISTRY.get((Point(point), name))


def plugins(point: Point | str | None = None) -> Iterator[Plugin]:
    """The registered plugins, by point (in round order) then name."""
    order = list(Point)
    for key in sorted(_REGISTRY, key=lambda k: (order.index(k[0]), k[1])):
        if point is None or key[0] == Point(point):
            yield _REGISTRY[key]


def names(point: Point | str) -> list[str]:
    return [p.name for p in plugins(point)]


def capabilities(point: Point | str, name: str, args: Any = None) -> frozenset[Can]:
    """What the plugin `name` at `point` can do (with its default arguments when none)."""
    found = plugin(point, name)
    if found is None:
        return frozenset()
    return found.can(args if args is not None else found.args())


# The points whose plugins make a round's decision (tenants wraps the allocator): what a
# decision process runs in its child.
DECISION_POINTS = (Point.ALLOCATE, Point.COLLOCATE, Point.PLACE, Point.TENANTS)


def decision_process_refusals(
    chosen: Iterable[tuple[Point, str, Any]],
) -> list[tuple[Point, str, str]]:
    """(point, plugin, why) for each chosen plugin (point, name, its arguments or None for
    the defaults) of the decision's points that cannot decide in the scheduler's child
    process: the one rule behind the file's round.decisionProcess and the decision
    process's own check."""
    out = []
    for point, name, args in chosen:
        if point not in DECISION_POINTS or Can.DECISION_PROCESS in capabilities(point, name, args):
            continue
        if plugin(point, name) is None:
            why = f"no {point.value} plugin {name!r}"
        else:  # none registered today: Rubick's and the tenants' ship what they keep there
            why = "it keeps state in the scheduler's process that it does not ship"
        out.append((point, name, why))
    return out


# The allocate point: Gavel's objectives, EasyScale's greedy allocators, Rubick's Algorithm 1.
GREEDY = {
    "easyscale": "EasyScale's greedy inter-job allocator over elastic EST jobs, any types",
    "easyscale_homo": "EasyScale's greedy allocator, one accelerator type per job",
    "yarn_cs": "the rigid FIFO gang baseline (YARN's capacity scheduler)",
}
RUBICK = {
    "rubick": "Rubick's Algorithm 1: devices and each job's execution plan from the Brain's "
    "fitted model, guaranteed jobs admitted against quotas",
    "rubick_e": "Rubick without plan choice (break-down: E)",
    "rubick_r": "Rubick without resource reallocation (break-down: R)",
    "rubick_n": "Rubick without either (break-down: N)",
}


def _objective(name: str) -> Plugin:
    elastic_form, space_sharing = traits(name)
    args: type[Args] = ObjectiveArgs if elastic_form else RigidObjectiveArgs
    if name == "las":
        args = LasArgs
    if "cost" in name:
        args = CostArgs
    elif name == "hierarchical" or "water_filling" in name:
        args = HierarchicalArgs

    def can(a: ObjectiveArgs) -> frozenset[Can]:
        out = {Can.DECISION_PROCESS}
        if a.elastic:
            out.add(Can.ELASTIC)
        if space_sharing:
            out.add(Can.SPACE_SHARING)
        return frozenset(out)

    def refuse(a: ObjectiveArgs) -> str | None:
        if a.elastic and (why := elastic_refusal(name)) is not None:
            return why
        if a.recompute_in_background and not a.elastic:
            return "recomputeInBackground: only elastic objectives solve in the background"
        return None

    return Plugin(
        name, Point.ALLOCATE, describe(name), args, can, refuse, ("gavel",), build=_build_rounds
    )


def _build_rounds(settings: Any, quotas: Any, brain: Any) -> Any:
    """A Gavel objective in rounds, or a greedy allocator
    (gearshift.scheduler.plugins.allocators)."""
    return make_allocator(
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
        restart=settings.restart_cost,
        las=settings.las,
    )


def _build_rubick(settings: Any, quotas: Any, brain: Any) -> Any:
    """Rubick's Algorithm 1, asking the Brain for its fitted models."""
    return make_live_rubick(settings.policy, brain, quotas)


def _constant(can: frozenset[Can]) -> Callable[[Any], frozenset[Can]]:
    return lambda args: can


def _register_allocators() -> None:
    for name in policy_names():
        register(_objective(name))
    for name, doc in GREEDY.items():
        elastic = frozenset(
            {Can.DECISION_PROCESS} | ({Can.ELASTIC} if name != "yarn_cs" else set())
        )
        register(
            Plugin(
                name,
                Point.ALLOCATE,
                doc,
                NoArgs if name == "yarn_cs" else GreedyArgs,
                can=_constant(elastic),
                tags=("easyscale",),
                build=_build_rounds,
            )
        )
    for name, doc in RUBICK.items():
        register(
            Plugin(
                name,
                Point.ALLOCATE,
                doc,
                # the decision process is shipped the fitted models by this process's copy
                can=lambda a: frozenset(
                    {
                        Can.ELASTIC,
                        Can.NEEDS_BRAIN,
                        Can.ADMITS_TENANTS,
                        Can.CHOOSES_PLANS,
                        Can.DECISION_PROCESS,
                    }
                ),
                tags=("rubick",),
                build=_build_rubick,
            )
        )


def _off(point: Point, doc: str) -> Plugin:
    return Plugin("none", point, doc, can=lambda a: frozenset({Can.OFF, Can.DECISION_PROCESS}))


def _register_stages() -> None:
    register(_off(Point.COLLOCATE, "no collocation: a device runs one job at a time"))
    register(
        Plugin(
            "deeppool",
            Point.COLLOCATE,
            DeepPoolArgs.__doc__ or "",
            DeepPoolArgs,
            can=lambda a: frozenset({Can.NEEDS_BRAIN, Can.DECISION_PROCESS}),
            tags=("deeppool",),
            build=lambda s: Multiplexing(s.min_idle, s.max_foreground_slowdown),
        )
    )
    register(
        Plugin(
            "consolidate",
            Point.PLACE,
            "workers and devices for each target: consolidated on as few workers as the "
            "devices allow, a running job kept where it is when it can (lease renewal)",
            can=lambda a: frozenset({Can.DECISION_PROCESS}),
            tags=("gavel",),
        )
    )
    register(
        _off(
            Point.EXECUTION_PLANS,
            "no plan choice: a job runs its own execution plan unless the allocator chooses one",
        )
    )
    register(
        Plugin(
            "rubick",
            Point.EXECUTION_PLANS,
            RubickPlansArgs.__doc__ or "",
            RubickPlansArgs,
            can=lambda a: frozenset({Can.NEEDS_BRAIN, Can.CHOOSES_PLANS}),
            tags=("rubick",),
            build=lambda s, brain: make_rubick_plans(
                brain, min_gain=s.plan_min_gain, profile=s.plan_profile
            ),
        )
    )
    register(
        replace(
            _off(Point.PLANS, "no resource plans: every job runs on its spec's defaults"),
            # a parameter-server job's launcher needs its counts all the same (DLRover's)
            build=lambda s, brain, clock, pool: make_plans(s, brain, clock, pool, resources=False),
        )
    )
    register(
        Plugin(
            "dlrover",
            Point.PLANS,
            DlroverArgs.__doc__ or "",
            DlroverArgs,
            can=lambda a: frozenset({Can.NEEDS_BRAIN}),
            tags=("dlrover",),
            build=lambda s, brain, clock, pool: make_plans(s, brain, clock, pool, resources=True),
        )
    )
    register(
        Plugin(
            "guarantees",
            Point.TENANTS,
            GuaranteesArgs.__doc__ or "",
            GuaranteesArgs,
            # Quotas reload on SIGHUP in the scheduler's process, which ships them to the
            # decision process with the snapshots that follow.
            can=lambda a: frozenset({Can.DECISION_PROCESS}),
            tags=("rubick",),
        )
    )
    register(
        Plugin(
            "stragglers",
            Point.STRAGGLERS,
            StragglerArgs.__doc__ or "",
            StragglerArgs,
            tags=("dlrover",),
        )
    )


_register_allocators()
_register_stages()
