"""Requests to validated plain data, and plain data to responses.

Every check raises ValidationError naming the field by its dotted path, before
anything is written.
"""

from __future__ import annotations

from google.protobuf import json_format

from gearshift.brain import dlrover
from gearshift.brain.records import (
    Cursor,
    EventKind,
    History,
    JobEvent,
    JobFilter,
    JobKeys,
    JobRow,
    JobStatus,
    NodeInfo,
    PlanRow,
    Sample,
)
from gearshift.brain.service import EstimateResult, EstimateSource, EstPlanResult, PlanRequest
from gearshift.common import estplan
from gearshift.common.jobspec import MAX_ESTS, validate_job_spec, with_defaults
from gearshift.common.validation import (
    check_accelerator_type,
    check_enum,
    check_name,
    check_non_negative,
    check_positive,
    decode_page_token,
    encode_page_token,
    require,
)
from gearshift.v1 import brain_pb2, common_pb2

MAX_BATCH = 10_000
DEFAULT_HISTORY_SAMPLES = 1_000
MAX_HISTORY_SAMPLES = 10_000
MAX_TEXT = 256

_KINDS = {
    brain_pb2.JOB_EVENT_KIND_SUBMITTED: EventKind.SUBMITTED,
    brain_pb2.JOB_EVENT_KIND_STARTED: EventKind.STARTED,
    brain_pb2.JOB_EVENT_KIND_NODE_STARTED: EventKind.NODE_STARTED,
    brain_pb2.JOB_EVENT_KIND_NODE_EXITED: EventKind.NODE_EXITED,
    brain_pb2.JOB_EVENT_KIND_SUCCEEDED: EventKind.SUCCEEDED,
    brain_pb2.JOB_EVENT_KIND_FAILED: EventKind.FAILED,
    brain_pb2.JOB_EVENT_KIND_CANCELLED: EventKind.CANCELLED,
}
_ROLES = {brain_pb2.NODE_ROLE_WORKER: dlrover.Role.WORKER, brain_pb2.NODE_ROLE_PS: dlrover.Role.PS}
_ROLE_ENUM = {v.value: k for k, v in _ROLES.items()}
_STAGES = {
    brain_pb2.PLAN_STAGE_INITIAL: dlrover.Stage.INITIAL,
    brain_pb2.PLAN_STAGE_SAMPLE: dlrover.Stage.SAMPLE,
    brain_pb2.PLAN_STAGE_OPTIMIZE: dlrover.Stage.OPTIMIZE,
    brain_pb2.PLAN_STAGE_ADJUST: dlrover.Stage.ADJUST,
}
_STAGE_ENUM = {v: k for k, v in _STAGES.items()}
_PLAN_SOURCES = {
    dlrover.Source.HISTORY: brain_pb2.PLAN_SOURCE_HISTORY,
    dlrover.Source.DEFAULT: brain_pb2.PLAN_SOURCE_DEFAULT,
    dlrover.Source.OPTIMIZER: brain_pb2.PLAN_SOURCE_OPTIMIZER,
}
_PLAN_SOURCE_FROM = {v: k for k, v in _PLAN_SOURCES.items()}
_ESTIMATE_SOURCES = {
    EstimateSource.OWN_SAMPLES: brain_pb2.ESTIMATE_SOURCE_OWN_SAMPLES,
    EstimateSource.MODEL_HISTORY: brain_pb2.ESTIMATE_SOURCE_MODEL_HISTORY,
    EstimateSource.MATRIX_COMPLETION: brain_pb2.ESTIMATE_SOURCE_MATRIX_COMPLETION,
    EstimateSource.DEFAULT: brain_pb2.ESTIMATE_SOURCE_DEFAULT,
}


def check_type(value: str, field: str) -> None:
    """An accelerator type label: lower-case letters, digits, '_' or '-'."""
    require(bool(value), field, "is required")
    require(len(value) <= 64, field, "must be at most 64 characters")
    check_accelerator_type(value, field)


def _check_text(value: str, field: str) -> None:
    require(len(value) <= MAX_TEXT, field, f"must be at most {MAX_TEXT} characters")


# -- events --------------------------------------------------------------------


