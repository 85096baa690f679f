"""StoreRubickProfile, FitModel, PredictPlan and GetSensitivity: requests to validated plain
data and plain data to replies. Every check names the field by its dotted path."""

from __future__ import annotations

import math
from collections.abc import Iterable

from gearshift.brain.profile_messages import check_key
from gearshift.brain.records import RubickFitRow, Subject
from gearshift.brain.rubick import Run, env_from_dict
from gearshift.brain.service import (
    PlanPrediction,
    RubickFitRequest,
    SensitivityRequest,
    SensitivityResult,
)
from gearshift.common.errors import ValidationError
from gearshift.common.rubick import sensitivity
from gearshift.common.rubick.model import A800, Config, Env, ForwardSample, Workload
from gearshift.common.rubick.plans import Plan, Resources, Zero
from gearshift.common.validation import check_accelerator_type, check_name, require
from gearshift.v1 import brain_pb2

B = brain_pb2
MAX_RUNS = 1_000
MAX_FORWARD = 1_000
MAX_DEGREE = 1_024
MAX_NODES = 64
MAX_CURVE = 64  # most GPUs, or CPU cores per GPU, on a curve
MAX_BATCH = 1 << 24

_ZERO = {
    B.ZERO_MODE_UNSPECIFIED: Zero.NONE,
    B.ZERO_MODE_DP: Zero.DP,
    B.ZERO_MODE_OFFLOAD: Zero.OFFLOAD,
}
_ZERO_ENUM = {v: k for k, v in _ZERO.items()}


SubjectRequest = (
    B.StoreRubickProfileRequest | B.FitModelRequest | B.PredictPlanRequest | B.GetSensitivityRequest
)


def subject(request: SubjectRequest) -> Subject:
    """The request's job_id or model_key (its `subject` oneof)."""
    which = request.WhichOneof("subject")
    if which == "job_id":
        check_name(request.job_id, "job_id")
        return Subject("job", request.job_id)
    if which == "model_key":
        check_key(request.model_key, "model_key")
        return Subject("model", request.model_key)
    raise ValidationError("job_id", "give job_id or model_key")


def _finite(value: float, field: str, *, positive: bool) -> None:
    ok = math.isfinite(value) and (value > 0 if positive else value >= 0)
    require(ok, field, f"must be {'> 0' if positive else '>= 0'} and finite, got {value}")


def plan(message: B.RubickPlan, field: str) -> Plan:
    for name in ("dp", "tp", "pp", "ga", "micro_batches"):
        value = getattr(message, name)
        require(0 <= value <= MAX_DEGREE, f"{field}.{name}", f"must be 0-{MAX_DEGREE} (0: 1)")
    require(message.zero in _ZERO, f"{field}.zero", f"unknown value {message.zero}")
    pp = message.pp or 1
    require(
        pp > 1 or message.micro_batches <= 1,
        f"{field}.micro_batches",
        "applies to pipeline parallelism only (pp > 1)",
    )
    require(
        message.zero == B.ZERO_MODE_UNSPECIFIED or (message.tp <= 1 and pp == 1),
        f"{field}.zero",
        "ZeRO plans are data parallel only (tp = pp = 1)",
    )
    return Plan(
        dp=message.dp or 1,
        tp=message.tp or 1,
        pp=pp,
        ga=message.ga or 1,
        gc=message.gc,
        zero=_ZERO[message.zero],
        micro_batches=message.micro_batches or 1,
    )


def resources(message: B.RubickResources, field: str, gpus: int | None = None) -> Resources:
    placement = tuple(message.placement)
    require(
        1 <= len(placement) <= MAX_NODES and all(1 <= n <= MAX_DEGREE for n in placement),
        f"{field}.placement",
        f"want 1-{MAX_NODES} nodes of 1-{MAX_DEGREE} GPUs each, got {list(placement)}",
    )
    if gpus is not None:
        require(
            sum(placement) == gpus,
            f"{field}.placement",
            f"holds {sum(placement)} GPUs but the plan needs {gpus}",
        )
    require(0 <= message.cpus_per_gpu <= 1024, f"{field}.cpus_per_gpu", "must be 0-1024 (0: 1)")
    return Resources(placement, message.cpus_per_gpu or 1)


def _placed(plan_msg: B.RubickPlan, res_msg: B.RubickResources, field: str) -> Config:
    p = plan(plan_msg, f"{field}plan")
    res = resources(res_msg, f"{field}resources", p.gpus)
    if p.tp > 1:
        require(
            all(n % p.tp == 0 for n in res.placement),
            f"{field}plan.tp",
            f"a TP group of {p.tp} must stay inside a node of {list(res.placement)}",
        )
    return Config(p, res)


