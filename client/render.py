"""How the CLI shows jobs, events and the cluster: human tables, or JSON for scripts."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from google.protobuf import json_format
from google.protobuf.message import Message

from gearshift.common import execplan
from gearshift.common.errors import ValidationError
from gearshift.v1 import common_pb2, scheduler_pb2

GUARANTEED = common_pb2.SERVICE_CLASS_GUARANTEED


def as_dict(message: Message) -> dict[str, Any]:
    """A message as plain data with proto field names (the `--json` shape)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def job_dict(job: scheduler_pb2.Job) -> dict[str, Any]:
    """A job as plain data, its execution plan with every field (defaults included)."""
    data = as_dict(job)
    data["plan"] = execplan.as_dict(job.plan)
    return data


def plan_text(job: scheduler_pb2.Job) -> str:
    """The job's execution plan and the dimensions its spec lets the scheduler change."""
    allowed = job.spec.plan_dimensions
    names = [
        name
        for name, on in (
            ("gc", allowed.gradient_checkpointing),
            ("threads", allowed.threads),
            ("offload", allowed.offload_optimizer),
        )
        if on
    ]
    return f"{execplan.describe(job.plan)}  (may change: {', '.join(['ESTs/device', *names])})"


def print_json(data: Any, stream: TextIO | None = None) -> None:
    print(json.dumps(data, indent=2, sort_keys=True), file=stream or sys.stdout)


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """Left-aligned columns separated by two spaces."""
    cells = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def state_name(state: int) -> str:
    return common_pb2.JobState.Name(state).removeprefix("JOB_STATE_").lower()  # type: ignore[arg-type]


def parse_states(text: str) -> list[common_pb2.JobState.ValueType]:
    """ "running,queued" -> the JobState values; ValidationError names an unknown one."""
    known: list[str] = list(common_pb2.JobState.keys())  # an EnumTypeWrapper, not a dict
    states = []
    for name in (part.strip() for part in text.split(",") if part.strip()):
        full = "JOB_STATE_" + name.upper()
        if full not in known or full.endswith("UNSPECIFIED"):
            choices = ", ".join(k.removeprefix("JOB_STATE_").lower() for k in known[1:])
            raise ValidationError("state", f"unknown state {name!r} (choose from {choices})")
        states.append(common_pb2.JobState.Value(full))
    return states


def event_name(kind: int) -> str:
    name = scheduler_pb2.JobEventType.Name(kind)  # type: ignore[arg-type]
    return name.removeprefix("JOB_EVENT_TYPE_").lower()


def devices_by_type(placement: common_pb2.Placement) -> str:
    """E.g. "v100x2 t4x1"; "-" when the job has no devices."""
    counts = Counter(p.accelerator_type for p in placement.processes)
    return " ".join(f"{kind}x{n}" for kind, n in sorted(counts.items())) or "-"


def ests_per_device(placement: common_pb2.Placement) -> str:
    """ESTs on each device in rank order, e.g. "2,1,1"; "-" when not placed."""
    return ",".join(str(len(p.est_ids)) for p in placement.processes) or "-"


def age(since: float, now: float | None = None) -> str:
    if since <= 0:
        return "-"
    seconds = max(0, int((now or time.time()) - since))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def step_text(progress: common_pb2.JobProgress) -> str:
    if progress.total_steps:
        return f"{progress.step}/{progress.total_steps}"
    return str(progress.step)


def standby_note(leader: str) -> str:
    """The line that says a standby scheduler answered (Client.standby_leader)."""
    where = f"the leader is {leader}" if leader else "no leader is known yet (a takeover)"
    return (
        "gearshift: answered by a standby scheduler, from the database as the leader last "
        f"committed it (no queue positions or waiting reasons); {where}"
    )


def jobs_table(jobs: Sequence[scheduler_pb2.Job]) -> str:
    rows = [
        (
            job.job_id,
            job.spec.name,
            state_name(job.state),
            f"#{job.queue_position}" if job.queue_position else "-",
            step_text(job.progress),
            devices_by_type(job.placement),
            ests_per_device(job.placement),
            f"{job.progress.samples_per_second:.1f}" if job.progress.samples_per_second else "-",
            age(job.submitted_at),
        )
        for job in jobs
    ]
    header = ("ID", "NAME", "STATE", "QUEUE", "STEP", "DEVICES", "ESTS/DEVICE", "SAMPLES/S", "AGE")
    return table(rows, header)


