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
for a copy of the state into shared memory, a forked writer process writes the file, and
`run()` returns once the file is durable.
A membership change (membership.py) is applied in place at a step boundary: the processes
that stay re-form the group with those that join and go on training, the ones that leave
hand their ESTs' contexts over and exit; any failure on the way falls back to the
checkpoint taken at that step.
"""

from __future__ import annotations

import functools
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
from gearshift.worker.runtime.membership import Change, MembershipFile
from gearshift.worker.runtime.offload import HostOptimizer
from gearshift.worker.runtime.pause import PauseGate
from gearshift.worker.runtime.reduce import CanonicalReducer, LocalSumReducer, Reducer
from gearshift.worker.runtime.regroup import ProcessGroups
from gearshift.worker.runtime.rng import derive_seed, from_plain, seeded, to_plain
from gearshift.worker.runtime.settings import Determinism, RunSettings, placement
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
    rank: int = 0  # this process's rank at the end (membership changes move it)
    procs: int = 1  # the job's processes at the end
    changes: list[float] = field(default_factory=list)  # seconds each in-place change took


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
        membership: MembershipFile | None = None,
        groups: ProcessGroups | None = None,
        joining: Change | None = None,
    ) -> None:
        settings.validate()
        check_partition(settings.num_ests, placement)
        self.job = job
        self.settings = settings
        self.checkpoint_dir = checkpoint_dir
        self.job_ref = job_ref or {}
        self.device = device or torch.device("cpu")
        self.membership = membership
        self.groups = groups  # None: membership changes restart the job instead
        self._pending: Change | None = None  # the change this process was asked for
        self._waiting: dict[int, float] = {}  # generation -> since when it waits for joiners
        # A joiner: when the job's processes paused for the change it joined (their last
        # step's end, sent with the state): as new rank 0 it reports the pause's start.
        self._joined_pause = 0.0
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
        self._bind(placement, rank, comm or Comm(rank, len(placement)))
        self.step = 0
        self.job_slot = RngSlot(seeded(derive_seed("job", settings.seed), cuda=self.cuda))
        if joining is not None:
            self.contexts = self._receive(joining)
        elif resume and (path := checkpoint.latest(checkpoint_dir)) is not None:
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
        self.stepper: torch.optim.Optimizer | HostOptimizer = job.optimizer
        if settings.offload_optimizer:
            if self.cuda:
                self.stepper = HostOptimizer(job.optimizer, self.layout.params)
            elif rank == 0:
                message = "--offload-optimizer: on the CPU the optimizer steps on the host already"
                log.info(message)
                print(message, flush=True)

    def _bind(self, placement: Sequence[Sequence[int]], rank: int, comm: Comm) -> None:
        """Take rank `rank` of `placement` in the group of `comm`: what depends on who holds
        which ESTs is built here, at start and after each membership change."""
        settings = self.settings
        self.placement = [list(ests) for ests in placement]
        self.rank = rank
        self.procs = len(placement)
        self.my_ests = sorted(self.placement[rank])
        self.comm = comm
        self.reducer: Reducer
        if settings.determinism is Determinism.D0:
            self.reducer = LocalSumReducer(self.layout, comm)
        else:
            tree = ReductionTree.build(settings.num_ests, settings.tree_shape)
            self.reducer = CanonicalReducer(self.layout, tree, self.placement, comm)
        holder = next(p for p, ests in enumerate(self.placement) if 0 in ests)
        self.buffers = BufferKeeper(self.model, holder, rank, self.procs)
        self.control = ControlExchange(settings.num_ests, self.placement, rank)

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
        self._check_compatible(data, f"the checkpoint {path.name}")
        log.info("resumed from %s at step %d", path, self.step)
        return self._load(data)

    def _receive(self, change: Change) -> list[EstContext]:
        """A joining process's state: the checkpoint's content, sent by a process that stays."""
        data = self.comm.broadcast_object(None, change.sender)
        self._check_compatible(data, f"the state sent by rank {change.sender}")
        self._joined_pause = float(data["paused_from"])
        if self.membership is not None:
            self.membership.generation = change.generation
        log.info("joined generation %d at step %d", change.generation, int(data["step"]))
        return self._load(data)

    def _check_compatible(self, data: dict[str, Any], name: str) -> None:
        """A state this run may continue: the same job, taken with the same fixed settings."""
        meta = data["settings"]
        for key, flag in _FIXED.items():
            if meta[key] != getattr(self.settings, key):
                raise ValidationError(
                    flag,
                    f"{name} was taken with {meta[key]}, not "
                    f"{getattr(self.settings, key)}; it cannot change during a job",
                )
        d2 = Determinism.D2
        if (
            self.settings.determinism is d2
            and meta.get("determinism") == d2
            and meta.get("d2_threads") != self.settings.d2_threads
        ):
            raise ValidationError(
                "--d2-threads",
                f"{name} was taken under D2 with {meta.get('d2_threads')} "
                f"threads, not {self.settings.d2_threads}; it cannot change during a D2 job",
            )
        if data.get("job", {}).get("module") not in (None, self.job_ref.get("module")):
            raise ValidationError("--job", f"{name} belongs to job {data['job']['module']!r}")

    def _load(self, data: dict[str, Any]) -> list[EstContext]:
        """Take the training state of a checkpoint's content; this process's ESTs' contexts."""
        self.model.load_state_dict(data["model"])
        self.job.optimizer.load_state_dict(data["optimizer"])
        if self.job.lr_scheduler is not None:
            self.job.lr_scheduler.load_state_dict(data["lr_scheduler"])
        self.step = int(data["step"])
        self.job_slot.rng = from_plain(data["job_rng"])
        by_est = {int(e["est"]): e for e in data["ests"]}
        return [context_from_plain(by_est[est]) for est in self.my_ests]

    def _payload(self, ests: list[dict[str, Any]]) -> dict[str, Any]:
        """A checkpoint's content: the live training state and every EST's plain context."""
        return {
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

    def save_checkpoint(self, *, wait: bool = True) -> Path | None:
        """All processes call this at the same step boundary; rank 0 writes.

        With `wait=False` rank 0 copies the state into shared memory and a writer process
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
            payload = self._payload(ests)
            keep = self.settings.keep_checkpoints
            if background:
                path = self.writer.submit(self.checkpoint_dir, self.step, payload, keep)
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

    @functools.cached_property
    def aware(self) -> CheckpointAware | None:
        """The source, when it must hear of checkpoints (the dynamic feed). Cached: a protocol
        isinstance check costs tens of microseconds, on every checkpoint's pause."""
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
        control_sends, control_recvs = self.control.messages(
            self.stop.is_set(), losses, change=self._asked_to_change()
        )
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
                if self.async_checkpoint and self.rank == 0:
                    self.writer.start()  # forked before the loop, off every step's pause
                result.outcome = self._train(result)
        finally:
            try:
                self.writer.wait()  # the last checkpoint is durable before the run returns
            finally:
                self.writer.close()
        result.step = self.step
        result.steps_run = self.step - start_step
        result.wall_s = time.perf_counter() - began
        result.paused_s = self.pause.total_s if self.pause is not None else 0.0
        result.bytes_sent = self.comm.bytes_sent
        result.rank, result.procs = self.rank, self.procs
        result.digest = state_digest(training_state(self.model, self.job.optimizer))
        result.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return result

    def _loader(self) -> BatchLoader:
        settings = self.settings
        return BatchLoader(
            self.job.dataset,
            self.job.collate,
            self.source,
            self.contexts,
            per_est_batch=settings.per_est_batch,
            start_step=self.step,
            procs=settings.loader_procs,
            preserve_caller_rng=not settings.est_rng_contexts,
        )

    def _loss_file(self, current: TextIO | None) -> TextIO | None:
        """Rank 0 appends every step's losses to the loss log (ranks move with changes)."""
        if self.loss_log is None or self.rank != 0:
            if current is not None:
                current.close()
            return None
        if current is None:
            self.loss_log.parent.mkdir(parents=True, exist_ok=True)
            current = self.loss_log.open("a")
        return current

    def _train(self, result: RunResult) -> Outcome:
        settings = self.settings
        aware = self.aware
        if aware is not None:  # before any batch: it may give back what a crash left unread
            aware.begin(self.step, self.my_ests)
        loader = self._loader()
        grads = GradTaker(self.layout)
        log_file = self._loss_file(None)
        self.model.train()
        window_start, window_steps, window_paused = time.perf_counter(), 0, 0.0
        window_compute = 0.0
        first_step_at, paused_from = 0.0, self._joined_pause
        try:
            while self.step < settings.total_steps:
                if self.pause is not None:
                    window_paused += self.pause.wait(self.stop, self.step)
                computing = time.perf_counter()
                local = self._local_steps(loader, grads)
                window_compute += time.perf_counter() - computing
                stop, losses = self._global_step(local)
                stepped = time.time()
                first_step_at = first_step_at or stepped
                window_steps += 1
                if self.record_losses:
                    result.est_losses.append(losses)
                if log_file is not None:
                    bits = [_loss_bits(v) for v in losses]
                    line = {"step": self.step, "loss_bits": bits, "time": stepped}
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
                            self.rank,
                            len(self.my_ests),
                            paused_from,
                        )
                    )
                asked = self.control.change_asked_by()
                change = bool(asked) and not done and not stop
                if change and (aware is not None or self.groups is None):
                    # Its reads are acknowledged with checkpoints: the restart path applies it.
                    _say(f"step {self.step}: a membership change restarts this job", self.rank == 0)
                    stop, change = True, False
                every = settings.checkpoint_every
                if done or stop or change or (every and self.step % every == 0):
                    # Before a change too: a change that fails resumes from this checkpoint.
                    held = time.perf_counter()
                    result.checkpoint = self.save_checkpoint(wait=not self.async_checkpoint)
                    result.checkpoint_pause_s += time.perf_counter() - held
                if stop and not done:
                    return Outcome.STOPPED
                if change:
                    began = time.perf_counter()
                    outcome = self._change(asked[0], paused_from=stepped)
                    if outcome is not None:
                        return outcome
                    loader.close()
                    loader = self._loader()
                    log_file = self._loss_file(log_file)
                    result.changes.append(time.perf_counter() - began)
                    first_step_at = 0.0  # the next step is the first on the new processes
                    paused_from = stepped  # the old processes' last step
                    window_start, window_steps, window_paused = time.perf_counter(), 0, 0.0
                    window_compute = 0.0
            return Outcome.COMPLETED
        finally:
            loader.close()
            if log_file is not None:
                log_file.close()

    # -- membership changes ------------------------------------------------------------

    def _asked_to_change(self) -> bool:
        """Whether this process was asked to change membership at the coming step boundary
        (a change it cannot apply is reported, then ignored: the job trains on)."""
        if self.membership is None:
            return False
        change = None
        try:
            change = self.membership.next_change(self.step + 1)
            if change is not None:
                change.check(self.settings.num_ests, self.procs)
        except ValidationError as exc:
            _say(f"ignoring the membership file: {exc.message}", True)
            if change is not None:
                self.membership.reject(change)
            return False
        if change is not None and not self._joiners_ready(change):
            return False
        self._pending = change
        return change is not None

    def _joiners_ready(self, change: Change) -> bool:
        """False while the job trains on waiting for `change`'s joiners: only old rank 0 asks
        for such a change, once they said they are ready or its timeout has passed (the
        change is then tried, and fails over to the restart path if they never come)."""
        if self.groups is None or not self.groups.waits(change, self.procs):
            return True
        if self.rank != 0:
            return False
        since = self._waiting.setdefault(change.generation, time.monotonic())
        return self.groups.joiners_ready(change) or time.monotonic() - since > change.timeout_s

    def _change(self, asker: int, *, paused_from: float) -> Outcome | None:
        """Apply the change rank `asker` was asked for, at this step boundary (the job paused
        for it at `paused_from`): None when this process goes on in the new generation, LEFT
        when it left, STOPPED when the change failed (every process then stops; the
        checkpoint of this step resumes the job)."""
        assert self.membership is not None and self.groups is not None
        step = self.step
        try:
            change: Change = self.comm.broadcast_object(self._pending, asker)
            self._pending = None
            # Every EST's context to every old process: a leaving one's ESTs go elsewhere.
            parts = self.comm.all_gather_object([context_to_plain(c) for c in self.contexts])
            ests = sorted((c for part in parts for c in part), key=lambda c: int(c["est"]))
            self.membership.generation = change.generation
            rank = change.new_rank(self.rank)
            if rank is None:
                self.groups.close()
                _say(f"left the job at step {step} (generation {change.generation})", True)
                return Outcome.LEFT
            comm = self.groups.form(
                change.generation,
                rank,
                change.procs,
                change.master_addr,
                join_timeout_s=change.timeout_s,
                backend=change.backend,
            )
            if change.joiners:  # on the host: a GPU tensor would unpickle onto the sender's GPU
                sent: dict[str, Any] | None = None
                if rank == change.sender:
                    sent = host_copy(self._payload(ests)) | {"paused_from": paused_from}
                comm.broadcast_object(sent, change.sender)
            comm.bytes_sent += self.comm.bytes_sent  # earlier generations' bytes still count
            self._bind(placement(change.mapping), rank, comm)
            by_est = {int(c["est"]): c for c in ests}
            self.contexts = [context_from_plain(by_est[est]) for est in self.my_ests]
        except Exception as exc:  # any failure: the checkpoint of this step restarts the job
            log.exception("membership change failed at step %d", step)
            _say(
                f"the membership change at step {step} failed ({type(exc).__name__}: {exc}); "
                "stopping: resume from this step's checkpoint",
                True,
            )
            self.groups.close()
            return Outcome.STOPPED
        _say(
            f"step {step}: generation {change.generation}, {change.procs} processes",
            self.rank == 0,
        )
        return None


def _say(message: str, loud: bool) -> None:
    """A line in the log, and on standard output when `loud`."""
    log.info(message)
    if loud:
        print(message, flush=True)


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