def workload(message: B.RubickWorkload, field: str = "workload") -> Workload:
    _finite(message.params_millions, f"{field}.params_millions", positive=True)
    require(
        1 <= message.global_batch <= MAX_BATCH, f"{field}.global_batch", f"must be 1-{MAX_BATCH}"
    )
    _finite(message.seq_hid_layers, f"{field}.seq_hid_layers", positive=False)
    require(1 <= message.layers <= 100_000, f"{field}.layers", "must be 1-100,000")
    n = len(message.forward)
    require(1 <= n <= MAX_FORWARD, f"{field}.forward", f"want 1-{MAX_FORWARD:,}, got {n}")
    for i, f in enumerate(message.forward):
        _finite(f.samples_per_gpu, f"{field}.forward[{i}].samples_per_gpu", positive=True)
        _finite(f.milliseconds, f"{field}.forward[{i}].milliseconds", positive=True)
    return Workload(
        name="",
        params_m=message.params_millions,
        global_batch=message.global_batch,
        seq_hid_layers=message.seq_hid_layers,
        layers=message.layers,
        forward=tuple(ForwardSample(f.samples_per_gpu, f.milliseconds) for f in message.forward),
    )


def workload_message(w: Workload) -> B.RubickWorkload:
    return B.RubickWorkload(
        params_millions=w.params_m,
        global_batch=w.global_batch,
        seq_hid_layers=w.seq_hid_layers,
        layers=w.layers,
        forward=[B.RubickForward(samples_per_gpu=f.work, milliseconds=f.ms) for f in w.forward],
    )


def runs(messages: Iterable[B.RubickRun], field: str = "runs") -> tuple[Run, ...]:
    items = list(messages)
    require(len(items) <= MAX_RUNS, field, f"at most {MAX_RUNS:,} runs, got {len(items)}")
    out = []
    for i, run in enumerate(items):
        where = f"{field}[{i}]."
        require(run.HasField("plan"), f"{where}plan", "is required")
        config = _placed(run.plan, run.resources, where)
        _finite(run.iteration_seconds, f"{where}iteration_seconds", positive=True)
        require(
            0 <= run.global_batch <= MAX_BATCH,
            f"{where}global_batch",
            f"must be 0-{MAX_BATCH} (0: the workload's)",
        )
        ms = run.iteration_seconds * 1e3
        out.append(Run(config.plan, config.resources, ms, run.global_batch))
    return tuple(out)


def store_request(
    request: B.StoreRubickProfileRequest,
) -> tuple[Subject, Workload | None, tuple[Run, ...]]:
    who = subject(request)
    wl = workload(request.workload) if request.HasField("workload") else None
    return who, wl, runs(request.runs)


def cluster(message: B.RubickCluster, field: str = "cluster") -> Env:
    names = {
        "intra_node_gbps": "b_intra",
        "inter_node_gbps": "b_inter",
        "pcie_gbps": "b_pcie",
        "gpu_memory_gb": "gpu_memory_gb",
    }
    values = {}
    for name, env_name in names.items():
        value = getattr(message, name)
        _finite(value, f"{field}.{name}", positive=False)
        values[env_name] = value or getattr(A800, env_name)
    return Env(**values)


def cluster_message(env: Env) -> B.RubickCluster:
    return B.RubickCluster(
        intra_node_gbps=env.b_intra,
        inter_node_gbps=env.b_inter,
        pcie_gbps=env.b_pcie,
        gpu_memory_gb=env.gpu_memory_gb,
    )


def fit_request(request: B.FitModelRequest) -> RubickFitRequest:
    who = subject(request)
    wl = workload(request.workload) if request.HasField("workload") else None
    given = runs(request.runs)
    if request.include_runtime_samples:
        require(who.kind == "job", "include_runtime_samples", "needs a job_id")
        check_accelerator_type(request.accelerator_type, "accelerator_type")
        require(
            1 <= request.gpus_per_node <= MAX_DEGREE,
            "gpus_per_node",
            f"must be 1-{MAX_DEGREE} with include_runtime_samples",
        )
    return RubickFitRequest(
        who,
        wl,
        given,
        cluster(request.cluster),
        request.include_runtime_samples,
        request.accelerator_type,
        request.gpus_per_node,
    )