def collocation_text(collocation: common_pb2.Collocation, paused: bool) -> str:
    """How a job shares its devices, in words."""
    role = common_pb2.CollocationRole.Name(collocation.role)
    role = role.removeprefix("COLLOCATION_ROLE_").lower()
    text = f"{role} with {collocation.partner_job_id}"
    if collocation.max_foreground_slowdown:
        text += f" (paused while it is over {collocation.max_foreground_slowdown:.0%} slower)"
    return text + ("  PAUSED" if paused else "")


def ps_job_text(ps: common_pb2.ParameterServerSpec) -> str:
    """A parameter-server job's bounds and data, and what it does not promise."""
    start = f"{ps.ps or 'Brain'} PS x {ps.workers or 'Brain'} workers"
    return (
        f"Wide&Deep, starts {start} (at most {ps.max_ps or 8} x {ps.max_workers or 8}), "
        f"{ps.fields or 8} fields x {ps.vocab or 50000} ids, batch {ps.batch or 256}; "
        "asynchronous updates: NOT bitwise reproducible"
    )


def why_line(job: scheduler_pb2.Job, now: float | None = None) -> str:
    """The `why:` line: the round's reason, since when, the queue position and the
    estimated start of a waiting job."""
    now = time.time() if now is None else now
    reason = job.reason
    parts = [f"why:        {reason.message} (since {age(reason.since, now)} ago"]
    if job.queue_position:
        parts.append(f"; queue position {job.queue_position}")
    if reason.estimated_start:
        left = reason.estimated_start - now
        parts.append("; estimated start " + (f"in {age(now - left, now)}" if left > 0 else "now"))
    return "".join(parts) + ")"


def job_details(job: scheduler_pb2.Job) -> str:
    spec = job.spec
    ps = spec.HasField("parameter_server")
    length = (
        f"{spec.total_steps} steps" if spec.HasField("total_steps") else f"{spec.epochs} epochs"
    )
    lines = [
        f"job         {job.job_id}",
        f"name        {spec.name}  (tenant {spec.tenant or 'default'}, "
        f"{'guaranteed' if spec.service_class == GUARANTEED else 'best-effort'})",
        f"state       {state_name(job.state)}" + (f": {job.message}" if job.message else ""),
        *([why_line(job)] if job.HasField("reason") else []),
        f"entrypoint  {spec.entrypoint.module} {spec.entrypoint.config_json or '{}'}",
        f"ests        {spec.num_ests}  global batch {spec.global_batch_size}  {length}",
        f"progress    step {step_text(job.progress)}  epoch {job.progress.epoch}  "
        + ("" if ps else f"loss {job.progress.loss:.4f}  ")
        + f"{job.progress.samples_per_second:.1f} samples/s",
        f"devices     {devices_by_type(job.placement)}  ESTs/device "
        f"{ests_per_device(job.placement)}  rescales {job.rescale_count}",
    ]
    costs = (
        (job.HasField("rescale_cost"), job.rescale_cost, "restart"),
        (job.HasField("in_place_rescale_cost"), job.in_place_rescale_cost, "in place"),
    )
    for measured, cost, path in costs:
        if measured:  # decision to first step, as the scheduler measured it
            lines.append(
                f"rescale     {cost.last_seconds:.2f} s last, {cost.mean_seconds:.2f} s mean over "
                f"{cost.count} (decision to first step, {path})"
            )
    if ps:  # its PLAN events carry its counts; execution plans are the EST runtime's
        lines.append(f"ps job      {ps_job_text(spec.parameter_server)}")
    else:
        lines.append(f"plan        {plan_text(job)}")
    if job.resource_plan:
        lines.append(f"resources   {job.resource_plan}")
    if job.collocation.role:
        lines.append(f"sharing     {collocation_text(job.collocation, job.paused)}")
    if job.placement.processes:
        rows = [
            (p.rank, p.worker_id, p.accelerator_type, p.device_index, ",".join(map(str, p.est_ids)))
            for p in job.placement.processes
        ]
        lines.append(table(rows, ("RANK", "WORKER", "TYPE", "DEVICE", "ESTS")))
    if job.final_digest:
        lines.append(f"digest      {job.final_digest}")
    return "\n".join(lines)


