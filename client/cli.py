"""The `gearshift` command line: jobs, the cluster, the dev cluster, the simulator.

Exit codes: see gearshift.client.commands (0 success, 1 failed, 2 bad input,
3 not found, 4 unreachable, 5 timeout).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from gearshift import __version__
from gearshift.client import commands
from gearshift.client.commands import EXIT_FAILED, EXIT_OK, EXIT_USAGE, run_command
from gearshift.client.dashboard.options import add_options as add_dashboard_options
from gearshift.client.devcluster import (
    CONFIG_MODULE,
    DEFAULT_DASHBOARD,
    DEFAULT_WORKERS,
    ClusterConfig,
    ClusterTls,
    DevCluster,
    dashboard_installed,
    environment_hint,
    parse_workers,
)
from gearshift.client.history import add_options as add_history_options
from gearshift.client.history import cmd_history
from gearshift.client.options import add_scheduler_options, add_tls_options, pem_file
from gearshift.client.processes import DaemonError, http_status
from gearshift.client.profiles import add_plan_options, add_profile_options, cmd_plan, cmd_profile
from gearshift.client.render import parse_states, table
from gearshift.common.errors import ValidationError
from gearshift.common.facts import DEFAULT_DETERMINISM, DETERMINISM_LEVELS
from gearshift.common.health import health_status
from gearshift.common.signals import wait_for_signal
from gearshift.v1 import common_pb2

SIMULATOR_MODULE = "gearshift.scheduler.sim.simulate"


def cmd_simulate(argv: Sequence[str]) -> int:
    """Run the scheduler's simulator as a subprocess (the client imports no service package)
    and pass its exit code through; needs the `scheduler` extra installed."""
    return subprocess.call([sys.executable, "-m", SIMULATOR_MODULE, *argv])


def cmd_config(argv: Sequence[str]) -> int:
    """`gearshift config`: the scheduler's configuration module, as a subprocess."""
    return subprocess.call([sys.executable, "-m", CONFIG_MODULE, *argv])


def cluster_tls(args: argparse.Namespace) -> ClusterTls | None:
    """`gearshift up`'s TLS flags: none, or at least a certificate, its key and a CA."""
    given = {
        flag: getattr(args, flag[2:].replace("-", "_"))
        for flag in ("--tls-cert", "--tls-key", "--tls-ca", "--tls-client-ca")
    }
    if not any(given.values()):
        return None
    for flag, value in given.items():
        if not value and flag != "--tls-client-ca":
            raise ValidationError(
                flag, "is required for TLS (with --tls-cert, --tls-key, --tls-ca)"
            )
    files = {flag: pem_file(flag, value).resolve() for flag, value in given.items() if value}
    return ClusterTls(
        files["--tls-cert"], files["--tls-key"], files["--tls-ca"], files.get("--tls-client-ca")
    )


