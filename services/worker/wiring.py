"""How one training process is connected to the services, from its TrainingTask.

The runtime stays unaware of the cluster: it takes a data source and a progress
callback (its seams). This module fills them from the services a worker daemon
names in the task (training_task.ServiceSettings): the shard manager's dataset as
the source; rank 0's progress kept in its progress file, which the worker daemon
reads and carries to the scheduler in its heartbeats (the one path progress takes),
and turned into runtime samples for the Brain. A stop comes as a signal from the
worker daemon (the runtime's stop flag). Without services a process trains alone,
as in a local run.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from gearshift.common.auth import TOKEN_VARIABLE, ClientTls
from gearshift.common.channel import plain_channel
from gearshift.common.errors import ValidationError
from gearshift.worker.datasource import (
    DataPlan,
    DynamicFeed,
    ManagedShards,
    epochs_needed,
    index_log_path,
)
from gearshift.worker.reporting import ReportTarget, SampleReporter
from gearshift.worker.runtime import checkpoint
from gearshift.worker.runtime.data import DataSource, LocalShards
from gearshift.worker.runtime.settings import RunSettings
from gearshift.worker.shard_client import ShardClient
from gearshift.worker.training_task import ProcessSettings

log = logging.getLogger("gearshift.worker.wiring")


def _write_json(path: Path, value: object) -> None:
    """Replace `path` atomically, so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)


