"""Validation and defaults of a JobSpec, shared by the scheduler (on submit) and the client
(before sending), so a bad spec is refused with the same message on both sides.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable

from gearshift.common.codepkg import check_sha256
from gearshift.common.errors import ValidationError
from gearshift.common.model_identity import model_type_of
from gearshift.common.validation import (
    check_accelerator_type,
    check_enum,
    check_name,
    check_non_negative,
    check_positive,
    require,
)
from gearshift.v1 import common_pb2

MAX_ESTS = 1024
DEFAULT_TENANT = "default"
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


# A parameter-server job's process: the PS launcher (gearshift.worker.ps).
PS_MODULE = "gearshift.worker.ps.run"
PS_DEFAULT_MAX = 8  # PS / workers a plan may give a PS job whose spec sets no bound
MAX_PS_PROCESSES = 64
MAX_PS_SLOTS = 8  # workers one PS job may spread over


def is_ps_job(spec: common_pb2.JobSpec) -> bool:
    """A parameter-server job (spec.parameter_server present)."""
    return spec.HasField("parameter_server")


def ps_defaults(ps: common_pb2.ParameterServerSpec) -> common_pb2.ParameterServerSpec:
    """A copy with every 0 made its default (the PS runtime's ClickConfig / ModelConfig)."""
    out = common_pb2.ParameterServerSpec()
    out.CopyFrom(ps)
    for name, value in (
        ("max_ps", PS_DEFAULT_MAX),
        ("max_workers", PS_DEFAULT_MAX),
        ("fields", 8),
        ("vocab", 50_000),
        ("batch", 256),
        ("train_blocks", 400),
        ("dim", 8),
        ("lr", 0.05),
        ("eval_blocks", 40),
        ("slots", 1),
    ):
        if not getattr(out, name):
            setattr(out, name, value)
    return out


def _ps_derived(ps: common_pb2.ParameterServerSpec) -> common_pb2.JobSpec:
    """The JobSpec fields a PS job's PS spec decides (what with_defaults fills in)."""
    d = ps_defaults(ps)
    return common_pb2.JobSpec(
        entrypoint=common_pb2.Entrypoint(module=PS_MODULE),
        num_ests=d.slots,  # one rank a slot: the launchers' share of the processes
        global_batch_size=d.batch,
        dataset=common_pb2.DatasetSpec(
            name="synthetic-clicks",
            size=d.train_blocks * d.batch,
            shard_size=d.batch,
            seed=d.seed,
            mode=common_pb2.DATA_MODE_DYNAMIC,
        ),
    )


def _validate_ps(spec: common_pb2.JobSpec, f: Callable[[str], str]) -> None:
    """A PS job: its PS spec, and the generic fields it decides unset or equal to that."""
    ps = spec.parameter_server

    def p(name: str) -> str:
        return f(f"parameter_server.{name}")

    for name in ("ps", "workers", "max_ps", "max_workers"):
        value = getattr(ps, name)
        zero = "the Brain decides" if name in ("ps", "workers") else str(PS_DEFAULT_MAX)
        require(
            0 <= value <= MAX_PS_PROCESSES,
            p(name),
            f"must be between 0 and {MAX_PS_PROCESSES} (0: {zero}) (got {value})",
        )
    d = ps_defaults(ps)
    require(ps.ps <= d.max_ps, p("ps"), f"{ps.ps} is above parameter_server.max_ps ({d.max_ps})")
    require(
        ps.workers <= d.max_workers,
        p("workers"),
        f"{ps.workers} is above parameter_server.max_workers ({d.max_workers})",
    )
    require(ps.seed >= 0, p("seed"), f"must be >= 0 (got {ps.seed})")
    require(
        0 <= ps.slots <= MAX_PS_SLOTS,
        p("slots"),
        f"must be between 0 and {MAX_PS_SLOTS} (0: 1) (got {ps.slots})",
    )
    for name in ("fields", "vocab", "batch", "train_blocks", "dim", "eval_blocks"):
        value = getattr(ps, name)
        require(value >= 0, p(name), f"must be > 0 (0: the default) (got {value})")
    require(math.isfinite(ps.lr) and ps.lr >= 0, p("lr"), f"must be > 0 (0: 0.05) (got {ps.lr})")
    require(
        math.isfinite(ps.read_ms) and 0 <= ps.read_ms <= 10_000,
        p("read_ms"),
        f"must be between 0 and 10000 milliseconds (got {ps.read_ms})",
    )
    require(
        d.fields * d.vocab <= 100_000_000,
        p("vocab"),
        f"fields x vocab = {d.fields * d.vocab} embedding rows; at most 100000000",
    )
    require(
        spec.WhichOneof("length") == "total_steps",
        f("total_steps"),
        "a parameter-server job's length is total_steps (global batches), not epochs",
    )
    require(spec.total_steps > 0, f("total_steps"), f"must be > 0 (got {spec.total_steps})")
    derived = _ps_derived(ps)
    entry = spec.entrypoint
    require(
        not spec.HasField("entrypoint")
        or (
            entry.module == PS_MODULE and entry.config_json in ("", "{}") and not entry.code_sha256
        ),
        f("entrypoint"),
        f"must be unset for a parameter-server job (it runs {PS_MODULE})",
    )
    require(
        not spec.HasField("dataset") or spec.dataset == derived.dataset,
        f("dataset"),
        "must be unset for a parameter-server job (spec.parameter_server decides it)",
    )
    for name in ("num_ests", "global_batch_size"):
        value = getattr(spec, name)
        require(
            value in (0, getattr(derived, name)),
            f(name),
            f"must be unset for a parameter-server job (it is {getattr(derived, name)} "
            f"by spec.parameter_server), got {value}",
        )
    slots = ps_defaults(spec.parameter_server).slots
    require(
        not spec.HasField("elastic")
        or spec.elastic.min_devices == spec.elastic.max_devices == slots
        or spec.elastic.max_devices <= 1 == slots,
        f("elastic"),
        "must be unset for a parameter-server job (parameter_server.max_ps / max_workers bound "
        "its processes, parameter_server.slots its devices)",
    )
    require(
        not spec.accelerator_types or list(spec.accelerator_types) == ["cpu"],
        f("accelerator_types"),
        "a parameter-server job runs on CPU cores only (leave it unset or [cpu])",
    )
    require(
        spec.determinism
        in (common_pb2.DETERMINISM_LEVEL_UNSPECIFIED, common_pb2.DETERMINISM_LEVEL_D0),
        f("determinism"),
        "a parameter-server job is asynchronous, not bitwise reproducible: D0 (or unset) only",
    )
    require(
        not spec.plan_dimensions.ListFields(),
        f("plan_dimensions"),
        "must be unset for a parameter-server job (its plan is PS and worker counts)",
    )


def validate_job_spec(spec: common_pb2.JobSpec, prefix: str = "spec") -> None:
    """Raise ValidationError naming the first bad field (e.g. "spec.num_ests"); return if valid."""

    def f(name: str) -> str:
        return f"{prefix}.{name}"

    if is_ps_job(spec):
        _validate_ps(spec, f)
        derived = common_pb2.JobSpec()
        derived.CopyFrom(spec)
        derived.MergeFrom(_ps_derived(spec.parameter_server))
        derived.elastic.Clear()
        derived.ClearField("elastic")
        spec = derived  # the generic checks below, on what the PS spec decides

    check_name(spec.name, f("name"))
    check_name(spec.tenant, f("tenant"), max_length=64, required=False)
    check_name(spec.model_type, f("model_type"), required=False)

    require(spec.HasField("entrypoint"), f("entrypoint"), "is required")
    module = spec.entrypoint.module
    require(bool(module), f("entrypoint.module"), "is required")
    require(
        _MODULE.match(module) is not None,
        f("entrypoint.module"),
        f"{module!r} is not a dotted Python module name",
    )
    if spec.entrypoint.config_json:
        try:
            config = json.loads(spec.entrypoint.config_json)
        except ValueError as exc:
            raise ValidationError(
                f("entrypoint.config_json"), f"is not valid JSON: {exc}"
            ) from None
        require(isinstance(config, dict), f("entrypoint.config_json"), "must be a JSON object")
    if spec.entrypoint.code_sha256:
        check_sha256(spec.entrypoint.code_sha256, f("entrypoint.code_sha256"))

    require(
        1 <= spec.num_ests <= MAX_ESTS,
        f("num_ests"),
        f"must be between 1 and {MAX_ESTS} (got {spec.num_ests})",
    )
    require(spec.global_batch_size > 0, f("global_batch_size"), "must be > 0")
    require(
        # A PS job's ranks are its slots, which split its processes, not its batches.
        spec.global_batch_size % spec.num_ests == 0 or is_ps_job(spec),
        f("global_batch_size"),
        f"{spec.global_batch_size} is not a multiple of num_ests ({spec.num_ests})",
    )

    length = spec.WhichOneof("length")
    require(length is not None, f("total_steps"), "one of total_steps or epochs is required")
    if length == "total_steps":
        require(spec.total_steps > 0, f("total_steps"), f"must be > 0 (got {spec.total_steps})")
    else:
        require(spec.epochs > 0, f("epochs"), f"must be > 0 (got {spec.epochs})")

    require(spec.HasField("dataset"), f("dataset"), "is required")
    data = spec.dataset
    check_name(data.name, f("dataset.name"), required=False)
    require(data.size > 0, f("dataset.size"), f"must be > 0 (got {data.size})")
    require(
        0 < data.shard_size <= data.size,
        f("dataset.shard_size"),
        f"must be between 1 and dataset.size ({data.size}) (got {data.shard_size})",
    )
    require(data.seed >= 0, f("dataset.seed"), f"must be >= 0 (got {data.seed})")
    check_enum(data.mode, common_pb2.DataMode.values(), f("dataset.mode"), allow_unspecified=True)

    check_enum(
        spec.determinism,
        common_pb2.DeterminismLevel.values(),
        f("determinism"),
        allow_unspecified=True,
    )
    check_enum(
        spec.service_class,
        common_pb2.ServiceClass.values(),
        f("service_class"),
        allow_unspecified=True,
    )

    bounds = spec.elastic
    require(bounds.min_devices >= 0, f("elastic.min_devices"), "must be >= 0")
    require(bounds.max_devices >= 0, f("elastic.max_devices"), "must be >= 0")
    max_devices = bounds.max_devices or spec.num_ests
    require(
        max_devices <= spec.num_ests,
        f("elastic.max_devices"),
        f"must be at most num_ests ({spec.num_ests}): an EST runs on one device at a time",
    )
    require(
        max(bounds.min_devices, 1) <= max_devices,
        f("elastic.min_devices"),
        f"must be at most elastic.max_devices ({max_devices})",
    )

    seen: set[str] = set()
    for i, kind in enumerate(spec.accelerator_types):
        field = f(f"accelerator_types[{i}]")
        check_accelerator_type(kind, field)
        require(kind not in seen, field, f"{kind!r} is listed twice")
        seen.add(kind)

    check_non_negative(spec.priority_weight, f("priority_weight"))
    if spec.HasField("slo"):
        check_positive(spec.slo.deadline_seconds, f("slo.deadline_seconds"))
    require(
        spec.checkpoint_every_steps >= 0,
        f("checkpoint_every_steps"),
        f"must be >= 0 (got {spec.checkpoint_every_steps})",
    )
    require(
        not spec.plan_dimensions.threads or spec.determinism == common_pb2.DETERMINISM_LEVEL_D2,
        f("plan_dimensions.threads"),
        "needs determinism D2: under D0/D1 a process's thread count changes the bits "
        "(D2 runs every kernel with a fixed count)",
    )
    require(len(spec.labels) <= 64, f("labels"), "at most 64 labels")
    for key in spec.labels:
        check_name(key, f(f"labels[{key!r}]"), max_length=64)


def with_defaults(spec: common_pb2.JobSpec) -> common_pb2.JobSpec:
    """A copy of a valid spec with every "unset means default" field made explicit."""
    out = common_pb2.JobSpec()
    out.CopyFrom(spec)
    if is_ps_job(out):
        out.MergeFrom(_ps_derived(out.parameter_server))
        out.parameter_server.CopyFrom(ps_defaults(out.parameter_server))
        out.elastic.min_devices = out.elastic.max_devices = out.parameter_server.slots
        out.determinism = common_pb2.DETERMINISM_LEVEL_D0  # asynchronous updates
        if not out.model_type:
            out.model_type = "wide-deep"
    if not out.tenant:
        out.tenant = DEFAULT_TENANT
    out.model_type = model_type_of(out)
    if not out.entrypoint.config_json:
        out.entrypoint.config_json = "{}"
    if out.determinism == common_pb2.DETERMINISM_LEVEL_UNSPECIFIED:
        out.determinism = common_pb2.DETERMINISM_LEVEL_D1
    if out.dataset.mode == common_pb2.DATA_MODE_UNSPECIFIED:
        out.dataset.mode = common_pb2.DATA_MODE_DETERMINISTIC
    if out.service_class == common_pb2.SERVICE_CLASS_UNSPECIFIED:
        out.service_class = common_pb2.SERVICE_CLASS_BEST_EFFORT
    if out.priority_weight == 0:
        out.priority_weight = 1.0
    if out.elastic.max_devices == 0:
        out.elastic.max_devices = out.num_ests
    if out.elastic.min_devices == 0:
        out.elastic.min_devices = 1
    return out
