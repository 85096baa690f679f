"""The scheduler daemon: flags, storage, the round loop, servicers, serving.

`gearshift-scheduler migrate [--database-url URL]` upgrades the schema and exits.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from gearshift.common.config import Option, parse_bool
from gearshift.common.daemon import (
    Daemon,
    job_tokens,
    outgoing_tls,
    run_daemon,
    server_options,
)
from gearshift.common.db import database_options, migrate_main, open_database
from gearshift.common.errors import GearshiftError, ValidationError
from gearshift.common.server import register
from gearshift.scheduler import metrics
from gearshift.scheduler.allocators import GREEDY, allocator_names, make_allocator
from gearshift.scheduler.brain import BrainAdvisor
from gearshift.scheduler.datasets import DatasetKeeper
from gearshift.scheduler.decider import check_decision_process
from gearshift.scheduler.heartbeat_relay import main as relay_main
from gearshift.scheduler.policies.base import EntityPolicy
from gearshift.scheduler.prices import parse_prices
from gearshift.scheduler.relays import HeartbeatRelays
from gearshift.scheduler.rubick_live import LIVE_VARIANTS
from gearshift.scheduler.service import Scheduler, SchedulerSettings
from gearshift.scheduler.servicer import JobServicer, WorkerRegistryServicer
from gearshift.scheduler.state import EVENT_ROUNDS
from gearshift.scheduler.store import SqlStore
from gearshift.scheduler.stragglers import StragglerPolicy
from gearshift.scheduler.tenants import load_quotas
from gearshift.scheduler.workers import WorkerAgents
from gearshift.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger("gearshift.scheduler")

PROG = "gearshift-scheduler"
# Python hands the interpreter to a waiting thread after 5 ms: every reply from the network
# or the database waited up to that, several times a call, behind a round's or a cluster
# view's computation. At 1 ms the p99 of heartbeats and submissions at 1,000 workers fell
# by about a third (bench/load.py, README "Load").
GIL_SWITCH_MS = 1.0
DEFAULT_PORT = 50051
DEFAULT_DATABASE = "sqlite:///.gearshift/scheduler.db"
OPTIONS = [
    *server_options(DEFAULT_PORT),
    *database_options(DEFAULT_DATABASE),
    Option(
        "policy",
        "allocation policy: EasyScale's greedy allocator over elastic EST jobs (easyscale, "
        "easyscale_homo), the rigid FIFO gang baseline (yarn_cs), or a Gavel objective run in "
        "rounds (e.g. las, finish_time_fairness, max_sum_throughput, makespan, "
        "min_total_cost, min_total_cost_slo, hierarchical) - over rigid jobs, or with "
        "--elastic over elastic ones; or Rubick's Algorithm 1 (rubick, and its break-down "
        "variants rubick_e, rubick_r, rubick_n), which also chooses each job's execution plan "
        "from the Brain's fitted model (needs --brain-address to plan)",
        "easyscale",
        choices=sorted([*allocator_names(), *LIVE_VARIANTS]),
    ),
    Option(
        "elastic",
        "Gavel objectives: jobs are elastic (any device count within their bounds; D2 jobs "
        "may mix types) and the objective allocates over device configurations",
        False,
        parse_bool,
    ),
    Option(
        "hysteresis",
        "elastic objectives: least relative gain for which a running job is resized",
        0.1,
        float,
    ),
    Option(
        "preempt_exempt_seconds",
        "elastic objectives: a job whose placement started less than this many seconds ago "
        "keeps it (not preempted, resized or moved; Slurm's PreemptExemptTime); 0: off",
        0.0,
        float,
    ),
    Option(
        "max_moves_per_round",
        "elastic objectives: at most this many running jobs preempted, resized or moved a "
        "round, the oldest placements first (Slurm's sched_max_job_start, for moves); 0: any",
        0,
        int,
    ),
    Option(
        "max_starts_per_round",
        "at most this many queued jobs started a round, in the decision's order; the others "
        "at the next round, which is asked for at once (Slurm's sched_max_job_start): a "
        "burst of arrivals does not make one round wait for hundreds of StartTask calls; "
        "the preemptions that only made room for the others wait with them; 0: any",
        0,
        int,
    ),
    Option(
        "prices",
        "dollars per device-hour for the cost policies, TYPE=PRICE,... (default Google "
        "Cloud's on-demand prices Gavel used: v100=2.48,p100=1.46,k80=0.45,t4=0.35)",
        "",
    ),
    Option(
        "estimate_refresh_seconds",
        "how often a job's throughput estimates are asked of the Brain again, seconds",
        60.0,
        float,
    ),
    Option("round_seconds", "length of a scheduling round, seconds", 360.0, float),
    Option(
        "plan_interval",
        "seconds between a running job's resource-plan adjustments (DLRover's adjust stage, "
        "asked of the Brain; 0: only the initial plan from history)",
        60.0,
        float,
    ),
    Option(
        "min_recompute_seconds",
        "Gavel policies: least time between recomputations of the allocation (0: every round "
        "after a change)",
        0.0,
        float,
    ),
    Option(
        "recompute_in_background",
        "elastic Gavel policies: solve a recomputation of the allocation (after the first) "
        "on a thread of its own while the rounds go on with the allocation in force, taken "
        "at the first round after it is done (Gavel's allocation thread): a solve over "
        "thousands of jobs no longer lengthens its round",
        False,
        parse_bool,
    ),
    Option(
        "event_round_gap",
        "least seconds between a round's end and an early round that an event (a submission, "
        "a worker joining) asks for: a burst of events is one round, not one each",
        1.0,
        float,
    ),
    Option(
        "event_rounds",
        "allocators that re-plan on events (elastic ones): 'always', an event asks for an "
        "early round; 'free-devices', only while a live device is free (a job that arrives "
        "at a full cluster waits for the round boundary, as in Gavel, instead of every "
        "arrival moving running jobs)",
        "always",
        choices=list(EVENT_ROUNDS),
    ),
    Option(
        "decision_process",
        "decide each round (allocate, collocate, place) in a child process of its own, so "
        "that the decision over thousands of jobs does not hold up the RPCs (not with the "
        "rubick policies or --tenants-file)",
        False,
        parse_bool,
    ),
    Option(
        "gil_switch_ms",
        "how long a thread may hold Python's interpreter lock while another waits for it, "
        "milliseconds (Python's own: 5): a call back from the network or the database "
        "waits at most this for the interpreter while a round or a cluster view computes",
        GIL_SWITCH_MS,
        float,
    ),
    Option("heartbeat_interval", "seconds between a worker's heartbeats", 5.0, float),
    Option(
        "heartbeat_timeout",
        "a worker silent this long is declared lost and its jobs rescheduled, seconds",
        30.0,
        float,
    ),
    Option(
        "heartbeat_relays",
        "processes beside the scheduler that take the workers' heartbeats and hand them on in "
        "batches (a worker learns its relay's port when it registers): the gRPC work of a "
        "thousand heartbeats a second then leaves the scheduler's interpreter (0: the "
        "scheduler takes every heartbeat itself)",
        0,
        int,
    ),
    Option(
        "heartbeat_relay_port",
        "the first relay's port, the others on the ports after it (0: picked by the system; "
        "set it where the ports must be published, as in a container)",
        0,
        int,
    ),
    Option(
        "stop_timeout",
        "seconds a task gets to checkpoint and exit when stopped before it is killed",
        60.0,
        float,
    ),
    Option(
        "brain_address",
        "Brain host:port for EST plans and throughput estimates (empty: plan locally)",
        "",
    ),
    Option("shard_manager_address", "shard manager host:port handed to training tasks", ""),
    Option(
        "checkpoint_root",
        "directory (shared by the workers) under which each job gets a checkpoint folder",
        ".gearshift/checkpoints",
    ),
    Option(
        "rendezvous_port_base",
        "first of the 100 ports handed out in turn for jobs' torch.distributed stores on their "
        "rank-0 workers",
        29500,
        int,
    ),
    Option("seed", "random seed of the policies (Gavel's type shuffle, FIFO draws)", 0, int),
    Option(
        "max_queued_jobs",
        "queued jobs a tenant may have at once; a submission past it is refused",
        1000,
        int,
    ),
    Option(
        "max_restarts",
        "times a job whose task failed is resumed from its last checkpoint before it fails "
        "(a failure for bad input fails it at once)",
        3,
        int,
    ),
    Option(
        "collocation",
        "the collocate stage: none, or deeppool (a best-effort one-device job the policy "
        "leaves waiting runs at the lowest priority on a device of a job whose "
        "burst-parallel plan leaves it idle; needs --brain-address and layer profiles, "
        "gearshift profile)",
        "none",
        choices=["none", "deeppool"],
    ),
    Option(
        "amp_limit",
        "deeppool: the amplification limit of the burst-parallel plans that say how idle a "
        "job leaves its devices and how many an elastic job asks for (>= 1)",
        2.0,
        float,
    ),
    Option(
        "min_idle",
        "deeppool: the least share of its devices' time a job's plan must leave idle for it "
        "to lend one (0-1)",
        0.1,
        float,
    ),
    Option(
        "max_foreground_slowdown",
        "deeppool: a background job is paused while its foreground runs this much slower "
        "than alone (a fraction; sent to the worker), and a foreground measured slower than "
        "this lends no more",
        0.2,
        float,
    ),
    Option(
        "straggler_margin",
        "a training process whose compute time per step is above (1 + this) x the median of "
        "its job's other processes is slow (0.5: half as slow again)",
        0.5,
        float,
    ),
    Option(
        "straggler_reports",
        "consecutive slow reports that make a process a straggler and mark its worker "
        "degraded (jobs move off it when another placement exists); as many normal "
        "reports clear the mark",
        3,
        int,
    ),
    Option(
        "straggler_clear_seconds",
        "a degraded worker's mark clears this long after its latest slow report",
        300.0,
        float,
    ),
    Option(
        "tenant_weights",
        "hierarchical policy: tenants' shares of the cluster, TENANT=WEIGHT,... (others: 1)",
        "",
    ),
    Option(
        "tenant_policies",
        "hierarchical policy: how a tenant shares among its jobs, TENANT=fairness|fifo,... "
        "(others: fairness)",
        "",
    ),
    Option(
        "tenants_file",
        "YAML file of tenants' quotas, devices per type (`tenants: {a: {quota: {v100: 4}}}`): "
        "a guaranteed job its tenant's quota covers gets the devices it asks for first, and "
        "best-effort jobs shrink or are preempted to make room; SIGHUP reloads it",
        "",
    ),
]
DESCRIPTION = (
    "Gearshift scheduler: jobs API, worker registry and round-based scheduling over gRPC. "
    f"Subcommands: '{PROG} migrate [--database-url URL]' upgrades the schema and exits; "
    f"'{PROG} relay' is a heartbeat relay (--heartbeat-relays starts them)."
)


def _pairs(text: str, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"{flag}: {item!r} is not NAME=VALUE")
        out[key] = value
    return out


def settings_from(config: argparse.Namespace) -> SchedulerSettings:
    """SchedulerSettings from parsed flags; ValueError names a bad flag."""
    for flag in ("round_seconds", "heartbeat_interval", "heartbeat_timeout", "stop_timeout"):
        if getattr(config, flag) <= 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be > 0")
    if config.min_recompute_seconds < 0:
        raise ValueError("--min-recompute-seconds must be >= 0")
    if config.recompute_in_background and (
        not config.elastic or config.policy in (*GREEDY, *LIVE_VARIANTS)
    ):
        raise ValueError(
            "--recompute-in-background: only with --elastic and a Gavel objective "
            f"(--policy {config.policy}{' --elastic' if config.elastic else ''} solves none)"
        )
    if config.event_round_gap < 0:
        raise ValueError("--event-round-gap must be >= 0")
    if config.plan_interval < 0:
        raise ValueError("--plan-interval must be >= 0 (0: only the initial plan)")
    if not 0 < config.gil_switch_ms <= 100:
        raise ValueError("--gil-switch-ms must be > 0 and at most 100")
    if not 0 <= config.heartbeat_relays <= MAX_RELAYS:
        raise ValueError(f"--heartbeat-relays must be 0 to {MAX_RELAYS}")
    if not 0 <= config.heartbeat_relay_port <= 65535 - config.heartbeat_relays:
        raise ValueError("--heartbeat-relay-port must leave a port for each relay (0 to 65535)")
    if config.heartbeat_timeout <= config.heartbeat_interval:
        raise ValueError("--heartbeat-timeout must exceed --heartbeat-interval")
    if config.max_queued_jobs <= 0:
        raise ValueError("--max-queued-jobs must be > 0")
    if config.max_restarts < 0:
        raise ValueError("--max-restarts must be >= 0")
    if config.hysteresis < 0:
        raise ValueError("--hysteresis must be >= 0")
    if config.preempt_exempt_seconds < 0:
        raise ValueError("--preempt-exempt-seconds must be >= 0")
    if config.max_starts_per_round < 0:
        raise ValueError("--max-starts-per-round must be >= 0")
    if config.max_moves_per_round < 0:
        raise ValueError("--max-moves-per-round must be >= 0")
    if config.estimate_refresh_seconds <= 0:
        raise ValueError("--estimate-refresh-seconds must be > 0")
    try:
        prices = parse_prices(config.prices)
        if config.policy in LIVE_VARIANTS:
            if config.elastic:
                raise ValidationError(
                    "--policy", f"{config.policy} decides devices itself: drop --elastic"
                )
        else:
            make_allocator(config.policy, elastic=config.elastic, field_name="--policy")
    except ValidationError as exc:
        raise ValueError(exc.message) from None
    if config.amp_limit < 1:
        raise ValueError(f"--amp-limit must be >= 1, got {config.amp_limit}")
    if not 0 <= config.min_idle <= 1:
        raise ValueError(f"--min-idle must be between 0 and 1, got {config.min_idle}")
    if config.max_foreground_slowdown <= 0:
        raise ValueError(
            f"--max-foreground-slowdown must be > 0, got {config.max_foreground_slowdown}"
        )
    if config.collocation == "deeppool" and not config.brain_address:
        raise ValueError(
            "--collocation deeppool needs --brain-address: the burst-parallel plans that say "
            "which jobs leave devices idle come from the Brain"
        )
    if config.tenants_file:
        try:
            load_quotas(Path(config.tenants_file))
        except ValidationError as exc:
            raise ValueError(f"--tenants-file: {exc.message}") from None
    stragglers = StragglerPolicy(
        config.straggler_margin, config.straggler_reports, config.straggler_clear_seconds
    )
    stragglers.check()
    if not 1024 <= config.rendezvous_port_base <= 65000:
        raise ValueError("--rendezvous-port-base must be between 1024 and 65000")
    weights: dict[str, float] = {}
    for tenant, value in _pairs(config.tenant_weights, "--tenant-weights").items():
        try:
            weights[tenant] = float(value)
        except ValueError:
            raise ValueError(f"--tenant-weights: {value!r} is not a number") from None
        if not weights[tenant] > 0:
            raise ValueError(f"--tenant-weights: weight of {tenant!r} must be > 0")
    policies: dict[str, EntityPolicy] = {}
    for tenant, value in _pairs(config.tenant_policies, "--tenant-policies").items():
        if value not in ("fairness", "fifo"):
            raise ValueError(f"--tenant-policies: {value!r} is not fairness or fifo")
        policies[tenant] = "fifo" if value == "fifo" else "fairness"
    settings = SchedulerSettings(
        policy=config.policy,
        elastic=config.elastic,
        hysteresis=config.hysteresis,
        preempt_exempt_seconds=config.preempt_exempt_seconds,
        max_moves_per_round=config.max_moves_per_round,
        max_starts_per_round=config.max_starts_per_round,
        prices=prices,
        estimate_refresh_seconds=config.estimate_refresh_seconds,
        tenant_weights=weights,
        tenant_policies=policies,
        round_seconds=config.round_seconds,
        heartbeat_interval=config.heartbeat_interval,
        heartbeat_timeout=config.heartbeat_timeout,
        min_recompute_seconds=config.min_recompute_seconds,
        recompute_in_background=config.recompute_in_background,
        event_round_gap=config.event_round_gap,
        event_rounds=config.event_rounds,
        decision_process=config.decision_process,
        plan_interval=config.plan_interval,
        checkpoint_root=config.checkpoint_root,
        brain_address=config.brain_address,
        shard_manager_address=config.shard_manager_address,
        stop_timeout_seconds=config.stop_timeout,
        rendezvous_port_base=config.rendezvous_port_base,
        seed=config.seed,
        max_restarts=config.max_restarts,
        max_queued_jobs=config.max_queued_jobs,
        collocation=config.collocation,
        amp_limit=config.amp_limit,
        min_idle=config.min_idle,
        max_foreground_slowdown=config.max_foreground_slowdown,
        tenants_file=config.tenants_file,
        stragglers=stragglers,
    )
    if settings.decision_process:
        check_decision_process(settings)
    return settings


def build(config: argparse.Namespace) -> Daemon:
    settings = settings_from(config)
    sys.setswitchinterval(config.gil_switch_ms / 1000)
    url = open_database(config.database_url, migrate_first=config.migrate_on_start)
    try:
        store = SqlStore(url)
        store.check()
    except GearshiftError as exc:
        raise ValueError(exc.message) from None
    except sa.exc.SQLAlchemyError as exc:
        raise RuntimeError(f"database {config.database_url}: {exc}") from None
    token, tls = config.token or None, outgoing_tls(config)
    if config.tokens_file and not config.job_key_file:
        raise ValueError(
            "--tokens-file needs --job-key-file on the scheduler: training processes call "
            "with a token scoped to their job (make a key with: gearshift token job-key)"
        )
    scheduler = Scheduler(
        store,
        settings,
        agents=WorkerAgents(token=token, tls=tls),
        brain=BrainAdvisor(settings.brain_address, token=token, tls=tls),
        datasets=DatasetKeeper(settings.shard_manager_address, token=token, tls=tls),
        job_tokens=job_tokens(config),
    )
    scheduler.recover()
    metrics.watch(scheduler.cluster_state, store.job_counts)

    relays = relays_of(config)
    services = scheduler_pb2.DESCRIPTOR.services_by_name
    return Daemon(
        [
            register(
                scheduler_pb2_grpc.add_JobServiceServicer_to_server,
                JobServicer(scheduler),
                services["JobService"].full_name,
            ),
            register(
                scheduler_pb2_grpc.add_WorkerRegistryServicer_to_server,
                WorkerRegistryServicer(scheduler, relays.port_for),
                services["WorkerRegistry"].full_name,
            ),
        ],
        on_start=lambda server: _start(scheduler, relays, server.address),
        on_stop=[relays.stop, scheduler.stop, store.close],
        # The relays re-read the tokens file with it (without one, SIGHUP would end them).
        on_reload=[
            lambda: _reload_tenants(scheduler),
            *([relays.reload] if config.tokens_file else []),
        ],
        scopes=lambda: scheduler,
    )


# What a relay shares with the scheduler: how calls are checked and how it calls back.
RELAY_SETTINGS = (
    "token", "tokens_file", "job_key_file", "tls_cert", "tls_key", "tls_client_ca", "tls_ca",
    "max_message_mb", "log_level", "log_format",
)  # fmt: skip
MAX_RELAYS = 64


def relays_of(config: argparse.Namespace) -> HeartbeatRelays:
    """The --heartbeat-relays (none by default: the scheduler takes every heartbeat)."""
    if config.heartbeat_relays and config.tls_cert and not config.tls_ca:
        raise ValueError(
            "--heartbeat-relays with TLS needs --tls-ca: the relays call the scheduler over TLS"
        )
    options = {o.dest: o for o in OPTIONS}
    env = {options[name].env: str(getattr(config, name)) for name in RELAY_SETTINGS}
    host = config.listen.rpartition(":")[0]
    return HeartbeatRelays(config.heartbeat_relays, host, env, config.heartbeat_relay_port)


def _start(scheduler: Scheduler, relays: HeartbeatRelays, address: str) -> None:
    scheduler.start()
    relays.start(address)


def _reload_tenants(scheduler: Scheduler) -> None:
    try:
        count = scheduler.reload_tenants()
    except ValidationError as exc:
        log.error("tenants file refused; the old quotas stay", extra={"error": exc.message})
        return
    if scheduler.tenants is not None:
        log.info("tenants file reloaded", extra={"tenants": count})


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["migrate"]:
        return migrate_main(PROG, DESCRIPTION, args[1:], DEFAULT_DATABASE)
    if args[:1] == ["relay"]:
        return relay_main(args[1:])
    return run_daemon(PROG, DESCRIPTION, OPTIONS, build, args)
