"""The job commands of the `gearshift` CLI: submit, run, jobs, job, watch, logs, cancel,
cluster, health.

Exit codes scripts can rely on:
  0 success (for `watch`/`submit --wait`: the job succeeded)
  1 the job failed or was cancelled, or the server failed
  2 bad usage or invalid input (nothing was submitted)
  3 not found
  4 the scheduler cannot be reached
  5 timed out
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gearshift.client import render
from gearshift.client.options import client_tls
from gearshift.client.run_spec import RunOptions, run_job
from gearshift.client.sdk import Client, JobEvent
from gearshift.client.spec import JobFile, load_job
from gearshift.common.errors import (
    DeadlineExceededError,
    GearshiftError,
    NotFoundError,
    PermissionDeniedError,
    UnavailableError,
    ValidationError,
)
from gearshift.common.facts import TERMINAL_STATES
from gearshift.common.health import health_status
from gearshift.common.identity import create_job_key, create_token
from gearshift.v1 import common_pb2, scheduler_pb2

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_UNAVAILABLE = 4
EXIT_TIMEOUT = 5

_EXIT_FOR_ERROR: list[tuple[type[GearshiftError], int]] = [
    (ValidationError, EXIT_USAGE),
    (NotFoundError, EXIT_NOT_FOUND),
    (PermissionDeniedError, EXIT_FAILED),
    (UnavailableError, EXIT_UNAVAILABLE),
    (DeadlineExceededError, EXIT_TIMEOUT),
]


def exit_code_for(error: GearshiftError) -> int:
    return next((code for kind, code in _EXIT_FOR_ERROR if isinstance(error, kind)), EXIT_FAILED)


def _outcome(job_state: int) -> int:
    return EXIT_OK if job_state == common_pb2.JOB_STATE_SUCCEEDED else EXIT_FAILED


def _client(args: argparse.Namespace) -> Client:
    return Client(args.address, args.token or None, tls=client_tls(args), timeout=args.rpc_timeout)


def cmd_submit(args: argparse.Namespace) -> int:
    return _submit(args, load_job(args.file))  # a bad file raises before anything is sent


def cmd_run(args: argparse.Namespace) -> int:
    """A one-file job from the command line (see gearshift.client.run_spec)."""
    options = RunOptions(
        file=Path(args.file),
        ests=args.ests,
        steps=args.steps,
        data_size=args.data_size,
        batch_size=args.batch_size,
        min_devices=args.min_devices,
        max_devices=args.max_devices,
        name=args.name,
        config=args.config,
        determinism=args.determinism,
        types=tuple(t for t in args.types.split(",") if t),
        seed=args.seed,
    )
    return _submit(args, run_job(options))


def _submit(args: argparse.Namespace, job_file: JobFile) -> int:
    with _client(args) as client:
        working_dir = None
        if job_file.code is not None:
            upload = client.upload_code(job_file.code)
            what = "uploaded" if upload.uploaded else "already on the scheduler, nothing uploaded"
            print(
                f"code {upload.sha256[:12]} ({upload.files} files, {upload.size} bytes): {what}",
                file=sys.stderr,
            )
            working_dir = job_file.code
        job = client.submit(job_file.spec, idempotency_key=args.key, working_dir=working_dir)
        if args.wait:
            job = client.wait(job.job_id, timeout=args.timeout)
    if args.json:
        render.print_json(render.job_dict(job))
    else:
        print(job.job_id if not args.wait else f"{job.job_id} {render.state_name(job.state)}")
        if args.wait and job.state != common_pb2.JOB_STATE_SUCCEEDED and job.message:
            print(job.message, file=sys.stderr)
    return _outcome(job.state) if args.wait else EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    """Print a job's training-process output; with --follow, until the job ends."""
    with _client(args) as client:
        for line in client.logs(args.job_id, args.rank, args.tail, args.follow):
            if args.json:
                render.print_json(render.as_dict(line))
            else:
                print(f"[rank {line.rank}] {line.text}", flush=True)
    return EXIT_OK


def cmd_jobs(args: argparse.Namespace) -> int:
    with _client(args) as client:
        page = client.list(
            tenant=args.tenant,
            states=args.state,
            name_prefix=args.name_prefix,
            page_size=args.limit,
            page_token=args.page_token,
        )
    _note_standby(client)
    if args.json:
        render.print_json(render.as_dict(page))
    else:
        print(render.jobs_table(page.jobs))
        if page.next_page_token:
            print(f"more: --page-token {page.next_page_token}")
    return EXIT_OK


