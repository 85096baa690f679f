"""A job's execution plan (the part the runtime executes): its words, its default, and
whether a JobSpec allows it — shared by the scheduler (which refuses a plan the job does
not allow), the worker (which maps it onto runtime flags) and the client (which shows it).
"""

from __future__ import annotations

from gearshift.common.errors import ValidationError
from gearshift.v1 import common_pb2


def threads(plan: common_pb2.ExecutionPlan) -> int:
    """Intra-op threads per process (0 means 1)."""
    return max(plan.threads_per_process, 1)


def describe(plan: common_pb2.ExecutionPlan) -> str:
    """One line, e.g. "gc on, 2 threads, optimizer offload"."""
    n = threads(plan)
    words = [f"gc {'on' if plan.gradient_checkpointing else 'off'}"]
    words.append(f"{n} thread{'s' if n > 1 else ''}")
    if plan.offload_optimizer:
        words.append("optimizer offload")
    return ", ".join(words)


def as_dict(plan: common_pb2.ExecutionPlan) -> dict[str, object]:
    """The plan for `--json` output, every field explicit."""
    return {
        "gradient_checkpointing": plan.gradient_checkpointing,
        "threads_per_process": threads(plan),
        "offload_optimizer": plan.offload_optimizer,
    }


def check_allowed(
    spec: common_pb2.JobSpec, plan: common_pb2.ExecutionPlan, field: str = "plan"
) -> None:
    """Raise ValidationError naming the plan's field that the job's plan_dimensions forbid."""
    allowed = spec.plan_dimensions
    if plan.threads_per_process < 0:
        raise ValidationError(
            f"{field}.threads_per_process", f"must be >= 0 (got {plan.threads_per_process})"
        )
    if plan.gradient_checkpointing and not allowed.gradient_checkpointing:
        raise ValidationError(
            f"{field}.gradient_checkpointing",
            f"job {spec.name!r} does not allow gradient checkpointing "
            "(spec.plan_dimensions.gradient_checkpointing)",
        )
    if threads(plan) > 1 and not allowed.threads:
        raise ValidationError(
            f"{field}.threads_per_process",
            f"job {spec.name!r} runs with one thread per process: {threads(plan)} needs "
            "spec.plan_dimensions.threads",
        )
    if plan.offload_optimizer and not allowed.offload_optimizer:
        raise ValidationError(
            f"{field}.offload_optimizer",
            f"job {spec.name!r} does not allow optimizer offload "
            "(spec.plan_dimensions.offload_optimizer)",
        )