@dataclass
class Wiring:
    """The seams of one training process, filled from its settings."""

    rank: int
    settings: RunSettings
    data_mode: str = "local"
    data_size: int = 0
    plan: DataPlan | None = None
    shard_manager: str = ""
    token: str | None = None
    tls: ClientTls | None = None
    reporter: SampleReporter | None = None
    progress_file: Path | None = None
    timing_file: Path | None = None  # every rank's compute time per step (stragglers)
    index_log_dir: Path | None = None  # dynamic mode: every shard read, logged (tests)
    placement: str = ""  # the task id up to its worker: the same for the whole placement
    generation: int = 0  # the placement's generation: fences its shard holders (0: unfenced)
    started_fresh: bool = False  # told to resume, found no checkpoint: starts at step 0
    _feed: DynamicFeed | None = field(default=None, init=False)
    _client: ShardClient | None = field(default=None, init=False)

    @classmethod
    def connect(cls, p: ProcessSettings) -> Wiring:
        """The seams of process `p` (rank 0 starts reporting to the Brain at once)."""
        token = os.environ.get(TOKEN_VARIABLE) or None
        tls = ClientTls.from_environment(os.environ)
        s, settings = p.services, p.run
        wiring = cls(
            rank=p.rank,
            settings=settings,
            data_mode=s.data_mode,
            data_size=s.data_size,
            shard_manager=s.shard_manager,
            token=token,
            tls=tls,
            progress_file=s.progress_file,
            timing_file=s.timing_file,
            index_log_dir=s.index_log_dir,
            placement=s.task_id.rpartition(".")[0] or s.task_id,
            generation=s.generation,
        )
        if wiring.progress_file is not None and p.resume and p.rank == 0:
            wiring.started_fresh = checkpoint.latest(p.checkpoint_dir) is None
            if wiring.started_fresh:  # said before the first step, which may be far off
                wiring.progress(0, settings.total_steps, 0.0, 0.0)
        if s.data_mode != "local":
            if not s.shard_manager:
                raise ValidationError(
                    "--shard-manager", f"is required by --data-mode {s.data_mode}"
                )
            if not s.data_size:
                raise ValidationError("--data-size", f"is required by --data-mode {s.data_mode}")
            wiring.plan = _plan(s.dataset_id, s.job_id, s.data_mode, s.data_size, settings)
        if p.rank == 0 and s.brain:
            target = ReportTarget(
                job_id=s.job_id,
                task_id=s.task_id,
                brain=s.brain,
                token=token,
                tls=tls,
                accelerator_type=s.accelerator_type,
                ests_per_device=p.mapping,
            )
            wiring.reporter = SampleReporter(target, interval=s.report_interval)
            wiring.reporter.start()
        return wiring

    def source(self) -> DataSource | None:
        """The data source the runtime reads (None: its own local plan of the whole dataset)."""
        s = self.settings
        if self.plan is None:
            if not self.data_size:
                return None
            return LocalShards(self.data_size, s.shard_size, s.seed, s.num_ests)
        self._client = ShardClient(
            plain_channel(self.shard_manager, tls=self.tls), token=self.token
        )
        if self.data_mode == "dynamic":
            index_log = None
            if self.index_log_dir is not None:
                index_log = index_log_path(self.index_log_dir, self.plan.job_id, self.rank)
            self._feed = DynamicFeed(
                self._client,
                self.plan,
                s.per_est_batch,
                index_log=index_log,
                placement=self.placement,
                generation=self.generation,
            )
            self._feed.create()
            return self._feed
        managed = ManagedShards(self._client, self.plan)
        managed.create()
        return managed

    def progress(
        self,
        step: int,
        total: int,
        loss: float,
        samples_per_s: float,
        *,
        first_step_at: float = 0.0,
        paused_from: float = 0.0,
    ) -> None:
        """Rank 0's progress callback: a sample for the Brain, the file for the daemon (with
        the time of this run's first step and, after an in-place change, when the job paused
        for it: the scheduler times rescales by them)."""
        if self.reporter is not None:
            self.reporter.record(step, samples_per_s)
        if self.progress_file is not None:
            try:
                _write_json(
                    self.progress_file,
                    {
                        "step": step,
                        "total_steps": total,
                        "loss": loss,
                        "samples_per_s": samples_per_s,
                        "started_fresh": self.started_fresh,
                        "first_step_at": first_step_at,
                        "paused_from": paused_from,
                    },
                )
            except OSError as exc:  # the daemon's view is a convenience, never a reason to stop
                log.warning("progress file not written", extra={"error": str(exc)})

    def timing(self, step: int, compute_s: float, ests: int) -> None:
        """Every rank's compute time per step, kept for its worker daemon's heartbeats."""
        if self.timing_file is None or step < 1:
            return
        try:
            _write_json(self.timing_file, {"step": step, "compute_s": compute_s, "ests": ests})
        except OSError as exc:  # as the progress file: never a reason to stop
            log.warning("timing file not written", extra={"error": str(exc)})

    def close(self) -> None:
        if self.reporter is not None:
            self.reporter.close()
        if self._feed is not None:
            self._feed.close()
        if self._client is not None:
            self._client.close()


def _plan(
    dataset_id: str, job_id: str, data_mode: str, data_size: int, settings: RunSettings
) -> DataPlan:
    """The job's dataset in the shard manager; every process computes the same one."""
    if not dataset_id:
        raise ValidationError("--dataset-id", f"is required by --data-mode {data_mode}")
    if not job_id:
        raise ValidationError("--job-id", f"is required by --data-mode {data_mode}")
    n, b = settings.num_ests, settings.per_est_batch
    if data_mode == "dynamic":
        shards = math.ceil(data_size / b)
        # A restart reads again only what its predecessor read after its last checkpoint,
        # as shards of their own epoch (provisional acks): the epochs the steps need and
        # one more would do; twice that is kept, as datasets of running jobs have it.
        epochs = 2 * math.ceil(settings.total_steps * n / shards) + 1
        shard_size = b
    else:
        epochs = epochs_needed(data_size, settings.shard_size, n, b, settings.total_steps)
        shard_size = settings.shard_size
    return DataPlan(
        dataset_id=dataset_id,
        job_id=job_id,
        size=data_size,
        shard_size=shard_size,
        seed=settings.seed,
        num_ranks=n if data_mode == "deterministic" else 0,
        num_epochs=epochs,
    )
