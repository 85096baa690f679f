"""`gearshift history`: what the Brain remembers of past jobs (ListJobRecords, GetJobHistory).

The Brain keeps every job's record, its nodes, its runtime samples and the plans it
issued; this is how a person reads them without SQL: the jobs of one model type (the
history the Brain's estimates learn from), or one job's samples and plans.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

from gearshift.client import render
from gearshift.client.options import add_brain_options, brain_channel, client_tls
from gearshift.common.errors import ValidationError, typed_call
from gearshift.v1 import brain_pb2, brain_pb2_grpc, common_pb2

STATUSES = ("submitted", "running", "succeeded", "failed", "cancelled")
Record = brain_pb2.JobRecord


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model_type",
        nargs="?",
        default="",
        metavar="MODEL_TYPE",
        help="only jobs of this model type (default: every job)",
    )
    add_brain_options(parser, "bearer token (an admin's or a service's)")
    parser.add_argument("--tenant", default="", help="only this tenant's jobs")
    parser.add_argument("--status", default="", help=f"only jobs {'/'.join(STATUSES)}")
    parser.add_argument("--limit", type=int, default=50, help="jobs to show (default 50)")
    parser.add_argument("--job", default="", metavar="ID", help="one job: its samples and plans")


def cmd_history(args: argparse.Namespace) -> int:
    if args.status and args.status not in STATUSES:
        raise ValidationError("--status", f"{args.status!r}: one of {', '.join(STATUSES)}")
    if args.limit < 1:
        raise ValidationError("--limit", "must be >= 1")
    with brain_channel(args, client_tls(args)) as channel:
        brain = brain_pb2_grpc.BrainStub(channel)
        if args.job:
            request = brain_pb2.GetJobHistoryRequest(job_id=args.job)
            history = typed_call(lambda: brain.GetJobHistory(request))
            if args.json:
                render.print_json(render.as_dict(history))
            else:
                print(job_history(history))
            return 0
        records = list_records(brain, args)
    if args.json:
        render.print_json([render.as_dict(r) for r in records])
    else:
        print(records_table(records, time.time()))
    return 0


def list_records(brain: brain_pb2_grpc.BrainStub, args: argparse.Namespace) -> list[Record]:
    """Up to --limit records, newest first, following the Brain's pages."""
    records: list[Record] = []
    token = ""
    while len(records) < args.limit:
        request = brain_pb2.ListJobRecordsRequest(
            model_type=args.model_type,
            tenant=args.tenant,
            status=args.status,
            page=common_pb2.PageRequest(
                page_size=min(args.limit - len(records), 100), page_token=token
            ),
        )
        page = typed_call(lambda: brain.ListJobRecords(request))  # noqa: B023 - called at once
        records.extend(page.jobs)
        token = page.next_page_token
        if not token:
            break
    return records


def _span(start: float, end: float, now: float) -> str:
    """How long the job ran (until now while it runs), as `age` writes times."""
    return render.age(start, end or now) if start > 0 else "-"


def records_table(records: Sequence[Record], now: float) -> str:
    if not records:
        return "no jobs recorded"
    rows = [
        (
            r.job_id,
            r.spec.name,
            r.spec.model_type or "-",
            r.spec.tenant or "-",
            r.status,
            render.age(r.submitted_at, now) + " ago" if r.submitted_at else "-",
            _span(r.started_at, r.finished_at, now),
            r.exit_reason or "",
        )
        for r in records
    ]
    header = ("JOB", "NAME", "MODEL TYPE", "TENANT", "STATUS", "SUBMITTED", "RAN", "EXIT")
    return render.table(rows, header)


def job_history(history: brain_pb2.JobHistory) -> str:
    """One job: its record, nodes, a summary of its samples, and the plans it was given."""
    job = history.job
    lines = [
        f"{job.job_id}  {job.spec.name}  model type {job.spec.model_type or '-'}  {job.status}",
    ]
    if job.exit_reason:
        lines.append(f"exit: {job.exit_reason}")
    for node in history.nodes:
        role = brain_pb2.NodeRole.Name(node.role).removeprefix("NODE_ROLE_").lower()
        lines.append(f"node {node.node_id}: {role}, {node.status or '-'} {node.exit_reason}")
    samples = list(history.samples)
    if samples:
        rates = [s.samples_per_second for s in samples if s.samples_per_second > 0]
        mean = f"{statistics.fmean(rates):.1f}" if rates else "-"
        lines.append(
            f"samples: {len(samples)}, steps {samples[0].step}-{samples[-1].step}, "
            f"mean {mean} samples/s"
        )
    else:
        lines.append("samples: none")
    for issued in history.plans:
        lines.append(f"plan {issued.plan_id}: {render.as_dict(issued.plan)}")
    return "\n".join(lines)