def _node(node: brain_pb2.JobNode, field: str) -> NodeInfo:
    check_name(node.node_id, f"{field}.node_id")
    check_enum(node.role, _ROLES, f"{field}.role", allow_unspecified=False)
    res = node.resources
    check_non_negative(res.cpu_cores, f"{field}.resources.cpu_cores")
    require(
        res.memory_bytes >= 0,
        f"{field}.resources.memory_bytes",
        f"must be >= 0 (got {res.memory_bytes})",
    )
    kinds: list[str] = []
    count = 0
    for i, group in enumerate(res.devices):
        check_type(group.accelerator_type, f"{field}.resources.devices[{i}].accelerator_type")
        require(
            group.count >= 1,
            f"{field}.resources.devices[{i}].count",
            f"must be >= 1 (got {group.count})",
        )
        kinds.append(group.accelerator_type)
        count += group.count
    joined = ",".join(dict.fromkeys(kinds))
    require(len(joined) <= 64, f"{field}.resources.devices", "too many accelerator types")
    require(len(node.status) <= 32, f"{field}.status", "must be at most 32 characters")
    _check_text(node.exit_reason, f"{field}.exit_reason")
    return NodeInfo(
        node_id=node.node_id,
        role=_ROLES[node.role].value,
        cpu_cores=res.cpu_cores,
        memory_bytes=res.memory_bytes,
        accelerator_type=joined,
        device_count=count,
        status=node.status,
        exit_reason=node.exit_reason,
    )


def job_event(request: brain_pb2.ReportJobEventRequest) -> JobEvent:
    check_name(request.event_id, "event_id")
    check_name(request.job_id, "job_id")
    check_enum(request.kind, _KINDS, "kind", allow_unspecified=False)
    kind = _KINDS[request.kind]
    check_non_negative(request.time, "time")
    _check_text(request.exit_reason, "exit_reason")
    keys = None
    node = None
    if kind is EventKind.SUBMITTED:
        require(request.HasField("spec"), "spec", "is required for a SUBMITTED event")
        validate_job_spec(request.spec)
        spec = with_defaults(request.spec)
        keys = JobKeys(
            tenant=spec.tenant,
            model_type=spec.model_type,
            dataset_name=spec.dataset.name,
            num_ests=spec.num_ests,
            spec=json_format.MessageToDict(spec, preserving_proto_field_name=True),
        )
    if kind in (EventKind.NODE_STARTED, EventKind.NODE_EXITED):
        require(request.HasField("node"), "node", f"is required for a {kind.name} event")
        node = _node(request.node, "node")
    return JobEvent(
        request.event_id, request.job_id, kind, request.time, keys, node, request.exit_reason
    )


# -- samples -------------------------------------------------------------------


def samples(request: brain_pb2.ReportSamplesRequest) -> list[Sample]:
    check_name(request.batch_id, "batch_id")
    check_name(request.job_id, "job_id")
    n = len(request.samples)
    require(n >= 1, "samples", "at least one sample is required")
    require(n <= MAX_BATCH, "samples", f"at most {MAX_BATCH} samples per batch (got {n})")
    out: list[Sample] = []
    for i, s in enumerate(request.samples):
        f = f"samples[{i}]"
        check_positive(s.time, f"{f}.time")
        check_name(s.node_id, f"{f}.node_id", required=False)
        require(s.step >= 0, f"{f}.step", f"must be >= 0 (got {s.step})")
        check_non_negative(s.steps_per_second, f"{f}.steps_per_second")
        check_non_negative(s.samples_per_second, f"{f}.samples_per_second")
        check_non_negative(s.cpu_cores_used, f"{f}.cpu_cores_used")
        require(
            s.memory_bytes_used >= 0,
            f"{f}.memory_bytes_used",
            f"must be >= 0 (got {s.memory_bytes_used})",
        )
        check_type(s.accelerator_type, f"{f}.accelerator_type")
        require(s.device_count >= 1, f"{f}.device_count", f"must be >= 1 (got {s.device_count})")
        if s.ests_per_device:
            require(
                len(s.ests_per_device) == s.device_count,
                f"{f}.ests_per_device",
                f"has {len(s.ests_per_device)} entries for {s.device_count} devices",
            )
            require(
                all(a >= 1 for a in s.ests_per_device),
                f"{f}.ests_per_device",
                "every device must hold at least one EST",
            )
        out.append(
            Sample(
                time=s.time,
                step=s.step,
                steps_per_second=s.steps_per_second,
                accelerator_type=s.accelerator_type,
                device_count=s.device_count,
                node_id=s.node_id,
                samples_per_second=s.samples_per_second,
                cpu_cores_used=s.cpu_cores_used,
                memory_bytes_used=s.memory_bytes_used,
                ests_per_device=tuple(s.ests_per_device),
            )
        )
    return out


