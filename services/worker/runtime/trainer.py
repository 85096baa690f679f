"""The training loop of one process: its ESTs time-sliced at mini-batch boundaries.

A global step: for each EST this process holds, in EST order — take its next
batch, run forward and backward (of its loss / N) inside its RNG context from
the step's buffers, and put its gradient aside; then sum all N gradients in the canonical
order (exchanging with the other processes), take one optimizer and LR
scheduler step, and keep EST 0's buffers. Checkpoints are taken only at global
step boundaries, so a restart with any placement continues the same run.
A background task's loop also passes a pause gate before each global step
(pause.py); paused time does not count in the reported samples per second.
Checkpoints are written off the critical path by default (writer.py): the step waits only
for a host-memory copy of the state, and `run()` returns once the file is durable.
"""

from __future__ import annotations

import json
import logging
import resource
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from gearshift.common.errors import ValidationError
from gearshift.worker.runtime import checkpoint, recompute
from gearshift.worker.runtime.buffers import BufferKeeper
from gearshift.worker.runtime.comm import Comm
from gearshift.worker.runtime.context import (
    EstContext,
    RngSlot,
    Switcher,
    context_from_plain,
    context_to_plain,
    fresh_context,
)
from gearshift.worker.runtime.control import ControlExchange, Progress, ProgressCallback
from gearshift.worker.runtime.data import CheckpointAware, DataSource, LocalShards, SupersededError
from gearshift.worker.runtime.digest import state_digest, training_state
from gearshift.worker.runtime.gradients import GradLayout, GradTaker
from gearshift.worker.runtime.job import Job
from gearshift.worker.runtime.loader import BatchLoader
from gearshift.worker.runtime.offload import HostOptimizer
from gearshift.worker.runtime.pause import PauseGate
from gearshift.worker.runtime.reduce import CanonicalReducer, LocalSumReducer, Reducer
from gearshift.worker.runtime.rng import derive_seed, from_plain, seeded, to_plain
from gearshift.worker.runtime.settings import Determinism, RunSettings
from gearshift.worker.runtime.stop import Outcome, StopFlag
from gearshift.worker.runtime.tree import ReductionTree, check_partition
from gearshift.worker.runtime.writer import CheckpointWriter, host_copy

log = logging.getLogger("gearshift.worker.runtime")

# Settings a checkpoint pins: changing them would change what the job computes.
_FIXED = {
    "num_ests": "--ests",
    "global_batch_size": "--batch-size",
    "seed": "--seed",
    "shard_size": "--shard-size",
    "loader_workers": "--loader-workers",
    "tree_shape": "--tree",
}


@dataclass
class RunResult:
    outcome: Outcome
    step: int  # global steps completed
    digest: str  # SHA-256 of parameters, buffers and optimizer state
    steps_run: int = 0  # steps this run took (not counting resumed ones)
    wall_s: float = 0.0
    bytes_sent: int = 0  # payload this process passed to the backend
    grad_bytes: int = 0  # size of one full gradient
    peak_rss_bytes: int = 0
    checkpoint: Path | None = None
    est_losses: list[list[float]] = field(default_factory=list)  # per step run, per EST
    device: str = ""  # where the ESTs trained (cpu, cuda:I)
    backend: str = ""  # the process group's backend (gloo, nccl; none for one process)
    paused_s: float = 0.0  # time held at the pause gate (a background task), in wall_s
    checkpoint_pause_s: float = 0.0  # time the loop stood still for checkpoints, in wall_s


def to_device(batch: Any, device: torch.device) -> Any:
    if device.type == "cpu":
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(item, device) for item in batch)
    return batch


def _loss_bits(value: float) -> str:
    """The float32 loss's bytes (the exchange carries it exactly as a float64)."""
    return struct.pack(">f", value).hex()


