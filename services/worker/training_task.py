"""The TrainingTask message: its file, and the settings one training process reads from it.

The worker daemon writes one message per task (`task.binpb` in the task's folder,
mode 0600) and starts each process with just `--task FILE --rank R`; the reference
runner's flags build the same message (run_flags.py). Either way `resolve` is the one
place where a process turns the message into its settings, so a JobSpec field reaches
the runtime through its proto and its user only. Free of torch: the determinism level
must set torch's variables before torch loads.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gearshift.common import execplan
from gearshift.common.errors import ValidationError
from gearshift.common.facts import DETERMINISM_NAMES, total_steps
from gearshift.v1 import common_pb2, training_pb2, worker_pb2
from gearshift.worker.runtime.settings import Determinism, RunSettings, check_procs
from gearshift.worker.runtime.tree import Shape

TASK_FILE = "task.binpb"  # in the task's folder


def write_task(task: training_pb2.TrainingTask, path: Path) -> None:
    """Write `task` to `path`, readable by its owner only, replacing any file atomically."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(task.SerializeToString(deterministic=True))
    tmp.replace(path)


def read_task(path: Path) -> training_pb2.TrainingTask:
    """The message in `path`; ValidationError names --task when it cannot be read."""
    try:
        return training_pb2.TrainingTask.FromString(path.read_bytes())
    except OSError as exc:
        raise ValidationError("--task", f"cannot read {path}: {exc.strerror}") from None
    except Exception as exc:  # protobuf's DecodeError
        raise ValidationError("--task", f"{path} is not a TrainingTask: {exc}") from None


def data_mode(spec: common_pb2.JobSpec, endpoints: worker_pb2.ServiceEndpoints) -> str:
    """local: each process computes the shard plan; deterministic: the same plan read from
    the shard manager; dynamic: shards pulled from it as they are needed."""
    if spec.dataset.mode == common_pb2.DATA_MODE_DYNAMIC:
        return "dynamic"
    return "deterministic" if endpoints.shard_manager else "local"