def sample_message(s: Sample) -> brain_pb2.RuntimeSample:
    return brain_pb2.RuntimeSample(
        time=s.time,
        node_id=s.node_id,
        step=s.step,
        steps_per_second=s.steps_per_second,
        samples_per_second=s.samples_per_second,
        cpu_cores_used=s.cpu_cores_used,
        memory_bytes_used=s.memory_bytes_used,
        accelerator_type=s.accelerator_type,
        device_count=s.device_count,
        ests_per_device=list(s.ests_per_device),
    )


# -- history -------------------------------------------------------------------


def history_request(request: brain_pb2.GetJobHistoryRequest) -> tuple[str, int, int]:
    check_name(request.job_id, "job_id")
    require(request.since_step >= 0, "since_step", f"must be >= 0 (got {request.since_step})")
    size = request.max_samples or DEFAULT_HISTORY_SAMPLES
    require(
        1 <= size <= MAX_HISTORY_SAMPLES,
        "max_samples",
        f"must be between 0 and {MAX_HISTORY_SAMPLES} (got {request.max_samples})",
    )
    return request.job_id, request.since_step, size


def job_record(job: JobRow) -> brain_pb2.JobRecord:
    spec = common_pb2.JobSpec()
    json_format.ParseDict(job.spec, spec, ignore_unknown_fields=True)
    return brain_pb2.JobRecord(
        job_id=job.job_id,
        spec=spec,
        status=job.status.value,
        submitted_at=job.submitted_at,
        started_at=job.started_at or 0.0,
        finished_at=job.finished_at or 0.0,
        exit_reason=job.exit_reason,
    )


def _node_message(node: NodeInfo) -> brain_pb2.JobNode:
    devices = (
        [common_pb2.DeviceGroup(accelerator_type=node.accelerator_type, count=node.device_count)]
        if node.accelerator_type and "," not in node.accelerator_type and node.device_count
        else []
    )
    return brain_pb2.JobNode(
        node_id=node.node_id,
        role=_ROLE_ENUM.get(node.role, brain_pb2.NODE_ROLE_UNSPECIFIED),
        resources=common_pb2.Resources(
            cpu_cores=node.cpu_cores, memory_bytes=node.memory_bytes, devices=devices
        ),
        status=node.status,
        exit_reason=node.exit_reason,
    )


def plan_message(plan: dlrover.ResourcePlan, plan_id: str) -> brain_pb2.ResourcePlan:
    return brain_pb2.ResourcePlan(
        plan_id=plan_id,
        stage=_STAGE_ENUM[plan.stage],
        workers=brain_pb2.NodeGroupPlan(
            count=plan.workers.count,
            cpu_cores=plan.workers.cpu_cores,
            memory_bytes=plan.workers.memory_bytes,
            loader_procs=plan.workers.loader_procs,
        ),
        ps=brain_pb2.NodeGroupPlan(
            count=plan.ps.count, cpu_cores=plan.ps.cpu_cores, memory_bytes=plan.ps.memory_bytes
        ),
        ps_replacements=[
            brain_pb2.PsReplacement(ps_index=r.ps_index, cpu_cores=r.cpu_cores)
            for r in plan.ps_replacements
        ],
        source=_PLAN_SOURCES[plan.source],
        predicted_steps_per_second=plan.predicted_steps_per_second,
        reason=plan.reason,
    )


def _issued(row: PlanRow) -> brain_pb2.IssuedPlan:
    return brain_pb2.IssuedPlan(
        plan_id=row.plan_id,
        issued_at=row.issued_at,
        plan=plan_message(dlrover.plan_from_dict(row.plan), row.plan_id),
    )


def history_message(history: History) -> brain_pb2.JobHistory:
    return brain_pb2.JobHistory(
        job=job_record(history.job),
        nodes=[_node_message(n) for n in history.nodes],
        samples=[sample_message(s) for s in history.samples],
        plans=[_issued(p) for p in history.plans],
    )


def list_request(request: brain_pb2.ListJobRecordsRequest) -> tuple[JobFilter, Cursor | None]:
    check_name(request.model_type, "model_type", required=False)
    check_name(request.dataset_name, "dataset_name", required=False)
    check_name(request.tenant, "tenant", max_length=64, required=False)
    if request.status:
        statuses = [s.value for s in JobStatus]
        require(
            request.status in statuses,
            "status",
            f"{request.status!r} is not one of {', '.join(statuses)}",
        )
    token = decode_page_token(request.page.page_token)
    after = None
    if token:
        try:
            after = Cursor(float(token["t"]), str(token["id"]))
        except (KeyError, TypeError, ValueError):
            require(False, "page.page_token", "is not a token returned by this server")
    return JobFilter(
        request.model_type, request.dataset_name, request.tenant, request.status
    ), after