def cmd_up(args: argparse.Namespace) -> int:
    try:
        workers = parse_workers(args.workers)
        tls = cluster_tls(args)
    except ValidationError as exc:
        print(f"gearshift up: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    config = ClusterConfig(
        run_dir=Path(args.run_dir),
        host=args.host,
        base_port=args.base_port,
        workers=workers,
        postgres_url=args.postgres_url,
        redis_url=args.redis_url,
        scheduler_config=Path(args.config) if args.config else None,
        token=args.token,
        dashboard=args.dashboard if dashboard_installed() else "",
        tls=tls,
    )
    cluster = DevCluster(config)
    if args.dashboard and not config.dashboard:
        print("gearshift up: no dashboard: pip install 'gearshift[dashboard]' for it", flush=True)
    print(f"gearshift up: starting the dev cluster (logs in {cluster.logs}/)", flush=True)
    try:
        cluster.start(timeout=args.timeout)
    except ValidationError as exc:
        print(f"gearshift up: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except (DaemonError, TimeoutError) as exc:
        print(f"gearshift up: {exc}", file=sys.stderr)
        return EXIT_FAILED
    health: dict[str, Callable[[str], str]] = {
        "redis": lambda _: "-",
        "dashboard": lambda url: http_status(url + "healthz"),
    }

    def grpc_health(address: str) -> str:
        return health_status(address, tls=cluster.client_tls)

    rows = [
        (r.name, r.address, health.get(r.name, grpc_health)(r.address), r.metrics, r.log)
        for r in cluster.rows()
    ]
    print(table(rows, ("SERVICE", "ADDRESS", "HEALTH", "METRICS", "LOG")))
    healthy = all(row[2] in ("SERVING", "-") for row in rows)
    daemons = [row for row in rows if row[0] in cluster.daemons]
    print(f"{sum(r[2] == 'SERVING' for r in daemons)}/{len(cluster.daemons)} daemons healthy.")
    if cluster.dashboard_url:
        print(f"Dashboard: {cluster.dashboard_url}")
    hint = environment_hint(cluster.address("scheduler"), cluster.client_tls)
    if hint:
        print(f"For the other commands: {hint}")
    if args.check or not healthy:
        stopped = cluster.stop()
        print("stopped: " + ", ".join(f"{name} (exit {code})" for name, code in stopped))
        clean = all(code == 0 for _, code in stopped)
        return EXIT_OK if healthy and clean else EXIT_FAILED
    print("Press Ctrl-C to stop the cluster.", flush=True)
    try:
        wait_for_signal()
    finally:
        stopped = cluster.stop()
        print("\nstopped: " + ", ".join(f"{name} (exit {code})" for name, code in stopped))
    return EXIT_OK


def _states(text: str) -> list[common_pb2.JobState.ValueType]:
    """ "running,queued" -> the JobState values; argparse reports an unknown name."""
    try:
        return parse_states(text)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(exc.problem) from None


def _job_options() -> argparse.ArgumentParser:
    """Options every job command takes (given after the command: `gearshift jobs --json`)."""
    shared = argparse.ArgumentParser(add_help=False)
    add_scheduler_options(shared)
    shared.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return shared


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gearshift",
        description="Gearshift: elastic, bitwise-deterministic training on shared GPU clusters.",
        epilog="Exit codes: 0 ok, 1 failed, 2 bad input, 3 not found, 4 unreachable, 5 timeout.",
    )
    parser.add_argument("--version", action="version", version=f"gearshift {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    shared = _job_options()

    submit = sub.add_parser(
        "submit",
        parents=[shared],
        help="submit a job from a YAML file",
        description="Validate the job file, submit it, print the job id.",
    )
    submit.add_argument("file", help="job YAML (see `gearshift.client.spec` for the format)")
    submit.add_argument("--key", help="idempotency key: resubmitting with it returns the same job")
    submit.add_argument("--wait", action="store_true", help="wait until the job ends")
    submit.add_argument("--timeout", type=float, help="with --wait: give up after these seconds")
    submit.set_defaults(func=commands.cmd_submit)

    run = sub.add_parser(
        "run",
        parents=[shared],
        help="submit a job of your own one-file code, no YAML needed",
        description="Package FILE (it defines build(config) -> gearshift.worker.runtime.Job), "
        "upload it unless the scheduler has it, submit the job, print its id.",
    )
    run.add_argument("file", metavar="FILE", help="the training script, e.g. train.py")
    run.add_argument("--ests", type=int, required=True, help="N, the job's ESTs")
    run.add_argument("--steps", type=int, required=True, help="global steps to train")
    run.add_argument(
        "--data-size", type=int, default=0, help="samples (default: DATASET_SIZE in FILE)"
    )
    run.add_argument("--batch-size", type=int, default=0, help="global batch (default 8 x ESTs)")
    run.add_argument("--min-devices", type=int, default=1, help="elastic lower bound")
    run.add_argument("--max-devices", type=int, default=0, help="elastic upper bound (ESTs)")
    run.add_argument("--name", default="", help="job name (default: the file's name)")
    run.add_argument("--config", default="{}", help="JSON object passed to build(config)")
    run.add_argument("--determinism", default=DEFAULT_DETERMINISM, choices=DETERMINISM_LEVELS)
    run.add_argument("--types", default="", help="accelerator types allowed, e.g. v100,t4")
    run.add_argument("--seed", type=int, default=0, help="the job's one seed")
    run.add_argument("--key", help="idempotency key: resubmitting with it returns the same job")
    run.add_argument("--wait", action="store_true", help="wait until the job ends")
    run.add_argument("--timeout", type=float, help="with --wait: give up after these seconds")
    run.set_defaults(func=commands.cmd_run)

    jobs = sub.add_parser("jobs", parents=[shared], help="list jobs, newest first")
    jobs.add_argument("--tenant", default="", help="only this tenant's jobs")
    jobs.add_argument("--state", type=_states, default=[], help="e.g. running,queued")
    jobs.add_argument("--name-prefix", default="", help="only names starting with this")
    jobs.add_argument("--limit", type=int, default=0, help="page size (default 100)")
    jobs.add_argument("--page-token", default="", help="the token printed after a full page")
    jobs.set_defaults(func=commands.cmd_jobs)

    history = sub.add_parser(
        "history",
        help="what the Brain remembers of past jobs",
        description="`gearshift history [MODEL_TYPE]` lists the jobs the Brain has recorded "
        "(newest first; the history its estimates learn from); `--job ID` shows one job's "
        "nodes, runtime samples and issued plans. Needs an admin or service token on a "
        "cluster with --tokens-file.",
    )
    add_history_options(history)
    history.add_argument("--json", action="store_true", help="print JSON")
    history.set_defaults(func=cmd_history)

    profile = sub.add_parser(
        "profile",
        help="measure a job's model layer by layer and store the profile in the Brain",
        description="Trace the job's model (torch.fx; branches allowed) and measure each "
        "layer's forward + backward time at per-device batch B/g for g = 1, 2, 4, ..., its "
        "output and parameter bytes; store the profile in the Brain under the job spec's "
        "fingerprint (what `gearshift plan --burst` plans over). Runs "
        "python -m gearshift.worker.profiling.profile_job; needs the worker extra (torch). "
        "With --rubick: Rubick's profiling run instead (the training step timed at a few "
        "per-EST batches, ESTs per process, GC off/on and thread counts), stored and fitted "
        "in the Brain (python -m gearshift.worker.profiling.rubick_run).",
    )
    add_profile_options(profile)
    profile.set_defaults(func=cmd_profile)

    plan = sub.add_parser(
        "plan",
        help="DeepPool's burst-parallel plan of a profiled job",
        description="Ask the Brain (PlanBurstParallel) for the per-layer device counts of "
        "least iteration time within an amplification limit, over the profile `gearshift "
        "profile` stored for the same job file; print them with the predicted iteration "
        "time, device-seconds and amplification. The runtime executes data-parallel plans: "
        "the plan decides how many devices the job should hold.",
    )
    add_plan_options(plan)
    plan.set_defaults(func=cmd_plan)

    job = sub.add_parser("job", parents=[shared], help="show one job")
    job.add_argument("job_id", metavar="ID")
    job.add_argument(
        "--plot",
        metavar="FILE",
        help="write the job's devices by type over time and its loss curve as a PNG",
    )
    job.set_defaults(func=commands.cmd_job)

    watch = sub.add_parser(
        "watch",
        parents=[shared],
        help="follow a job's events until it ends",
        description="Print each event (step, loss, devices by type, ESTs per device, "
        "samples/s) as it happens; exit 0 if the job succeeds, 1 if it fails or is cancelled.",
    )
    watch.add_argument("job_id", metavar="ID")
    watch.set_defaults(func=commands.cmd_watch)

    logs = sub.add_parser(
        "logs",
        parents=[shared],
        help="print a job's training-process output",
        description="The last lines of each rank's output, read from the workers through the "
        "scheduler; with --follow, new lines as they are written until the job ends.",
    )
    logs.add_argument("job_id", metavar="ID")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing new lines")
    logs.add_argument("--rank", type=int, default=-1, help="only this process rank")
    logs.add_argument("--tail", type=int, default=100, help="lines of history per rank")
    logs.set_defaults(func=commands.cmd_logs)

    cancel = sub.add_parser("cancel", parents=[shared], help="cancel a job")
    cancel.add_argument("job_id", metavar="ID")
    cancel.add_argument("--reason", default="cancelled from the CLI", help="recorded with the job")
    cancel.set_defaults(func=commands.cmd_cancel)

    scale = sub.add_parser(
        "scale",
        parents=[shared],
        help="set a parameter-server job's PS and worker counts",
        description="Pin a PS job's counts (and optionally cores per process) over the "
        "Brain's plans; the scheduler applies them at its next round by stop (checkpoint) -> "
        "restart, the embedding rows re-partitioned. --auto hands the job back to the Brain. "
        "Also spelled `gearshift job scale ID ...`.",
    )
    scale.add_argument("job_id", metavar="ID")
    scale.add_argument("--ps", type=int, help="PS processes (1..spec max_ps)")
    scale.add_argument("--workers", type=int, help="worker processes (1..spec max_workers)")
    scale.add_argument("--ps-cores", type=float, default=0.0, help="cores per PS (0: keep)")
    scale.add_argument("--worker-cores", type=float, default=0.0, help="cores per worker (0: keep)")
    scale.add_argument("--auto", action="store_true", help="clear the counts: the Brain plans")
    scale.set_defaults(func=commands.cmd_scale)

    cluster = sub.add_parser(
        "cluster", parents=[shared], help="workers, devices, and which job runs where"
    )
    cluster.set_defaults(func=commands.cmd_cluster)

    tenants = sub.add_parser(
        "tenants",
        parents=[shared],
        help="tenants' quotas for guaranteed jobs, and the devices their jobs use",
        description="Each tenant's quota (the scheduler's --tenants-file, devices per type), "
        "the devices its guaranteed jobs hold within it, all devices its running jobs hold, "
        "and its job counts.",
    )
    tenants.set_defaults(func=commands.cmd_tenants)

    up = sub.add_parser(
        "up",
        help="run the dev cluster as local processes",
        description="Start Redis (unless --redis-url), the Brain and the scheduler on SQLite "
        "(unless --postgres-url), the shard manager and worker daemons; wait until all serve, "
        "print addresses and log files; Ctrl-C stops everything.",
    )
    up.add_argument(
        "--workers",
        default=DEFAULT_WORKERS,
        help="one worker daemon per TYPE:COUNT item (default %(default)s)",
    )
    up.add_argument("--postgres-url", default="", help="use this PostgreSQL instead of SQLite")
    up.add_argument("--redis-url", default="", help="use this Redis instead of starting one")
    up.add_argument("--host", default="127.0.0.1", help="interface the daemons listen on")
    up.add_argument(
        "--base-port",
        type=int,
        default=50051,
        help="scheduler port; brain, shard manager and workers take the next ones (0: free ports)",
    )
    up.add_argument("--run-dir", default=".gearshift/run", help="logs, databases, checkpoints")
    up.add_argument(
        "--config",
        default="",
        metavar="FILE",
        help="the scheduler's configuration file (gearshift config defaults prints one); "
        "default: the defaults (the union profile), with the dev cluster's 5 s rounds, 1 s "
        "heartbeats and placements exempt from moves for 10 s",
    )
    up.add_argument(
        "--token",
        default=os.environ.get("GEARSHIFT_TOKEN", ""),
        help="bearer token for every daemon [env GEARSHIFT_TOKEN]",
    )
    up.add_argument(
        "--dashboard",
        default=DEFAULT_DASHBOARD,
        metavar="HOST:PORT",
        help="where the web dashboard listens (default %(default)s; any free port with "
        "--base-port 0; empty: no dashboard)",
    )
    for flag, what in (
        ("--tls-cert", "PEM certificate every daemon serves and presents to the others (TLS)"),
        ("--tls-key", "PEM private key of --tls-cert"),
        ("--tls-ca", "PEM CA that signed --tls-cert: what the daemons and this launcher trust"),
        ("--tls-client-ca", "PEM CA whose certificates clients must present (mTLS; optional)"),
    ):
        up.add_argument(flag, default="", metavar="FILE", help=what)
    up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each daemon")
    up.add_argument(
        "--check", action="store_true", help="start, print health, stop (exit 0 if all healthy)"
    )
    up.set_defaults(func=cmd_up)

    dashboard = sub.add_parser(
        "dashboard",
        help="serve web pages of the jobs and the cluster",
        description="A web dashboard over the scheduler's API: jobs (filter, sort), each job's "
        "devices and ESTs over time, loss and samples/s curves, events, log tail and cancel "
        "button, and the cluster; pages refresh every few seconds. Ctrl-C stops it.",
    )
    add_dashboard_options(dashboard)
    dashboard.set_defaults(func=commands.cmd_dashboard)

    health = sub.add_parser(
        "health",
        help="show the gRPC health of daemons",
        description="Ask each daemon for its health; exit 0 only if all are SERVING.",
    )
    health.add_argument("addresses", nargs="+", metavar="HOST:PORT")
    health.add_argument("--timeout", type=float, default=2.0, help="seconds per daemon")
    health.add_argument(
        "--service",
        default="",
        help="the health name to ask for (empty: the daemon as a whole); "
        "gearshift.scheduler.leader is SERVING only on the scheduler that leads",
    )
    health.add_argument("--json", action="store_true", help="print JSON")
    add_tls_options(health)
    health.set_defaults(func=commands.cmd_health)

    token = sub.add_parser(
        "token",
        help="make a bearer token for an identity",
        description="`gearshift token create --role tenant:alice --file tokens` prints a new "
        "token once and appends its SHA-256 with the role to the tokens file that daemons read "
        "with --tokens-file (send them SIGHUP to reload it).",
    )
    token_sub = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = token_sub.add_parser("create", help="print a new token, record its hash")
    create.add_argument(
        "--role", required=True, help="admin, service, tenant:NAME or worker:WORKER_ID"
    )
    create.add_argument(
        "--file",
        default=os.environ.get("GEARSHIFT_TOKENS_FILE", "tokens"),
        help="the tokens file (created 0600 if missing) [env GEARSHIFT_TOKENS_FILE]",
    )
    create.set_defaults(func=commands.cmd_token_create)
    job_key = token_sub.add_parser(
        "job-key",
        help="make the key the scheduler mints each job's token with",
        description="`gearshift token job-key --file job.key` writes a new random key (0600; "
        "an existing file is never overwritten). Give the same file to the scheduler, the "
        "Brain and the shard manager as --job-key-file (with --tokens-file), never to workers: "
        "each training process then calls with a token scoped to its own job.",
    )
    job_key.add_argument(
        "--file",
        default=os.environ.get("GEARSHIFT_JOB_KEY_FILE", "job.key"),
        help="where to write the key [env GEARSHIFT_JOB_KEY_FILE]",
    )
    job_key.set_defaults(func=commands.cmd_token_job_key)

    sub.add_parser(
        "simulate",
        help="simulate a workload with the scheduler's policies (see `gearshift simulate -h`)",
        description="Forwarded to python -m gearshift.scheduler.sim.simulate.",
        add_help=False,
    )
    sub.add_parser(
        "config",
        help="the scheduler's configuration file: defaults, check FILE, plugins "
        "(see `gearshift config -h`)",
        description="Forwarded to python -m gearshift.scheduler.config.cli.",
        add_help=False,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["simulate"]:
        return cmd_simulate(arguments[1:])
    if arguments[:1] == ["config"]:
        return cmd_config(arguments[1:])
    if arguments[:2] == ["job", "scale"]:  # `gearshift job scale ID`: the scale command
        arguments = arguments[1:]
    args = build_parser().parse_args(arguments)
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
