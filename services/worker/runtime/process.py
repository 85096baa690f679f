"""Set up and run one training process of a job: determinism, job build, process group, loop.

This is the per-process entry that both the local launcher and (later) the
worker daemon start: it needs only its rank, the placement and where rank 0
listens.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gearshift.common.errors import ValidationError
from gearshift.worker.runtime import checkpoint, determinism
from gearshift.worker.runtime.backend import choose_device
from gearshift.worker.runtime.comm import Comm
from gearshift.worker.runtime.control import ProgressCallback
from gearshift.worker.runtime.data import DataSource
from gearshift.worker.runtime.job import Job, load_job
from gearshift.worker.runtime.membership import Change, MembershipFile
from gearshift.worker.runtime.pause import PauseGate
from gearshift.worker.runtime.priority import device_stream
from gearshift.worker.runtime.regroup import ProcessGroups
from gearshift.worker.runtime.rehearsal import rehearse
from gearshift.worker.runtime.rng import derive_seed
from gearshift.worker.runtime.settings import RunSettings, placement
from gearshift.worker.runtime.stop import Outcome, StopFlag
from gearshift.worker.runtime.trainer import RunResult, Trainer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProcessSpec:
    """Everything one training process is told."""

    job_module: str
    job_config: dict[str, Any]
    settings: RunSettings
    mapping: tuple[int, ...]  # ESTs per process (contiguous ranges)
    rank: int
    checkpoint_dir: Path
    master_addr: str = ""  # HOST:PORT of rank 0's rendezvous (needed when P > 1)
    resume: bool = False
    threads: int = 1  # intra-op threads this process is given (D2 overrides)
    device: str = "cpu"
    local_device: int | None = None  # index among the visible GPUs (default: rank mod count)
    backend: str = "auto"  # auto, nccl or gloo (see backend.py)
    loss_log: Path | None = None
    timeout_s: float = 600.0
    group: str = "gearshift"  # the placement's name in the rendezvous (the job id)
    pause_file: Path | None = None  # a background task: wait before a step while it exists
    background: bool = False  # a background task: on CUDA, the least stream priority
    step_delay: float = 0.0  # tests only: seconds slept in each step (a straggler on purpose)
    # In-place membership changes (membership.py): read from this file at every step.
    membership_file: Path | None = None
    # > 0: this process joins the running job at this generation of its membership file
    # (its training state comes from a process that stays, not from a checkpoint).
    join_generation: int = 0


def seed_globals(seed: int) -> None:
    """Seed every global generator the job's build may draw from."""
    value = derive_seed("build", seed)
    torch.manual_seed(value)
    random.seed(value)
    np.random.seed(value % 2**32)


def _device(spec: ProcessSpec) -> tuple[torch.device, str, torch.device]:
    """(device, backend, device the backend sends from) for this process."""
    cuda = spec.device == "cuda"
    visible = torch.cuda.device_count() if cuda and torch.cuda.is_available() else 0
    if cuda and visible == 0:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
        raise ValidationError(
            "--device", f"cuda was asked for but no GPU is visible (CUDA_VISIBLE_DEVICES={shown})"
        )
    choice = choose_device(
        spec.device,
        spec.rank,
        len(spec.mapping),
        visible,
        local_device=spec.local_device,
        backend=spec.backend,
    )
    if choice.gpu is None:
        return torch.device("cpu"), choice.backend, torch.device("cpu")
    device = torch.device("cuda", choice.gpu)
    torch.cuda.set_device(device)
    return device, choice.backend, device if choice.on_gpu_transport else torch.device("cpu")


def _ended(spec: ProcessSpec, generation: int) -> bool:
    """Whether the job this process was to join has ended (its final checkpoint is there):
    the job trains on while a joiner starts, and may end first. The joiner then leaves, its
    ESTs done, instead of failing on a store that is gone."""
    found = checkpoint.checkpoints(spec.checkpoint_dir)
    if not found or found[-1][0] < spec.settings.total_steps:
        return False
    message = f"the job ended at step {found[-1][0]} before generation {generation} formed"
    log.info(message)
    print(message, flush=True)
    return True


def _first_group(
    spec: ProcessSpec,
    job: Job,
    device: torch.device,
    groups: ProcessGroups,
    joining: Change | None,
) -> Comm | None:
    """This process's first process group, or None where the job it was to join has ended
    (before it came, or while it waited for the group: the store it waited on is then gone)."""
    try:
        if joining is not None and _ended(spec, joining.generation):
            return None
        if joining is not None and joining.waits_for_joiners:
            if device.type == "cuda":  # on a CPU a first step costs what the others do
                rehearse(job, device, spec.settings.per_est_batch)
            groups.announce(joining, spec.rank)
        timeout_s = joining.timeout_s if joining is not None else spec.timeout_s
        return groups.form(
            spec.join_generation,
            spec.rank,
            len(spec.mapping),
            spec.master_addr,
            join_timeout_s=timeout_s,
        )
    except Exception:
        if joining is not None and _ended(spec, joining.generation):
            return None
        raise


def run_process(
    spec: ProcessSpec,
    *,
    stop: StopFlag | None = None,
    on_progress: ProgressCallback | None = None,
    record_losses: bool = False,
    source: DataSource | None = None,
) -> RunResult:
    """Train this process's ESTs; `source` replaces the local shard plan (e.g. by the
    shard manager's deterministic mode, which must yield the same stream, or by a
    BatchFeed such as its dynamic mode, which is not reproducible)."""
    settings = spec.settings
    settings.validate()
    procs = len(spec.mapping)
    if not 0 <= spec.rank < procs:
        raise ValidationError("--rank", f"must be between 0 and {procs - 1} (got {spec.rank})")
    if procs > 1 and not spec.master_addr:
        raise ValidationError("--master-addr", "is required when the job has several processes")
    determinism.apply(settings.determinism, spec.threads, settings.d2_threads)
    device, backend, transport = _device(spec)
    seed_globals(settings.seed)
    job = load_job(spec.job_module, spec.job_config)
    pause = None
    if spec.pause_file is not None:
        pause = PauseGate.from_file(spec.pause_file, say=lambda text: print(text, flush=True))
    membership = None
    joining = None
    if spec.membership_file is not None:
        membership = MembershipFile(spec.membership_file, max(spec.join_generation - 1, 0))
        if spec.join_generation:
            joining = membership.find(spec.join_generation, spec.rank, spec.mapping)
    elif spec.join_generation:
        raise ValidationError("--join-generation", "needs --membership-file")
    groups = ProcessGroups(spec.group, backend, device, transport, spec.timeout_s)
    try:
        comm = _first_group(spec, job, device, groups, joining)
        if comm is None:
            return RunResult(Outcome.LEFT, settings.total_steps, "")
        with device_stream(device, spec.background):  # construction too: one stream
            trainer = Trainer(
                job,
                settings,
                placement(spec.mapping),
                spec.rank,
                spec.checkpoint_dir,
                job_ref={"module": spec.job_module, "config": spec.job_config},
                resume=spec.resume,
                device=device,
                comm=comm,
                source=source,
                stop=stop,
                on_progress=on_progress,
                loss_log=spec.loss_log,
                record_losses=record_losses,
                pause=pause,
                step_delay=spec.step_delay,
                membership=membership,
                groups=groups,
                joining=joining,
            )
            result = trainer.run()
    finally:
        groups.close()
    return replace(result, device=str(device), backend=backend if result.procs > 1 else "none")