def event_line(event: scheduler_pb2.JobEvent) -> str:
    """One line of `gearshift watch`: what happened, progress, where the job runs."""
    stamp = time.strftime("%H:%M:%S", time.localtime(event.time))
    parts = [stamp, f"{event_name(event.type):<12}", f"{state_name(event.state):<9}"]
    progress = event.progress
    if progress.step or progress.total_steps:
        parts.append(f"step {step_text(progress)}")
        if progress.loss:  # none before a first step, nor for a PS job (asynchronous)
            parts.append(f"loss {progress.loss:.4f}")
        parts.append(f"{progress.samples_per_second:.1f} samples/s")
    if event.placement.processes:
        parts.append(f"devices {devices_by_type(event.placement)}")
        parts.append(f"ESTs/device {ests_per_device(event.placement)}")
    if event.message:
        parts.append(f"- {event.message}")
    return "  ".join(parts)


def memory_text(n: int) -> str:
    """`7.8G`-style bytes for a table cell; `?` when unknown (0)."""
    if n <= 0:
        return "?"
    for unit, size in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n}B"


def _per_type(counts: Mapping[str, int]) -> str:
    return " ".join(f"{t}x{n}" for t, n in sorted(counts.items()) if n) or "-"


def tenants_text(state: scheduler_pb2.ClusterState) -> str:
    """Each tenant's quota for guaranteed jobs beside what its jobs hold."""
    if not state.tenants:
        return "no tenant has a quota or a job"
    rows = [
        (
            t.tenant,
            _per_type(t.quota),
            _per_type(t.guaranteed_devices),
            _per_type(t.devices),
            t.guaranteed_jobs,
            t.running_jobs,
            t.queued_jobs,
        )
        for t in state.tenants
    ]
    head = ("TENANT", "QUOTA", "GUARANTEED", "USING", "GUARANTEED JOBS", "RUNNING", "QUEUED")
    out = table(rows, head)
    admitted = [(t.tenant, a) for t in state.tenants for a in t.rubick_admissions]
    if admitted:
        out += "\n\nRubick admissions (last round)\n" + rubick_admissions_text(admitted)
    return out


def rubick_admissions_text(admitted: list[tuple[str, scheduler_pb2.RubickAdmission]]) -> str:
    """Guaranteed jobs Rubick admitted: requested plan and speed against what they got, and
    the best-effort jobs shrunk or preempted for them."""
    rows = [
        (
            tenant,
            a.job_id,
            f"{a.accelerator_type}x{a.requested_devices} {a.requested_plan}",
            f"{a.accelerator_type}x{a.devices} {a.plan}",
            f"{a.requested_iterations_per_second:.3g}",
            f"{a.predicted_iterations_per_second:.3g}",
            f"{_ratio(a)}",
            ",".join(a.shrunk_jobs) or "-",
            ",".join(a.preempted_jobs) or "-",
        )
        for tenant, a in admitted
    ]
    head = (
        "TENANT",
        "JOB",
        "REQUESTED",
        "ADMITTED",
        "REQ IT/S",
        "PRED IT/S",
        "PERF",
        "SHRUNK",
        "PREEMPTED",
    )
    return table(rows, head)


def _ratio(a: scheduler_pb2.RubickAdmission) -> str:
    req = a.requested_iterations_per_second
    return f"{a.predicted_iterations_per_second / req:.2f}x" if req > 0 else "-"


def cluster_text(state: scheduler_pb2.ClusterState) -> str:
    workers = [
        (
            w.worker_id,
            w.address,
            ("alive" if w.alive else "lost") + (" degraded" if w.degraded else ""),
            " ".join(f"{d.accelerator_type}x{d.count}" for d in w.devices),
            str(w.cpu_cores or "?"),
            memory_text(w.memory_bytes),
            age(w.last_heartbeat_at),
        )
        for w in state.workers
    ]
    where = [
        (
            a.job_id,
            a.job_name,
            p.rank,
            p.worker_id,
            p.accelerator_type,
            p.device_index,
            ",".join(map(str, p.est_ids)),
        )
        for a in state.allocations
        for p in a.placement.processes
    ]
    degraded = [f"{w.worker_id} degraded: {w.degraded_reason}" for w in state.workers if w.degraded]
    return "\n\n".join(
        [
            f"policy {state.policy}, round {state.round} ({state.round_seconds:g} s)",
            table(
                workers, ("WORKER", "ADDRESS", "STATUS", "DEVICES", "CPUS", "MEMORY", "HEARTBEAT")
            ),
            *(["\n".join(degraded)] if degraded else []),
            table(where, ("JOB", "NAME", "RANK", "WORKER", "TYPE", "DEVICE", "ESTS"))
            if where
            else "no job is running",
        ]
    )