def fit_message(who: Subject, row: RubickFitRow) -> B.FittedModel:
    return B.FittedModel(
        job_id=who.key if who.kind == "job" else "",
        model_key=who.key if who.kind == "model" else "",
        params=B.RubickParams(**row.params),
        rmsle=row.rmsle,
        run_count=row.run_count,
        runs_from_samples=row.runs_from_samples,
        offload_runs=row.offload_runs,
        fitted_at=row.fitted_at,
        fit_seconds=row.fit_seconds,
        cluster=cluster_message(env_from_dict(row.cluster)),
    )


def predict_request(request: B.PredictPlanRequest) -> tuple[Subject, Plan, Resources]:
    who = subject(request)
    require(request.HasField("plan"), "plan", "is required")
    config = _placed(request.plan, request.resources, "")
    return who, config.plan, config.resources


def plan_message(p: Plan) -> B.RubickPlan:
    return B.RubickPlan(
        dp=p.dp,
        tp=p.tp,
        pp=p.pp,
        ga=p.ga,
        gc=p.gc,
        zero=_ZERO_ENUM[p.zero],
        micro_batches=p.micro_batches,
    )


def resources_message(res: Resources) -> B.RubickResources:
    return B.RubickResources(placement=list(res.placement), cpus_per_gpu=res.cpus_per_gpu)


def prediction_message(result: PlanPrediction) -> B.PlanPrediction:
    return B.PlanPrediction(
        iteration_seconds=result.iteration_ms / 1e3,
        samples_per_second=result.samples_per_second,
        gpu_memory_bytes=result.gpu_memory,
        gpu_memory_limit_bytes=result.gpu_memory_limit,
        fits=result.fits,
        host_memory_bytes=result.host_memory,
        plan_label=result.plan.label,
    )


def sensitivity_request(request: B.GetSensitivityRequest) -> SensitivityRequest:
    who = subject(request)
    require(0 <= request.max_gpus <= MAX_CURVE, "max_gpus", f"must be 0-{MAX_CURVE}")
    require(0 <= request.gpus_per_node <= MAX_CURVE, "gpus_per_node", f"must be 0-{MAX_CURVE}")
    require(0 <= request.cpus_per_gpu <= 1024, "cpus_per_gpu", "must be 0-1024 (0: 1)")
    require(
        0 <= request.max_cpus_per_gpu <= MAX_CURVE, "max_cpus_per_gpu", f"must be 0-{MAX_CURVE}"
    )
    placement: tuple[int, ...] = ()
    if request.max_cpus_per_gpu:
        placement = resources(
            B.RubickResources(placement=request.cpu_curve_placement), "cpu_curve_placement"
        ).placement
        require(
            sum(placement) <= MAX_CURVE,
            "cpu_curve_placement",
            f"at most {MAX_CURVE} GPUs, got {sum(placement)}",
        )
    original = None
    if request.HasField("original_plan"):
        original = _placed(request.original_plan, request.original_resources, "original_")
        require(
            original.resources.gpus <= MAX_CURVE,
            "original_resources.placement",
            f"at most {MAX_CURVE} GPUs",
        )
    require(
        bool(request.max_gpus or request.max_cpus_per_gpu or original),
        "max_gpus",
        "ask for a curve (max_gpus, max_cpus_per_gpu) or minRes (original_plan)",
    )
    return SensitivityRequest(
        who,
        request.max_gpus,
        request.gpus_per_node or 8,
        request.cpus_per_gpu or 1,
        request.max_cpus_per_gpu,
        placement,
        request.allow_3d,
        original,
    )


def _points(curve: list[tuple[sensitivity.Point, float]]) -> list[B.SensitivityPoint]:
    out = []
    for point, slope in curve:
        msg = B.SensitivityPoint(
            amount=point.amount, samples_per_second=point.throughput, slope=slope
        )
        if point.choice is not None:
            msg.plan.CopyFrom(plan_message(point.choice.plan))
            msg.resources.CopyFrom(resources_message(point.choice.resources))
        out.append(msg)
    return out


def sensitivity_message(result: SensitivityResult) -> B.Sensitivity:
    reply = B.Sensitivity(gpu_curve=_points(result.gpu_curve), cpu_curve=_points(result.cpu_curve))
    least = result.min_res
    if least is not None:
        reply.min_res.CopyFrom(
            B.MinRes(
                gpus=least.gpus,
                cpus_per_gpu=least.cpus_per_gpu,
                plan=plan_message(least.choice.plan),
                resources=resources_message(least.choice.resources),
                samples_per_second=least.choice.throughput,
                target_samples_per_second=least.target,
                found=least.found,
            )
        )
    return reply
