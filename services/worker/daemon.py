"""The worker daemon: flags, the agent, the scheduler link, serving.

On SIGTERM it stops serving, asks every task to checkpoint at its next global
step (waiting up to --stop-timeout, then killing), reports the tasks' ends to
the scheduler and exits 0. Killed with SIGKILL, it takes its training
processes with it (see spawner.py): to the scheduler that is a lost node.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from gearshift.common.auth import TOKEN_VARIABLE
from gearshift.common.channel import channel_target
from gearshift.common.config import Option, advertise_address, host_port, parse_bool
from gearshift.common.daemon import Daemon, outgoing_tls, run_daemon, server_options
from gearshift.common.errors import GearshiftError
from gearshift.common.server import GrpcServer, register
from gearshift.common.validation import check_name
from gearshift.v1 import worker_pb2, worker_pb2_grpc
from gearshift.worker.agent import Agent
from gearshift.worker.cgroups import Cgroups
from gearshift.worker.collocation import DEFAULT_MAX_SLOWDOWN, DEFAULT_PAUSE_S, Policy
from gearshift.worker.command import CommandSettings
from gearshift.worker.devices import parse_devices, parse_memory
from gearshift.worker.registration import SchedulerLink, default_worker_id
from gearshift.worker.resources import detect_cores, detect_memory, offered_cores
from gearshift.worker.servicer import WorkerAgentServicer

log = logging.getLogger("gearshift.worker")

PROG = "gearshift-worker"
DEFAULT_PORT = 50054
OPTIONS = [
    *server_options(DEFAULT_PORT),
    Option(
        "scheduler",
        "scheduler host:port to register with, or the leader's and its standbys' IP:PORT "
        "comma-separated (the one serving is used; empty: serve WorkerAgent without "
        "registering)",
        "",
    ),
    Option(
        "devices",
        "devices offered, TYPE:COUNT[:MEMORY],... (e.g. v100:2 or v100:1,t4:1:16GiB); on a "
        "machine without accelerators each device is a CPU slot with that type label",
        "cpu:1",
    ),
    Option(
        "cpu_cores",
        "CPU cores offered to training processes: the first N of those this daemon may use "
        "(0: all of them, its affinity)",
        0,
        int,
    ),
    Option(
        "memory",
        "host memory offered to training processes, e.g. 8G or 512MiB (empty: MemTotal of "
        "/proc/meminfo)",
        "",
    ),
    Option("worker_id", "this worker's id (empty: <hostname>-<port>)", ""),
    Option(
        "advertise_address",
        "host:port the scheduler dials to reach this worker (empty: the bound listen address)",
        "",
    ),
    Option(
        "work_dir",
        "folder for the training processes' logs and per-task files (empty: "
        ".gearshift/workers/<worker-id>)",
        "",
    ),
    Option(
        "accelerator",
        "what a device is: cpu (a CPU slot; a job's processes talk over gloo) or cuda "
        "(device i is GPU i; each process of a task sees the task's GPUs on this worker in "
        "CUDA_VISIBLE_DEVICES and takes its own; a job's processes talk over NCCL when each "
        "has a GPU of its own, as the scheduler's placements give, else over gloo with host "
        "copies)",
        "cpu",
        choices=["cpu", "cuda"],
    ),
    Option(
        "checkpoint_every",
        "checkpoint every this many global steps when the job's spec says 0",
        20,
        int,
    ),
    Option("log_every", "training progress every this many global steps", 5, int),
    Option(
        "report_interval",
        "seconds between rank 0's runtime-sample reports to the Brain",
        1.0,
        float,
    ),
    Option(
        "process_group_timeout",
        "seconds a training process waits for its peers (rendezvous, collectives) before failing",
        120.0,
        float,
    ),
    Option(
        "zygote",
        "fork training processes from a process that has imported torch once (a rescale "
        "then spends no time importing torch; D2 jobs always start a fresh interpreter)",
        True,
        parse_bool,
    ),
    Option(
        "max_foreground_slowdown",
        "multiplexing (DeepPool): pause a background task while its foreground job's step "
        "time is above (1 + this) x its step time alone; a task's "
        "collocation.max_foreground_slowdown overrides it",
        DEFAULT_MAX_SLOWDOWN,
        float,
    ),
    Option(
        "pause_seconds",
        "multiplexing: seconds a background task stays paused before the foreground is "
        "measured with it running again (the foreground's step time alone is measured anew "
        "meanwhile)",
        DEFAULT_PAUSE_S,
        float,
    ),
    Option(
        "step_delay",
        "FOR TESTS ONLY: every training process this worker starts sleeps this many seconds "
        "in each global step, making the worker slow on purpose (the scheduler's straggler "
        "detection then marks it degraded); the values the job computes do not change",
        0.0,
        float,
    ),
    Option(
        "index_log_dir",
        "dynamic-mode jobs: every training process appends each shard it reads (step, EST, "
        "epoch, sample indices), its releases and its checkpoint covers to a file of its own "
        "in this folder, so a test can count what was read and what was read again (empty: "
        "off)",
        "",
    ),
    Option(
        "stop_timeout",
        "on SIGTERM, seconds each task gets to checkpoint and exit before it is killed",
        60.0,
        float,
    ),
]
DESCRIPTION = "Gearshift worker daemon: runs training processes on this machine's devices."


def _check(config: argparse.Namespace) -> None:
    """Settings that make no sense fail the start with the flag's name (ValueError)."""
    try:
        check_name(config.worker_id, "--worker-id", required=False)
    except GearshiftError as exc:
        raise ValueError(exc.message) from None
    for flag in ("scheduler", "advertise_address"):
        value = getattr(config, flag)
        if value:
            try:
                for address in value.split(",") if flag == "scheduler" else [value]:
                    host_port(address.strip())
                channel_target(value)  # several schedulers: IP literals (channel.py)
            except ValueError as exc:
                raise ValueError(f"--{flag.replace('_', '-')}: {exc}") from None
            except GearshiftError as exc:
                raise ValueError(f"--{flag.replace('_', '-')}: {exc.message}") from None
    for flag in ("checkpoint_every", "log_every"):
        if getattr(config, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1")
    if not config.step_delay >= 0:
        raise ValueError("--step-delay must be >= 0")
    if not config.max_foreground_slowdown >= 0:
        raise ValueError("--max-foreground-slowdown must be >= 0")
    for flag in ("report_interval", "process_group_timeout", "stop_timeout", "pause_seconds"):
        if not getattr(config, flag) > 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be > 0")


def _resources(config: argparse.Namespace) -> tuple[list[int], int]:
    """The cores and memory bytes offered (flags, else detected); ValueError naming the flag."""
    try:
        cores = offered_cores(config.cpu_cores, detect_cores())
    except GearshiftError as exc:
        raise ValueError(exc.message) from None
    if not config.memory:
        return cores, detect_memory()
    try:
        memory = parse_memory(config.memory)
    except ValueError as exc:
        raise ValueError(f"--memory: {exc}") from None
    if memory < 1:
        raise ValueError("--memory must be > 0")
    return cores, memory


def build(config: argparse.Namespace) -> Daemon:
    _check(config)
    try:
        devices = parse_devices(config.devices)
    except GearshiftError as exc:
        raise ValueError(exc.message) from None
    cores, memory = _resources(config)
    # Before the agent starts the zygote: the daemon moves itself into its own leaf cgroup.
    cgroups, why = Cgroups.probe()
    if cgroups is None:
        log.info(
            "cgroup v2 not used: CPU affinity and an RSS watchdog hold the processes",
            extra={"why": why},
        )
    else:
        log.info("cgroup v2: a cgroup per training process", extra={"under": str(cgroups.base)})
    settings = CommandSettings(
        python=sys.executable,
        checkpoint_every=config.checkpoint_every,
        log_every=config.log_every,
        report_interval=config.report_interval,
        process_group_timeout=config.process_group_timeout,
        accelerator=config.accelerator,
        zygote=config.zygote,
        step_delay=config.step_delay,
        index_log_dir=Path(config.index_log_dir).absolute() if config.index_log_dir else None,
    )
    token, tls = config.token or None, outgoing_tls(config)
    env = {TOKEN_VARIABLE: config.token} if token else {}
    if tls is not None:
        env |= tls.environment()  # the training processes call the same daemons
    agent = Agent(
        config.worker_id or "unassigned",
        devices,
        Path(config.work_dir or ".gearshift/workers/unassigned"),
        settings,
        env=os.environ | env,
        collocation=Policy(
            max_slowdown=config.max_foreground_slowdown, pause_s=config.pause_seconds
        ),
        cores=cores,
        memory_bytes=memory,
        cgroups=cgroups,
    )
    links: list[SchedulerLink] = []

    def on_start(server: GrpcServer) -> None:
        host = config.listen.rpartition(":")[0]
        if not config.worker_id:
            agent.worker_id = default_worker_id(socket.gethostname(), server.port)
        if not config.work_dir:
            agent.work_dir = Path(".gearshift/workers") / agent.worker_id
        agent.work_dir = agent.work_dir.absolute()
        advertise = config.advertise_address or advertise_address(host, server.port)
        if not config.scheduler:
            log.warning("no --scheduler: serving WorkerAgent without registering")
            return
        scheduler_link = SchedulerLink(
            config.scheduler, agent, advertise=advertise, token=token, tls=tls
        )
        links.append(scheduler_link)
        scheduler_link.start()

    def on_stop() -> None:
        agent.shutdown(config.stop_timeout)
        for scheduler_link in links:
            scheduler_link.close()

    service = worker_pb2.DESCRIPTOR.services_by_name["WorkerAgent"].full_name
    servicer = WorkerAgentServicer(agent)
    return Daemon(
        [register(worker_pb2_grpc.add_WorkerAgentServicer_to_server, servicer, service)],
        on_start=on_start,
        on_stop=[on_stop],
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_daemon(PROG, DESCRIPTION, OPTIONS, build, argv)