def page_token(cursor: Cursor | None) -> str:
    return encode_page_token({"t": cursor.submitted_at, "id": cursor.job_id}) if cursor else ""


# -- estimates -----------------------------------------------------------------


def estimate_request(request: brain_pb2.EstimateThroughputRequest) -> tuple[str, str, str, int]:
    check_name(request.job_id, "job_id", required=False)
    check_name(request.model_type, "model_type", required=False)
    require(
        bool(request.job_id or request.model_type),
        "job_id",
        "is required (or give model_type)",
    )
    check_type(request.accelerator_type, "accelerator_type")
    require(
        1 <= request.device_count <= 4096,
        "device_count",
        f"must be between 1 and 4096 (got {request.device_count})",
    )
    return request.job_id, request.model_type, request.accelerator_type, request.device_count


def estimate_message(result: EstimateResult) -> brain_pb2.ThroughputEstimate:
    return brain_pb2.ThroughputEstimate(
        steps_per_second=result.value,
        source=_ESTIMATE_SOURCES[result.source],
        relative_error=result.relative_error,
        detail=result.detail,
    )


# -- resource plans ------------------------------------------------------------


def _group(group: brain_pb2.NodeGroupPlan, field: str) -> dlrover.NodeGroup:
    require(group.count >= 0, f"{field}.count", f"must be >= 0 (got {group.count})")
    check_non_negative(group.cpu_cores, f"{field}.cpu_cores")
    require(
        group.memory_bytes >= 0, f"{field}.memory_bytes", f"must be >= 0 (got {group.memory_bytes})"
    )
    require(
        group.loader_procs >= 0, f"{field}.loader_procs", f"must be >= 0 (got {group.loader_procs})"
    )
    return dlrover.NodeGroup(group.count, group.cpu_cores, group.memory_bytes, group.loader_procs)


def _current_plan(plan: brain_pb2.ResourcePlan) -> dlrover.ResourcePlan:
    workers = _group(plan.workers, "current.workers")
    ps = _group(plan.ps, "current.ps")
    require(workers.count >= 1, "current.workers.count", "must be >= 1")
    require(workers.cpu_cores > 0, "current.workers.cpu_cores", "must be > 0")
    return dlrover.ResourcePlan(
        stage=_STAGES.get(plan.stage, dlrover.Stage.ADJUST),
        workers=workers,
        ps=ps,
        source=_PLAN_SOURCE_FROM.get(plan.source, dlrover.Source.OPTIMIZER),
        reason=plan.reason,
        predicted_steps_per_second=plan.predicted_steps_per_second,
    )


def plan_request(request: brain_pb2.PlanResourcesRequest) -> PlanRequest:
    check_name(request.job_id, "job_id")
    check_enum(request.stage, _STAGES, "stage", allow_unspecified=False)
    stage = _STAGES[request.stage]
    check_positive(request.cpu_total, "cpu_total")
    check_positive(request.cpu_max_per_node, "cpu_max_per_node")
    require(
        request.cpu_max_per_node <= request.cpu_total,
        "cpu_max_per_node",
        f"must be at most cpu_total ({request.cpu_total:g})",
    )
    check_enum(request.oom_role, [0, *_ROLES], "oom_role", allow_unspecified=True)
    oom = _ROLES.get(request.oom_role)
    metrics = request.metrics
    check_non_negative(metrics.worker_cores_needed, "metrics.worker_cores_needed")
    check_non_negative(metrics.ps_cores_per_worker, "metrics.ps_cores_per_worker")
    for i, used in enumerate(metrics.ps_cores_used):
        check_non_negative(used, f"metrics.ps_cores_used[{i}]")
    for name in ("worker_memory_bytes_used", "ps_memory_bytes_used"):
        value = getattr(metrics, name)
        require(value >= 0, f"metrics.{name}", f"must be >= 0 (got {value})")
    check_non_negative(metrics.steps_per_second, "metrics.steps_per_second")
    current = _current_plan(request.current) if request.HasField("current") else None
    if oom is not None or stage is dlrover.Stage.ADJUST:
        require(
            current is not None,
            "current",
            "is required with oom_role" if oom is not None else "is required at the ADJUST stage",
        )
    data_parallel = current is not None and current.ps.count == 0 and stage is dlrover.Stage.ADJUST
    if (
        stage in (dlrover.Stage.OPTIMIZE, dlrover.Stage.ADJUST)
        and oom is None
        and not data_parallel
    ):
        check_positive(metrics.worker_cores_needed, "metrics.worker_cores_needed")
        check_positive(metrics.ps_cores_per_worker, "metrics.ps_cores_per_worker")
    if current is not None and metrics.ps_cores_used:
        require(
            len(metrics.ps_cores_used) == current.ps.count,
            "metrics.ps_cores_used",
            f"has {len(metrics.ps_cores_used)} entries for {current.ps.count} PS in current",
        )
    return PlanRequest(
        job_id=request.job_id,
        stage=stage,
        budget=dlrover.Budget(request.cpu_total, request.cpu_max_per_node),
        metrics=dlrover.PsMetrics(
            worker_cores_needed=metrics.worker_cores_needed,
            ps_cores_per_worker=metrics.ps_cores_per_worker,
            ps_cores_used=tuple(metrics.ps_cores_used),
            worker_memory_bytes_used=metrics.worker_memory_bytes_used,
            ps_memory_bytes_used=metrics.ps_memory_bytes_used,
            steps_per_second=metrics.steps_per_second,
        ),
        current=current,
        oom_role=oom,
    )


