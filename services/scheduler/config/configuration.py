"""The scheduler's configuration file: `kind: SchedulerConfiguration`, one versioned file.

In the manner of KubeSchedulerConfiguration: the round's settings, the estimates, the
limits, and a profile naming the plugin at each extension point with that plugin's typed
arguments (gearshift.scheduler.plugins.registry). The same file drives `gearshift-scheduler
--config`, `gearshift up --config` and `gearshift simulate --config`; flags are left to
the process (listen, database, TLS, tokens, metrics, logs). With no file, the defaults are
the union of the five papers (`DEFAULT_PROFILE`).

Every error names the key's path and the file's line (`ConfigurationError`): an unknown
key, a wrong type, an unknown plugin, or two plugins that cannot work together.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from gearshift.scheduler.plugins.registry import (
    DECISION_POINTS,
    Args,
    Can,
    Point,
    decision_process_refusals,
    names,
    plugin,
)

API_VERSION: Literal["gearshift.dev/v1alpha1"] = "gearshift.dev/v1alpha1"
KIND: Literal["SchedulerConfiguration"] = "SchedulerConfiguration"
Loc = tuple[str | int, ...]


class Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )


class RoundConfig(Section):
    """The round: how often it runs, what wakes it early, and how much it may change."""

    seconds: float = Field(
        360.0, gt=0, description="length of a round, seconds (Gavel: 360; a lease is twice it)"
    )
    event_rounds: Literal["always", "free-devices"] = Field(
        "free-devices",
        description="when an event (a submission, a worker joining, a job ending) asks an "
        "allocator that re-plans on events for an early round: always, or only while a live "
        "device is free (a job that arrives at a full cluster waits for the boundary, as in "
        "Gavel, instead of every arrival moving running jobs)",
    )
    event_round_gap: float = Field(
        1.0, ge=0, description="least seconds between a round's end and an early round"
    )
    max_starts: int = Field(
        200,
        ge=0,
        description="queued jobs started a round at most, in the decision's order; the others "
        "at the next round, asked for at once (Slurm's sched_max_job_start); 0: any",
    )
    max_moves: int = Field(
        100,
        ge=0,
        description="elastic objectives: running jobs preempted, resized or moved a round at "
        "most, the oldest placements first; 0: any",
    )
    preempt_exempt_seconds: float = Field(
        60.0,
        ge=0,
        description="elastic objectives: a placement younger than this is kept (not "
        "preempted, resized or moved; Slurm's PreemptExemptTime); 0: off",
    )
    decision_process: bool | Literal["auto"] = Field(
        "auto",
        description="decide each round (allocate, collocate, place) in a child process, so "
        "that a decision over thousands of jobs does not hold up the RPCs; auto: where every "
        "plugin of the profile can run there",
    )
    rescale_in_place: bool = Field(
        False,
        description="apply a rescale that keeps at least one of a job's devices in place: the "
        "processes that stay train on, only the new ones start, the state reaches them from a "
        "survivor (docs/concepts/in-place.md); any failure falls back to checkpoint and restart",
    )
    seed: int = Field(0, description="random seed of the policies (type shuffle, FIFO draws)")
    estimate_starts_seconds: float = Field(
        30.0,
        ge=0,
        description="estimate the waiting jobs' starts (the pipeline run forward on simulated "
        "time from the live state, off the round) at most this often, seconds; 0: never",
    )


class HeartbeatConfig(Section):
    """Workers' liveness."""

    interval_seconds: float = Field(5.0, gt=0, description="seconds between heartbeats")
    timeout_seconds: float = Field(
        30.0, gt=0, description="a worker silent this long is lost, its jobs rescheduled"
    )
    relays: int = Field(
        1,
        ge=0,
        le=64,
        description="processes beside the scheduler that take the heartbeats and hand them on "
        "in batches (0: the scheduler takes every heartbeat itself)",
    )
    relay_port: int = Field(
        0, ge=0, le=65535, description="the first relay's port, the others after it (0: any)"
    )