def parse_config(text: str, flag: str) -> dict[str, Any]:
    """A job's config from its JSON text; errors name `flag`, where the text came from."""
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise ValidationError(flag, f"is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValidationError(flag, "must be a JSON object")
    return config


def mapping(placement: common_pb2.Placement) -> tuple[int, ...]:
    """ESTs per rank, in rank order."""
    return tuple(len(p.est_ids) for p in sorted(placement.processes, key=lambda p: p.rank))


def _path(text: str) -> Path | None:
    return Path(text) if text else None


@dataclass(frozen=True)
class ServiceSettings:
    """How a process is connected to the services (wiring.py); empty: not connected."""

    job_id: str
    task_id: str
    dataset_id: str
    data_mode: str
    data_size: int
    generation: int
    brain: str
    shard_manager: str
    accelerator_type: str
    report_interval: float
    progress_file: Path | None  # rank 0's, or every rank's with a membership file
    timing_file: Path | None
    index_log_dir: Path | None
    profile_key: str  # rank 0 only, with a Brain
    model_type: str  # with profile_key
    profile_rubick: bool  # rank 0 only, with a Brain and a job id


@dataclass(frozen=True)
class ProcessSettings:
    """Everything one training process runs with, resolved from its TrainingTask."""

    rank: int
    run: RunSettings
    mapping: tuple[int, ...]
    threads: int
    job_module: str
    config: dict[str, Any]
    code_dir: Path | None
    checkpoint_dir: Path
    resume: bool
    master_addr: str
    group: str
    timeout_s: float
    device: str
    local_device: int | None
    backend: str
    loss_log: Path | None
    stats_dir: Path | None
    pause_file: Path | None
    membership_file: Path | None
    join_generation: int
    background: bool
    step_delay: float
    services: ServiceSettings


def resolve(task: training_pb2.TrainingTask, rank: int) -> ProcessSettings:
    """Rank `rank`'s settings; ValidationError names what is wrong."""
    spec = task.spec
    counts = mapping(task.placement)
    check_procs(spec.num_ests, len(counts))
    if not 0 <= rank < len(counts):
        raise ValidationError("--rank", f"must be between 0 and {len(counts) - 1}")
    if rank not in task.processes:
        raise ValidationError("--rank", f"rank {rank} is not a process of this task here")
    own = task.processes[rank]
    if task.join_generation < 0:
        raise ValidationError("--join-generation", f"must be >= 0 (got {task.join_generation})")
    if task.join_generation and not task.membership_file:
        raise ValidationError("--join-generation", "needs --membership-file")
    if not task.step_delay_seconds >= 0:
        raise ValidationError(
            "--step-delay", f"must be >= 0 seconds (got {task.step_delay_seconds})"
        )
    run = RunSettings(
        num_ests=spec.num_ests,
        global_batch_size=spec.global_batch_size,
        total_steps=total_steps(spec),
        seed=spec.dataset.seed,
        shard_size=spec.dataset.shard_size,
        loader_workers=task.loader_workers,
        loader_procs=task.loader_procs,
        determinism=Determinism(DETERMINISM_NAMES[spec.determinism]),
        d2_threads=task.d2_threads,
        checkpoint_every=spec.checkpoint_every_steps or task.default_checkpoint_every,
        keep_checkpoints=task.keep_checkpoints,
        log_every=task.log_every,
        tree_shape=_shape(task.tree_shape),
        est_rng_contexts=not task.shared_rng_stream,
        gradient_checkpointing=task.plan.gradient_checkpointing,
        offload_optimizer=task.plan.offload_optimizer,
    )
    run.validate()
    background = task.collocation.role == common_pb2.COLLOCATION_ROLE_BACKGROUND
    e = task.endpoints
    first = rank == 0 and bool(e.brain)
    services = ServiceSettings(
        job_id=task.job_id,
        task_id=task.task_id,
        dataset_id=task.dataset_id,
        data_mode=data_mode(spec, e),
        data_size=spec.dataset.size,
        generation=task.generation,
        brain=e.brain,
        shard_manager=e.shard_manager,
        accelerator_type=task.accelerator_type,
        report_interval=task.report_interval_seconds,
        # Ranks move with in-place changes: each process may become rank 0, which alone
        # writes it (run.py).
        progress_file=_path(task.progress_file) if rank == 0 or task.membership_file else None,
        timing_file=_path(own.timing_file),
        index_log_dir=_path(task.index_log_dir),
        profile_key=task.profile_key if first else "",
        model_type=spec.model_type if first and task.profile_key else "",
        profile_rubick=first and task.profile_rubick and bool(task.job_id),
    )
    return ProcessSettings(
        rank=rank,
        run=run,
        mapping=counts,
        # A background process runs one intra-op thread, so its foreground keeps its speed.
        threads=1 if background else own.threads or execplan.threads(task.plan),
        job_module=spec.entrypoint.module,
        config=parse_config(spec.entrypoint.config_json or "{}", "spec.entrypoint.config_json"),
        code_dir=_path(task.code_dir),
        checkpoint_dir=Path(task.checkpoint_dir),
        resume=task.resume,
        master_addr=task.rendezvous_address,
        group=task.rendezvous_group or task.job_id or "gearshift",
        timeout_s=task.process_group_timeout_seconds,
        device=task.device,
        local_device=own.local_device if own.HasField("local_device") else None,
        backend=task.backend,
        loss_log=_path(task.loss_log),
        stats_dir=_path(task.stats_dir),
        pause_file=_path(task.pause_file),
        membership_file=_path(task.membership_file),
        join_generation=task.join_generation,
        background=background,
        step_delay=task.step_delay_seconds,
        services=services,
    )


def _shape(text: str) -> Shape:
    if text not in ("balanced", "fold"):
        raise ValidationError("--tree", f"{text!r} is not balanced or fold")
    return "fold" if text == "fold" else "balanced"
