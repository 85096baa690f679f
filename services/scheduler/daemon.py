"""The scheduler daemon: flags, storage, the round loop, servicers, serving.

`gearshift-scheduler migrate [--database-url URL]` upgrades the schema and exits.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import replace

import sqlalchemy as sa

from gearshift.common.config import Option, advertise_address
from gearshift.common.daemon import (
    Daemon,
    job_tokens,
    outgoing_tls,
    run_daemon,
    server_options,
)
from gearshift.common.db import database_options, migrate_main, open_database
from gearshift.common.db import database_url as database_url_of
from gearshift.common.errors import GearshiftError, ValidationError
from gearshift.common.server import GrpcServer, register
from gearshift.scheduler import metrics
from gearshift.scheduler.api.heartbeat_relay import main as relay_main
from gearshift.scheduler.api.relays import HeartbeatRelays
from gearshift.scheduler.api.servicer import JobServicer, WorkerRegistryServicer
from gearshift.scheduler.api.standby import StandbyGate
from gearshift.scheduler.config.configuration import (
    ConfigurationError,
    HeartbeatConfig,
    Loaded,
    load,
)
from gearshift.scheduler.config.settings import settings_of
from gearshift.scheduler.round.brain import BrainAdvisor
from gearshift.scheduler.round.datasets import DatasetKeeper
from gearshift.scheduler.round.workers import WorkerAgents
from gearshift.scheduler.service import Scheduler
from gearshift.scheduler.state.leader import Leadership, elects
from gearshift.scheduler.state.store import SqlStore
from gearshift.scheduler.takeover import Takeover
from gearshift.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger("gearshift.scheduler")

PROG = "gearshift-scheduler"
# Python hands the interpreter to a waiting thread after 5 ms: every reply from the network
# or the database waited up to that, several times a call, behind a round's or a cluster
# view's computation. At 1 ms the p99 of heartbeats and submissions at 1,000 workers fell
# by about a third (bench/load.py; docs/results/load.md).
GIL_SWITCH_MS = 1.0
DEFAULT_PORT = 50051
# A health check name that only the leader answers SERVING (a standby: NOT_FOUND), for a
# readiness probe that sends a Service's calls to the leader alone.
LEADER_HEALTH = "gearshift.scheduler.leader"
DEFAULT_DATABASE = "sqlite:///.gearshift/scheduler.db"
CONFIG_OPTION = Option(
    "config",
    "the SchedulerConfiguration file: the round, estimates, limits, where the Brain and the "
    "shard manager are, and the profile's plugins (`gearshift config defaults` prints every "
    "key; empty: the defaults, the union of the five papers)",
    "",
)
# Flags are for the process only; how the scheduler schedules is in the file.
ADVERTISE_OPTION = Option(
    "advertise_address",
    "host:port that clients and workers are sent to when this scheduler leads: a standby "
    "names it when it refuses a write (empty: the bound listen address; this host's name "
    "for a wildcard host)",
    "",
)
OPTIONS = [
    *server_options(DEFAULT_PORT, limits=False),
    ADVERTISE_OPTION,
    *database_options(DEFAULT_DATABASE),
    CONFIG_OPTION,
]
DESCRIPTION = (
    "Gearshift scheduler: jobs API, worker registry and round-based scheduling over gRPC, "
    "configured by one SchedulerConfiguration file (--config). "
    f"Subcommands: '{PROG} migrate [--database-url URL]' upgrades the schema and exits; "
    f"'{PROG} relay' is a heartbeat relay (the file's heartbeats.relays starts them)."
)


def load_configuration(path: str) -> Loaded:
    """The --config file (the defaults without one); ConfigurationError names what is wrong."""
    return load(path or None)


def build(config: argparse.Namespace, loaded: Loaded | None = None) -> Daemon:
    loaded = loaded or load_configuration(config.config)
    settings = settings_of(loaded)
    if settings.collocates and not settings.brain_address:
        # Without the Brain's burst-parallel plans no job lends a device: the stage would
        # only cost each round its walk over the jobs (and every first start a profile).
        log.warning(
            "profile.collocate needs the Brain (cluster.brainAddress): collocation is off",
            extra={"plugin": settings.collocation},
        )
        settings = replace(settings, collocation="none")
    sys.setswitchinterval(loaded.config.cluster.gil_switch_ms / 1000)
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
    relays = relays_of(config, loaded.config.heartbeats)
    # Built first, so that a standby's takeover is only the lock, the epoch and the recovery.
    leadership = _leadership(config.database_url)
    takeover = Takeover(scheduler, store, relays, leadership, _deposed)
    led = takeover.lead_now()  # else a standby: it serves reads until the lock frees
    metrics.watch(scheduler.cluster_state, store.job_counts)
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
        on_start=lambda server: takeover.start(
            server.address,
            config.advertise_address or _advertised(server),
            led,
            lambda: server.set_serving(LEADER_HEALTH),
        ),
        on_stop=[
            takeover.stop,
            relays.stop,
            scheduler.stop,
            store.close,
            *([leadership.close] if leadership is not None else []),
        ],
        # The relays re-read the tokens file with it (without one, SIGHUP would end them).
        on_reload=[
            lambda: _reload_tenants(scheduler),
            *([relays.reload] if config.tokens_file else []),
        ],
        scopes=lambda: scheduler,
        interceptors=[StandbyGate(takeover.standing)] if leadership is not None else [],
    )


def _advertised(server: GrpcServer) -> str:
    host = server.settings.listen.rpartition(":")[0]
    return advertise_address(host, server.port)


# What a relay shares with the scheduler: how calls are checked and how it calls back.
RELAY_SETTINGS = (
    "token", "tokens_file", "job_key_file", "tls_cert", "tls_key", "tls_client_ca", "tls_ca",
    "max_message_mb", "log_level", "log_format",
)  # fmt: skip


def relays_of(config: argparse.Namespace, heartbeats: HeartbeatConfig) -> HeartbeatRelays:
    """The file's heartbeats.relays (0: the scheduler takes every heartbeat)."""
    if heartbeats.relays and config.tls_cert and not config.tls_ca:
        raise ValueError(
            "heartbeats.relays with TLS needs --tls-ca: the relays call the scheduler over TLS"
        )
    if heartbeats.relay_port + heartbeats.relays > 65535:
        raise ValueError("heartbeats.relayPort must leave a port for each relay")
    options = {o.dest: o for o in OPTIONS}
    env = {options[name].env: str(getattr(config, name)) for name in RELAY_SETTINGS}
    host = config.listen.rpartition(":")[0]
    return HeartbeatRelays(heartbeats.relays, host, env, heartbeats.relay_port)


def _leadership(database_url: str) -> Leadership | None:
    """On PostgreSQL, the election's lock (state/leader.py), not yet taken; None on SQLite,
    where one scheduler runs alone."""
    try:
        url = database_url_of(database_url)
    except ValidationError as exc:
        raise ValueError(exc.message) from None
    return Leadership(url) if elects(url) else None


def _deposed(why: str) -> None:
    """Another scheduler leads, or led while this one's lock was lost. Stop acting at once
    (no clean stop: it would write to the store); the workers fence off anything in flight."""
    log.critical("leadership lost; exiting", extra={"error": why})
    logging.shutdown()
    os._exit(3)


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
    # The file first: a bad one is exit 2 with its problems, before anything starts.
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument(CONFIG_OPTION.flag, default=os.environ.get(CONFIG_OPTION.env, ""))
    known, _ = first.parse_known_args(args)
    try:
        loaded = load_configuration(known.config)
    except ConfigurationError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    return run_daemon(
        PROG,
        DESCRIPTION,
        OPTIONS,
        lambda config: build(config, loaded),
        args,
        preset=loaded.server_limits(),
    )