# -- EST plans -----------------------------------------------------------------


def est_request(
    request: brain_pb2.PlanEstsRequest,
) -> tuple[str, int, list[estplan.DeviceOffer], dict[str, int], int]:
    check_name(request.job_id, "job_id", required=False)
    require(
        1 <= request.num_ests <= MAX_ESTS,
        "num_ests",
        f"must be between 1 and {MAX_ESTS} (got {request.num_ests})",
    )
    require(len(request.devices) > 0, "devices", "at least one device type is required")
    offers: list[estplan.DeviceOffer] = []
    seen: set[str] = set()
    for i, device in enumerate(request.devices):
        f = f"devices[{i}]"
        check_type(device.accelerator_type, f"{f}.accelerator_type")
        require(
            device.accelerator_type not in seen,
            f"{f}.accelerator_type",
            f"{device.accelerator_type!r} is listed twice",
        )
        seen.add(device.accelerator_type)
        require(device.available >= 0, f"{f}.available", f"must be >= 0 (got {device.available})")
        check_non_negative(device.minibatches_per_second, f"{f}.minibatches_per_second")
        if device.minibatches_per_second == 0:
            require(
                bool(request.job_id),
                f"{f}.minibatches_per_second",
                "is 0 (estimate it) but no job_id was given to estimate it for",
            )
        offers.append(
            estplan.DeviceOffer(
                device.accelerator_type, device.available, device.minibatches_per_second
            )
        )
    current: dict[str, int] = {}
    for i, group in enumerate(request.current):
        f = f"current[{i}]"
        check_type(group.accelerator_type, f"{f}.accelerator_type")
        require(
            group.accelerator_type in seen,
            f"{f}.accelerator_type",
            f"{group.accelerator_type!r} is not in devices (its capability is needed)",
        )
        require(group.count >= 1, f"{f}.count", f"must be >= 1 (got {group.count})")
        current[group.accelerator_type] = current.get(group.accelerator_type, 0) + group.count
    held = sum(current.values())
    require(
        held <= request.num_ests,
        "current",
        f"holds {held} devices, more than num_ests ({request.num_ests})",
    )
    if not current:
        require(
            any(o.available > 0 for o in offers),
            "devices",
            "no device type has available > 0",
        )
    require(request.top_k >= 0, "top_k", f"must be >= 0 (got {request.top_k})")
    return request.job_id, request.num_ests, offers, current, min(request.top_k, 100)


def _assignments(plan: estplan.EstPlan) -> list[brain_pb2.EstDeviceAssignment]:
    return [
        brain_pb2.EstDeviceAssignment(
            accelerator_type=p.accelerator_type,
            device_count=p.device_count,
            ests_per_device=list(p.ests_per_device),
        )
        for p in plan.placements
    ]


def est_message(result: EstPlanResult) -> brain_pb2.EstPlan:
    return brain_pb2.EstPlan(
        assignments=_assignments(result.plan),
        predicted_minibatches_per_second=result.plan.minibatches_per_second,
        proposals=[
            brain_pb2.ScaleOutProposal(
                accelerator_type=p.accelerator_type,
                additional_devices=p.additional_devices,
                speedup=p.speedup,
                assignments=_assignments(p.plan),
            )
            for p in result.proposals
        ],
        estimated=[
            brain_pb2.CapabilityEstimate(
                accelerator_type=kind,
                minibatches_per_second=e.value,
                source=_ESTIMATE_SOURCES[e.source],
                relative_error=e.relative_error,
            )
            for kind, e in result.estimated.items()
        ],
    )