class EstimatesConfig(Section):
    """Throughput estimates and what a rescale costs."""

    refresh_seconds: float = Field(
        60.0, gt=0, description="how often a job's estimates are asked of the Brain again"
    )
    restart_seconds: float = Field(
        10.0, ge=0, description="what a rescale costs until one of the job's is measured"
    )
    in_place_seconds: float = Field(
        1.0,
        ge=0,
        description="what a resize that keeps a job's devices costs when it goes in place "
        "(round.rescaleInPlace), until one of the job's is measured",
    )


class LimitsConfig(Section):
    """What a caller, a tenant and a job may use."""

    max_spec_kb: int = Field(1024, gt=0, description="largest job spec a caller may submit, KiB")
    max_submits_per_second: float = Field(
        20.0,
        gt=0,
        description="job submissions a second per caller (tenant or token identity), burst "
        "twice that",
    )
    max_streams: int = Field(64, gt=0, description="open streaming calls (watch, logs) per caller")

    max_queued_jobs: int = Field(
        1000, gt=0, description="queued jobs a tenant may have; a submission past it is refused"
    )
    max_restarts: int = Field(
        3, ge=0, description="times a failed job is resumed from its checkpoint before it fails"
    )
    stop_timeout_seconds: float = Field(
        60.0, gt=0, description="seconds a stopped task gets to checkpoint and exit"
    )


class ClusterConfig(Section):
    """Where the other services and the shared folders are."""

    brain_address: str = Field(
        "", description="the Brain, host:port (empty: no plans, estimates or profiles)"
    )
    shard_manager_address: str = Field(
        "", description="the shard manager, host:port, handed to training tasks"
    )
    checkpoint_root: str = Field(
        ".gearshift/checkpoints",
        description="folder shared by the workers under which each job gets its checkpoints",
    )
    rendezvous_port_base: int = Field(
        29500,
        ge=1024,
        le=65000,
        description="first of the 100 ports handed out in turn for jobs' torch.distributed "
        "stores on their rank-0 workers",
    )
    gil_switch_ms: float = Field(
        1.0,
        gt=0,
        le=100,
        description="how long a thread may hold the interpreter while another waits, ms "
        "(Python's own: 5): replies wait at most this behind a round's computation",
    )


class PluginRef(Section):
    """The plugin at one extension point, and its arguments."""

    name: str | None = Field(
        None, description="a registered plugin of this point (default: the profile's default)"
    )
    args: dict[str, Any] = Field(default_factory=dict, description="the plugin's arguments")


# The union of the five papers: what each point runs when the file names no plugin.
DEFAULT_PLUGINS: dict[Point, str] = {
    Point.ALLOCATE: "las",  # Gavel's objective, elastic over EasyScale's ESTs
    Point.COLLOCATE: "deeppool",
    Point.PLACE: "consolidate",
    Point.EXECUTION_PLANS: "rubick",  # Rubick's plan choice, for jobs that allow plans
    Point.PLANS: "dlrover",
    Point.TENANTS: "guarantees",  # Rubick's guaranteed jobs, once tenants have quotas
    Point.STRAGGLERS: "stragglers",
}


class Profile(Section):
    """The plugin at each extension point of a round."""

    allocate: PluginRef = Field(
        default_factory=PluginRef, description="who gets how many devices of which type"
    )
    collocate: PluginRef = Field(
        default_factory=PluginRef,
        description="which waiting job runs beside another on a device",
    )
    place: PluginRef = Field(default_factory=PluginRef, description="which workers and devices")
    execution_plans: PluginRef = Field(
        default_factory=PluginRef,
        description="each job's execution plan on the devices it got (gradient "
        "checkpointing, optimizer offload), where its spec allows one",
    )
    plans: PluginRef = Field(
        default_factory=PluginRef, description="each job's processes and resources, from history"
    )
    tenants: PluginRef = Field(
        default_factory=PluginRef, description="tenants' quotas and guaranteed jobs"
    )
    stragglers: PluginRef = Field(
        default_factory=PluginRef, description="slow processes and degraded workers"
    )

    def refs(self) -> Iterator[tuple[Point, str, dict[str, Any]]]:
        """(point, plugin name, its arguments as written) for every point, in round order."""
        for point in Point:
            ref: PluginRef = getattr(self, point.value)
            yield point, ref.name or DEFAULT_PLUGINS[point], ref.args