class Trainer:
    """One process's part of a run; `run()` trains until done or stopped."""

    def __init__(
        self,
        job: Job,
        settings: RunSettings,
        placement: Sequence[Sequence[int]],
        rank: int,
        checkpoint_dir: Path,
        *,
        job_ref: dict[str, Any] | None = None,
        resume: bool = False,
        device: torch.device | None = None,
        comm: Comm | None = None,
        source: DataSource | None = None,
        stop: StopFlag | None = None,
        on_progress: ProgressCallback | None = None,
        loss_log: Path | None = None,
        record_losses: bool = False,
        pause: PauseGate | None = None,
        step_delay: float = 0.0,
        async_checkpoint: bool = True,
    ) -> None:
        settings.validate()
        check_partition(settings.num_ests, placement)
        self.job = job
        self.settings = settings
        self.placement = [list(ests) for ests in placement]
        self.rank = rank
        self.procs = len(placement)
        self.my_ests = sorted(self.placement[rank])
        self.checkpoint_dir = checkpoint_dir
        self.job_ref = job_ref or {}
        self.device = device or torch.device("cpu")
        self.comm = comm or Comm(rank, self.procs)
        self.stop = stop or StopFlag()
        self.on_progress = on_progress
        self.loss_log = loss_log
        self.record_losses = record_losses
        self.pause = pause
        # For tests only: sleep this long in each step's compute, so this process is a
        # straggler on purpose (it changes no value the job computes).
        self.step_delay = step_delay
        # Snapshot-and-write checkpoints in the loop (writer.py); False: write, then go on.
        self.async_checkpoint = async_checkpoint
        self.writer = CheckpointWriter()
        self.cuda = self.device.type == "cuda"
        self.model = job.model.to(self.device)
        if settings.gradient_checkpointing:
            recompute.enable(self.model)
        self.layout = GradLayout([p for p in self.model.parameters() if p.requires_grad])
        self.step = 0
        self.job_slot = RngSlot(seeded(derive_seed("job", settings.seed), cuda=self.cuda))
        if resume and (path := checkpoint.latest(checkpoint_dir)) is not None:
            self.contexts = self._restore(path)
        else:
            if resume:
                _no_checkpoint(checkpoint_dir)
            self._check_same_start()
            self.contexts = [
                fresh_context(est, settings.seed, settings.loader_workers, cuda=self.cuda)
                for est in self.my_ests
            ]
        size = getattr(source, "size", None)
        if isinstance(size, int) and size > len(job.dataset):
            raise ValidationError(
                "--data-size",
                f"{size} samples asked for but the job's dataset has only {len(job.dataset)}",
            )
        self.source: DataSource = source or LocalShards(
            len(job.dataset), settings.shard_size, settings.seed, settings.num_ests
        )
        level = settings.determinism
        self.switcher = Switcher(
            enabled=settings.est_rng_contexts,
            cuda=self.cuda,
            threads=settings.d2_threads if level is Determinism.D2 else None,
        )
        self.reducer: Reducer
        if level is Determinism.D0:
            self.reducer = LocalSumReducer(self.layout, self.comm)
        else:
            tree = ReductionTree.build(settings.num_ests, settings.tree_shape)
            self.reducer = CanonicalReducer(self.layout, tree, self.placement, self.comm)
        holder = next(p for p, ests in enumerate(self.placement) if 0 in ests)
        self.buffers = BufferKeeper(self.model, holder, rank, self.procs)
        self.control = ControlExchange(settings.num_ests, self.placement, rank)
        self.stepper: torch.optim.Optimizer | HostOptimizer = job.optimizer
        if settings.offload_optimizer:
            if self.cuda:
                self.stepper = HostOptimizer(job.optimizer, self.layout.params)
            elif rank == 0:
                message = "--offload-optimizer: on the CPU the optimizer steps on the host already"
                log.info(message)
                print(message, flush=True)

    # -- start and resume ------------------------------------------------------------

    def _check_same_start(self) -> None:
        """Every process must have built the same initial model (build is seeded)."""
        digests = self.comm.all_gather_object(state_digest(self.model.state_dict()))
        if len(set(digests)) > 1:
            raise ValidationError(
                "--job",
                "processes built different initial models: build(config) must draw randomness "
                "only from torch/random/numpy global generators (the runtime seeds them)",
            )

    def _restore(self, path: Path) -> list[EstContext]:
        data = checkpoint.load(path)
        meta = data["settings"]
        for name, flag in _FIXED.items():
            if meta[name] != getattr(self.settings, name):
                raise ValidationError(
                    flag,
                    f"the checkpoint {path.name} was taken with {meta[name]}, not "
                    f"{getattr(self.settings, name)}; it cannot change during a job",
                )
        d2 = Determinism.D2
        if (
            self.settings.determinism is d2
            and meta.get("determinism") == d2
            and meta.get("d2_threads") != self.settings.d2_threads
        ):
            raise ValidationError(
                "--d2-threads",
                f"the checkpoint {path.name} was taken under D2 with {meta.get('d2_threads')} "
                f"threads, not {self.settings.d2_threads}; it cannot change during a D2 job",
            )
        if data.get("job", {}).get("module") not in (None, self.job_ref.get("module")):
            raise ValidationError(
                "--job", f"the checkpoint {path.name} belongs to job {data['job']['module']!r}"
            )
        self.model.load_state_dict(data["model"])
        self.job.optimizer.load_state_dict(data["optimizer"])
        if self.job.lr_scheduler is not None:
            self.job.lr_scheduler.load_state_dict(data["lr_scheduler"])
        self.step = int(data["step"])
        self.job_slot.rng = from_plain(data["job_rng"])
        by_est = {int(e["est"]): e for e in data["ests"]}
        log.info("resumed from %s at step %d", path, self.step)
        return [context_from_plain(by_est[est]) for est in self.my_ests]

    def save_checkpoint(self, *, wait: bool = True) -> Path | None:
        """All processes call this at the same step boundary; rank 0 writes.

        With `wait=False` rank 0 copies the state into host memory and a background thread
        writes the file (writer.py): the path is returned before it is durable, and `run()`
        (or `writer.wait()`) waits for it. A CheckpointAware source's reads for the steps it
        holds travel to rank 0 with the ESTs' contexts; rank 0 hands them back to it as soon
        as the file is durable, before the barrier, so a peer killed in the barrier cannot
        leave them provisional: with such a source the write is always synchronous.
        """
        aware = self.aware
        background = not wait and aware is None
        pending = aware.pending_before(self.step) if aware is not None else {}
        contexts = [context_to_plain(c) for c in self.contexts]
        gathered = self.comm.gather_to_first((contexts, pending))
        path = None
        if gathered is not None:
            ests = sorted((c for part, _ in gathered for c in part), key=lambda c: int(c["est"]))
            payload = {
                "format": 1,
                "step": self.step,
                "settings": {name: getattr(self.settings, name) for name in _FIXED}
                | {
                    "determinism": str(self.settings.determinism),
                    "d2_threads": self.settings.d2_threads,
                },
                # The plan it was taken under: informative only, any plan may resume it.
                "plan": {
                    "ests_per_process": [len(ests) for ests in self.placement],
                    "gradient_checkpointing": self.settings.gradient_checkpointing,
                    "offload_optimizer": self.settings.offload_optimizer,
                },
                "job": self.job_ref,
                "model": self.model.state_dict(),
                "optimizer": self.job.optimizer.state_dict(),
                "lr_scheduler": None
                if self.job.lr_scheduler is None
                else self.job.lr_scheduler.state_dict(),
                "job_rng": to_plain(self.job_slot.rng),
                "ests": ests,
            }
            keep = self.settings.keep_checkpoints
            if background:
                # The live state only: the contexts and RNG states are fresh copies already.
                live = ("model", "optimizer", "lr_scheduler")
                snapshot = payload | {key: host_copy(payload[key]) for key in live}
                path = self.writer.submit(self.checkpoint_dir, self.step, snapshot, keep)
                self.comm.barrier()
                return path
            self.writer.wait()  # a write in flight lands first: files in step order
            path = checkpoint.save(self.checkpoint_dir, self.step, payload, keep)
            if aware is not None:
                written = path.stat()
                try:
                    aware.checkpoint_durable(self.step, [reads for _, reads in gathered])
                except SupersededError:
                    checkpoint.discard(path, written)  # never to be resumed from
                    raise
        self.comm.barrier()
        if aware is not None and gathered is None:
            aware.checkpoint_durable(self.step, None)
        return path

    @property
    def aware(self) -> CheckpointAware | None:
        """The source, when it must hear of checkpoints (the dynamic feed)."""
        return self.source if isinstance(self.source, CheckpointAware) else None

    # -- the loop ----------------------------------------------------------------------

    def _local_steps(self, loader: BatchLoader, grads: GradTaker) -> dict[int, torch.Tensor]:
        """Forward and backward of each of this process's ESTs; gradients go to the reducer."""
        losses: dict[int, torch.Tensor] = {}
        n = self.settings.num_ests
        if self.step_delay > 0:
            time.sleep(self.step_delay)  # a straggler on purpose (tests), not a synchronisation
        self.reducer.begin_step()
        self.buffers.begin_step()
        for ctx in self.contexts:
            inputs, targets = to_device(loader.next(ctx.est), self.device)
            self.buffers.before_est()
            into = self.reducer.accumulate_into(ctx.est)
            grads.prepare(into)
            with self.switcher.inside(ctx):
                loss = self.job.loss(self.model(inputs), targets)
                # Scaled here, the sum over ESTs is the mean: no division of the full gradient.
                (loss / n if n > 1 else loss).backward()  # type: ignore[no-untyped-call]
            self.reducer.add(ctx.est, grads.take(), summed=into is not None)
            losses[ctx.est] = loss.detach()
            self.buffers.after_est(ctx.est)
        return losses

    def _global_step(self, losses: dict[int, torch.Tensor]) -> tuple[bool, list[float]]:
        buffer_sends, buffer_recvs = self.buffers.messages()
        control_sends, control_recvs = self.control.messages(self.stop.is_set(), losses)
        mean = self.reducer.finish(buffer_sends + control_sends, buffer_recvs + control_recvs)
        for param, grad in zip(self.layout.params, mean, strict=True):
            param.grad = grad
        with self.switcher.inside(self.job_slot):
            self.stepper.step()
            if self.job.lr_scheduler is not None:
                self.job.lr_scheduler.step()
        for param in self.layout.params:
            param.grad = None
        self.buffers.end_step()
        self.step += 1
        return self.control.result()

    def run(self) -> RunResult:
        settings = self.settings
        start_step = self.step
        result = RunResult(Outcome.COMPLETED, self.step, "", grad_bytes=self.layout.nbytes)
        began = time.perf_counter()
        try:
            if self.step < settings.total_steps:
                result.outcome = self._train(result)
        finally:
            self.writer.wait()  # the last checkpoint is durable before the run returns
        result.step = self.step
        result.steps_run = self.step - start_step
        result.wall_s = time.perf_counter() - began
        result.paused_s = self.pause.total_s if self.pause is not None else 0.0
        result.bytes_sent = self.comm.bytes_sent
        result.digest = state_digest(training_state(self.model, self.job.optimizer))
        result.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return result

    def _train(self, result: RunResult) -> Outcome:
        settings = self.settings
        aware = self.aware
        if aware is not None:  # before any batch: it may give back what a crash left unread
            aware.begin(self.step, self.my_ests)
        loader = BatchLoader(
            self.job.dataset,
            self.job.collate,
            self.source,
            self.contexts,
            per_est_batch=settings.per_est_batch,
            start_step=self.step,
            procs=settings.loader_procs,
            preserve_caller_rng=not settings.est_rng_contexts,
        )
        grads = GradTaker(self.layout)
        log_file: TextIO | None = None
        if self.loss_log is not None and self.rank == 0:
            self.loss_log.parent.mkdir(parents=True, exist_ok=True)
            log_file = self.loss_log.open("a")
        self.model.train()
        window_start, window_steps, window_paused = time.perf_counter(), 0, 0.0
        window_compute = 0.0
        first_step_at = 0.0
        try:
            while self.step < settings.total_steps:
                if self.pause is not None:
                    window_paused += self.pause.wait(self.stop, self.step)
                computing = time.perf_counter()
                local = self._local_steps(loader, grads)
                window_compute += time.perf_counter() - computing
                stop, losses = self._global_step(local)
                first_step_at = first_step_at or time.time()
                window_steps += 1
                if self.record_losses:
                    result.est_losses.append(losses)
                if log_file is not None:
                    bits = [_loss_bits(v) for v in losses]
                    line = {"step": self.step, "loss_bits": bits, "time": time.time()}
                    log_file.write(json.dumps(line) + "\n")
                    log_file.flush()
                done = self.step >= settings.total_steps
                if self.on_progress and (done or stop or self.step % settings.log_every == 0):
                    now = time.perf_counter()
                    busy = max(now - window_start - window_paused, 1e-9)
                    rate = window_steps * settings.global_batch_size / busy
                    compute = window_compute / max(window_steps, 1)
                    window_start, window_steps, window_paused = now, 0, 0.0
                    window_compute = 0.0
                    mean = sum(losses) / len(losses)
                    self.on_progress(
                        Progress(
                            self.step,
                            settings.total_steps,
                            mean,
                            rate,
                            tuple(losses),
                            compute,
                            first_step_at,
                        )
                    )
                every = settings.checkpoint_every
                if done or stop or (every and self.step % every == 0):
                    held = time.perf_counter()
                    result.checkpoint = self.save_checkpoint(wait=not self.async_checkpoint)
                    result.checkpoint_pause_s += time.perf_counter() - held
                if stop and not done:
                    return Outcome.STOPPED
            return Outcome.COMPLETED
        finally:
            loader.close()
            if log_file is not None:
                log_file.close()


def _no_checkpoint(directory: Path) -> None:
    """A resume that found no checkpoint: an error when one was written (never a silent
    start from scratch), else the job never checkpointed and starts at step 0, saying so."""
    last = checkpoint.recorded(directory)
    if last is not None:
        step, path = last
        raise ValidationError(
            "--resume",
            f"the checkpoint of step {step} was written to {path} but no checkpoint is in "
            f"{directory} any more: refusing to start again at step 0",
        )
    message = f"no checkpoint in {directory}: the job never checkpointed, starting at step 0"
    log.warning(message)
    print(message, flush=True)