def cmd_job(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.get(args.job_id)
        _note_standby(client)
        if args.plot:
            return _plot_job(args, job, client.events(job.job_id))
    if args.json:
        render.print_json(render.job_dict(job))
    else:
        print(render.job_details(job))
    return EXIT_OK


def _note_standby(client: Client) -> None:
    """One line on stderr when a standby answered the client's last read."""
    if client.standby_leader is not None:
        print(render.standby_note(client.standby_leader), file=sys.stderr)


def _plot_job(args: argparse.Namespace, job: scheduler_pb2.Job, events: list[JobEvent]) -> int:
    try:
        from gearshift.client.jobplot import write_job_plot  # noqa: PLC0415 - an extra
    except ImportError:
        print("gearshift job --plot: needs matplotlib: pip install 'gearshift[plots]'",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    path = write_job_plot(job, events, time.time(), Path(args.plot))
    print(f"{job.job_id} {render.state_name(job.state)}: plot written to {path}")
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    """Print the job's events as they happen; the exit code tells how it ended."""
    with _client(args) as client:
        last_state = client.get(args.job_id).state
        for event in client.watch(args.job_id):
            last_state = event.state
            if args.json:
                render.print_json(render.as_dict(event))
            else:
                print(render.event_line(event), flush=True)
            if event.state in TERMINAL_STATES:
                break
        else:
            last_state = client.get(args.job_id).state
    return _outcome(last_state)


def cmd_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.cancel(args.job_id, reason=args.reason)
    if args.json:
        render.print_json(render.job_dict(job))
    else:
        print(f"{job.job_id} {render.state_name(job.state)}")
    return EXIT_OK


def cmd_scale(args: argparse.Namespace) -> int:
    if args.auto == (args.ps is not None or args.workers is not None):
        raise SystemExit("gearshift scale: give --ps and --workers, or --auto (not both)")
    if not args.auto and (args.ps is None or args.workers is None):
        raise SystemExit("gearshift scale: --ps and --workers go together")
    with _client(args) as client:
        job = client.scale(
            args.job_id,
            args.ps or 0,
            args.workers or 0,
            ps_cores=args.ps_cores,
            worker_cores=args.worker_cores,
            auto=args.auto,
        )
    if args.json:
        render.print_json(render.job_dict(job))
    elif args.auto:
        print(f"{job.job_id} {render.state_name(job.state)}: sized by the Brain's plans again")
    else:
        print(
            f"{job.job_id} {render.state_name(job.state)}: {args.ps} PS x {args.workers} "
            "workers from the next round (a checkpointed restart when the counts change)"
        )
    return EXIT_OK


def cmd_cluster(args: argparse.Namespace) -> int:
    with _client(args) as client:
        state = client.cluster()
    _note_standby(client)
    if args.json:
        render.print_json(render.as_dict(state))
    else:
        print(render.cluster_text(state))
    return EXIT_OK


def cmd_tenants(args: argparse.Namespace) -> int:
    with _client(args) as client:
        state = client.cluster()
    if args.json:
        render.print_json([render.as_dict(t) for t in state.tenants])
    else:
        print(render.tenants_text(state))
    return EXIT_OK


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Serve the web dashboard until Ctrl-C."""
    try:
        from gearshift.client.dashboard.server import serve  # noqa: PLC0415 - an extra
    except ImportError:
        print("gearshift dashboard: needs the dashboard extra: pip install 'gearshift[dashboard]'",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    return serve(args)


def cmd_token_create(args: argparse.Namespace) -> int:
    """A new token on stdout (shown once); its hash and role appended to the tokens file."""
    token = create_token(Path(args.file), args.role)
    print(token)
    print(f"{args.role} added to {args.file}; reload daemons with SIGHUP", file=sys.stderr)
    return EXIT_OK


def cmd_token_job_key(args: argparse.Namespace) -> int:
    """A new job key file, for the control plane's --job-key-file."""
    create_job_key(Path(args.file))
    print(f"job key written to {args.file}: give it to the scheduler, the Brain and the shard "
          "manager as --job-key-file, never to workers", file=sys.stderr)  # fmt: skip
    return EXIT_OK


def cmd_health(args: argparse.Namespace) -> int:
    tls = client_tls(args)
    rows = [
        (address, health_status(address, args.service, tls=tls, timeout=args.timeout))
        for address in args.addresses
    ]
    if args.json:
        render.print_json({address: status for address, status in rows})
    else:
        print(render.table(rows, ("ADDRESS", "HEALTH")))
    return EXIT_OK if all(status == "SERVING" for _, status in rows) else EXIT_FAILED


def run_command(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a command; typed errors become a one-line message and their exit code."""
    try:
        return command(args)
    except GearshiftError as exc:
        print(f"gearshift {args.command}: {exc.message}", file=sys.stderr)
        return exit_code_for(exc)
    except KeyboardInterrupt:
        return 130