class SchedulerConfiguration(Section):
    """The scheduler's configuration file."""

    api_version: Literal["gearshift.dev/v1alpha1"] = Field(
        API_VERSION, description="the file's version"
    )
    kind: Literal["SchedulerConfiguration"] = Field(KIND, description="what the file is")
    round: RoundConfig = Field(default_factory=RoundConfig, description=RoundConfig.__doc__)
    heartbeats: HeartbeatConfig = Field(
        default_factory=HeartbeatConfig, description=HeartbeatConfig.__doc__
    )
    estimates: EstimatesConfig = Field(
        default_factory=EstimatesConfig, description=EstimatesConfig.__doc__
    )
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description=LimitsConfig.__doc__)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description=ClusterConfig.__doc__)
    profile: Profile = Field(default_factory=Profile, description=Profile.__doc__)


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a file: the key's path, its line (0: not known), the message."""

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ConfigurationError(ValueError):
    """A configuration file that cannot be used; every problem names its key and line."""

    def __init__(self, source: str, problems: Sequence[Problem]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(
            f"  {source}:{p.line}: {p}" if p.line else f"  {source}: {p}" for p in problems
        )
        super().__init__(f"configuration {source} is not valid:\n{lines}")


@dataclass(frozen=True)
class Loaded:
    """A validated configuration: the file's model and each plugin's typed arguments."""

    config: SchedulerConfiguration
    args: Mapping[Point, Args]

    def server_limits(self) -> dict[str, object]:
        """The limits the common server options would otherwise take from flags."""
        limits = self.config.limits
        return {
            "max_spec_kb": limits.max_spec_kb,
            "max_submits_per_second": limits.max_submits_per_second,
            "max_streams": limits.max_streams,
            "limits_named": {
                "submits": "limits.maxSubmitsPerSecond",
                "streams": "limits.maxStreams",
                "spec": "limits.maxSpecKb",
            },
        }

    def plugin_args(self, point: Point) -> Any:
        return self.args[point]

    def name(self, point: Point) -> str:
        ref: PluginRef = getattr(self.config.profile, point.value)
        return ref.name or DEFAULT_PLUGINS[point]

    def can(self, point: Point) -> frozenset[Can]:
        found = plugin(point, self.name(point))
        assert found is not None  # validated
        return found.can(self.args[point])

    @property
    def decision_process(self) -> bool:
        """Whether the round's decision runs in a child process."""
        mode = self.config.round.decision_process
        return mode is True or (mode == "auto" and not _child_refusals(self))


def _dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _line_index(text: str) -> dict[Loc, int]:
    """Each key path of a YAML text -> its 1-based line."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    out: dict[Loc, int] = {}

    def walk(node: yaml.Node, loc: Loc) -> None:
        out[loc] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                child = (*loc, str(key.value))
                out[child] = key.start_mark.line + 1
                walk(value, child)
                out[child] = key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*loc, i))

    if root is not None:
        walk(root, ())
    return out


def _line_of(lines: Mapping[Loc, int], loc: Loc) -> int:
    """The line of `loc`, or of its nearest ancestor in the file (a missing key)."""
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines and (end or len(loc) == 0):
            return lines[loc[:end]]
    return 0


def _problems(exc: ValidationError, prefix: Loc, lines: Mapping[Loc, int]) -> list[Problem]:
    out = []
    for error in exc.errors():
        loc: Loc = (*prefix, *(p for p in error["loc"] if isinstance(p, str | int)))
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        elif error["type"] == "literal_error":
            message = f"{message} (got {error['input']!r})"
        out.append(Problem(_dotted(loc), _line_of(lines, loc), message))
    return out


def _child_refusals(loaded: Loaded) -> list[tuple[Point, str, str]]:
    """The plugins of the decision (and tenants, which wrap it) that cannot run in a child."""
    return decision_process_refusals(
        (point, loaded.name(point), loaded.args[point]) for point in DECISION_POINTS
    )


def _compatibility(loaded: Loaded, lines: Mapping[Loc, int]) -> list[Problem]:
    """Pairs of settings that cannot work together, each naming both."""
    out = []

    def problem(loc: Loc, message: str) -> None:
        out.append(Problem(_dotted(loc), _line_of(lines, loc), message))

    if loaded.config.round.decision_process is True:
        for point, name, why in _child_refusals(loaded):
            problem(
                ("round", "decisionProcess"),
                f"true: profile.{point.key} {name} cannot run in the decision process "
                f"({why}); set decisionProcess: auto or false",
            )
    allocate = loaded.can(Point.ALLOCATE)
    if Can.ADMITS_TENANTS in allocate and loaded.name(Point.TENANTS) not in ("guarantees",):
        problem(("profile", "tenants", "name"), "Rubick's allocators admit tenants themselves")
    execution = loaded.config.profile.execution_plans.name
    if Can.CHOOSES_PLANS in allocate and execution not in (None, "none"):
        problem(
            ("profile", "executionPlans", "name"),
            f"{execution} cannot choose plans beside profile.allocate "
            f"{loaded.name(Point.ALLOCATE)}, which chooses each job's plan itself: set "
            "executionPlans to none or leave it out",
        )
    if Can.SPACE_SHARING in allocate and loaded.name(Point.COLLOCATE) != "none":
        problem(
            ("profile", "collocate", "name"),
            f"{loaded.name(Point.COLLOCATE)} cannot collocate beside profile.allocate "
            f"{loaded.name(Point.ALLOCATE)}, which pairs jobs on devices itself: set "
            "collocate to none",
        )
    return out


def _float_ok(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def validate(data: Any, source: str = "<configuration>", text: str = "") -> Loaded:
    """A Loaded configuration from parsed YAML; ConfigurationError lists every problem."""
    lines = _line_index(text) if text else {}
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigurationError(source, [Problem("(top)", 1, "must be a mapping of keys")])
    try:
        config = SchedulerConfiguration.model_validate(data)
    except ValidationError as exc:
        raise ConfigurationError(source, _problems(exc, (), lines)) from None
    problems: list[Problem] = []
    args: dict[Point, Args] = {}
    for point, name, written in config.profile.refs():
        found = plugin(point, name)
        loc: Loc = ("profile", point.key)
        if found is None:
            problems.append(
                Problem(
                    _dotted((*loc, "name")),
                    _line_of(lines, (*loc, "name")),
                    f"unknown {point.key} plugin {name!r}; one of: " + ", ".join(names(point)),
                )
            )
            continue
        try:
            args[point] = found.args.model_validate(written)
        except ValidationError as exc:
            problems.extend(_problems(exc, (*loc, "args"), lines))
            continue
        if not all(_float_ok(v) for v in args[point].model_dump().values()):
            problems.append(Problem(_dotted((*loc, "args")), _line_of(lines, loc), "not finite"))
        why = found.refuse(args[point])
        if why:
            problems.append(Problem(_dotted((*loc, "args")), _line_of(lines, (*loc, "args")), why))
    if problems:
        raise ConfigurationError(source, problems)
    loaded = Loaded(config, args)
    heartbeats = config.heartbeats
    if heartbeats.timeout_seconds <= heartbeats.interval_seconds:
        problems.append(
            Problem(
                "heartbeats.timeoutSeconds",
                _line_of(lines, ("heartbeats", "timeoutSeconds")),
                "must exceed heartbeats.intervalSeconds",
            )
        )
    problems += _compatibility(loaded, lines)
    if problems:
        raise ConfigurationError(source, problems)
    return loaded


def parse(text: str, source: str = "<configuration>") -> Loaded:
    """A Loaded configuration from YAML text; ConfigurationError names what is wrong."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        raise ConfigurationError(
            source, [Problem("(yaml)", line, str(getattr(exc, "problem", exc)))]
        ) from None
    return validate(data, source, text)


def load(path: Path | str | None) -> Loaded:
    """The configuration in `path`, or the defaults when None or empty."""
    if not path:
        return validate({}, "<defaults>")
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigurationError(
            str(path), [Problem("(file)", 0, exc.strerror or str(exc))]
        ) from None
    return parse(text, str(path))


def dump(config: SchedulerConfiguration | Mapping[str, Any]) -> str:
    """YAML of a configuration (a model, or a mapping of the file's keys)."""
    data = (
        config.model_dump(by_alias=True, mode="json")
        if isinstance(config, SchedulerConfiguration)
        else dict(config)
    )
    return yaml.safe_dump(data, sort_keys=False)
