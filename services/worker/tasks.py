"""One task: a job's training processes on this worker, from spawn to their last exit code.

States (TaskState): STARTING until every local process is spawned, RUNNING,
STOPPING after a stop request, then one final state decided by the exit codes
alone:

- every process exited 0: COMPLETED, with the digest the processes wrote;
- every process exited 0 or 75 (the runtime's "checkpointed on request"):
  CHECKPOINTED;
- every process exited 0 after an in-place membership change dropped it (it handed its
  ESTs to the job's other processes): LEFT, the job trains on elsewhere;
- otherwise FAILED, with the exit code of the first process that failed and the
  end of its log (the traceback), or why the daemon killed it (a stop without a
  checkpoint, or a checkpoint that did not come in time).

A process that ran out of memory (killed by the watcher for an RSS above its limit, or
exited with EXIT_OUT_OF_MEMORY after a MemoryError) fails its task with
`out_of_memory` set and a message starting "out of memory": the one failure that a
restart with the same resources would repeat.

Each process may hold CPU cores (`cores`: it pins itself to them, CORES_VARIABLE) and a
memory limit (`memory_limit`: the watcher SIGKILLs a process whose RSS passes it), and,
where the daemon may create cgroups (`cgroups`), a cgroup v2 of its own with both limits;
`enforcement` says how, for the status and the log.

Processes are keyed by the rank they started as (their log, pid and timing files keep that
name); an in-place membership change (`change`, inplace.py) moves their ranks, and
`ranks` says which rank each has now (None: it left).

A background task (DeepPool's multiplexing) starts paused: its pause file exists
before its processes do, and the worker's collocation loop (multiplex.py) removes
and writes it again through `set_pause`.

When one process fails, the others of the task are killed at once: they are
peers of a broken process group and would only wait for it. A watcher thread
per task polls the processes, so nothing depends on a gRPC call to notice an
exit.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gearshift.common.errors import PreconditionError
from gearshift.common.facts import (
    CLEAN_EXITS,
    ENDED_TASK_STATES,
    EXIT_COMPLETED,
    EXIT_OUT_OF_MEMORY,
    OUT_OF_MEMORY,
)
from gearshift.v1 import common_pb2
from gearshift.worker.cgroups import Cgroups
from gearshift.worker.command import PAUSE_FILE, CommandSettings, TaskPlan, timing_file
from gearshift.worker.inplace import MEMBERSHIP_FILE, check, moved
from gearshift.worker.resources import CORES_VARIABLE, format_bytes, format_cores, rss_bytes
from gearshift.worker.runtime import membership
from gearshift.worker.runtime.membership import Change
from gearshift.worker.spawner import Child, Spawner, SpawnRequest
from gearshift.worker.task_logs import cap_log
from gearshift.worker.training_task import TASK_FILE, write_task

log = logging.getLogger("gearshift.worker.tasks")

POLL_S = 0.05
# How a process reports that a peer went away (gloo, NCCL, the store), not a fault of its own.
_PEER_FAILURE = re.compile(
    r"gloo|nccl|Connection (closed|reset)|pair\.cc|DistBackendError|DistNetworkError|"
    r"Broken pipe|ProcessGroup|remote worker",
    re.IGNORECASE,
)
CAP_CHECK_S = 1.0
TAIL_BYTES = 4000


def log_tail(path: Path, limit: int = TAIL_BYTES) -> str:
    """The end of a process log, from its last traceback if there is one."""
    try:
        with path.open("rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - 4 * limit, 0))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    start = text.rfind("Traceback (most recent call last)")
    if start >= 0:
        text = text[start:]
    lines = [line for line in text.splitlines() if line.strip()]
    return "\n".join(lines)[-limit:]


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass
class Task:
    """A task and its processes; thread-safe, state changes under `lock`."""

    plan: TaskPlan
    task_dir: Path
    on_end: Callable[[Task], None]
    state: int = common_pb2.TASK_STATE_STARTING
    created_at: float = field(default_factory=time.time)
    ended_at: float = 0.0
    lease_expires_at: float = 0.0
    exit_code: int = 0
    message: str = ""
    digest: str = ""
    processes: dict[int, Child] = field(default_factory=dict)
    codes: dict[int, int] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    ended: threading.Event = field(default_factory=threading.Event)
    paused: bool = False  # a background task held at its pause file
    pause_reason: str = ""
    pause_count: int = 0
    cores: dict[int, list[int]] = field(default_factory=dict)  # rank -> its cores (none: any)
    memory_limit: int = 0  # bytes of RSS each process may hold (0: no limit)
    out_of_memory: bool = False
    cgroups: Cgroups | None = None  # the daemon's, when it may create them
    _cgroup_of: dict[int, Path] = field(default_factory=dict)  # rank -> its cgroup
    _oom: dict[int, str] = field(default_factory=dict)  # rank -> why the watcher killed it
    _stop_reason: str = ""
    _checkpoint: bool = True
    _first_failure: tuple[int, int] | None = None  # (rank, code)
    _killed_reason: str = ""
    # In-place membership changes (inplace.py): those written to the task's file, the
    # generation they reach, and each process's rank now (by the rank it started as).
    changes: list[Change] = field(default_factory=list)
    ranks: dict[int, int | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ranks = {rank: rank for rank in self.plan.ranks}
        if self.plan.join is not None:
            self.changes = [self.plan.join]

    @property
    def generation(self) -> int:
        return self.changes[-1].generation if self.changes else 0

    @property
    def task_id(self) -> str:
        return self.plan.task_id

    @property
    def job_id(self) -> str:
        return self.plan.job_id

    @property
    def enforcement(self) -> str:
        """How this task's resources are held to, e.g. `affinity cores 0 (rank 0), 1 (rank 1);
        RSS watchdog 1.0 GiB per process`; empty when nothing is limited."""
        return describe_enforcement(self.cores, self.memory_limit, cgroup=bool(self._cgroup_of))

    # -- start -----------------------------------------------------------------------

    def start(
        self,
        spawner: Spawner,
        settings: CommandSettings,
        env: Mapping[str, str],
        code: Callable[[str], Path] | None = None,
    ) -> None:
        """Spawn every local rank and the watcher; a spawn failure fails the task. `code`
        gives the folder of a code package by hash (fetched and unpacked if need be)."""
        self.task_dir.mkdir(parents=True, exist_ok=True)
        task_file = self.task_dir / TASK_FILE
        self.plan.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        if self.plan.background:  # paused until its foreground's step time alone is known
            partner = self.plan.collocation.partner_job_id
            self.set_pause(True, f"measuring foreground {partner}'s step time alone (a baseline)")
        try:
            sha256 = self.plan.spec.entrypoint.code_sha256
            code_dir = None
            if sha256:
                if code is None:
                    raise PreconditionError("this worker cannot fetch code packages")
                code_dir = code(sha256)
            if self.changes:  # a joiner's: before its processes look for it
                membership.write(self.membership_file, self.changes)
            if self.plan.ps_plan is None:  # a PS launcher takes its flags (ps_command)
                write_task(self.plan.training_task(settings, self.task_dir, code_dir), task_file)
            for rank in self.plan.spawned_ranks:
                child_env = dict(self.plan.environment(rank, settings, env))
                child_env.pop(CORES_VARIABLE, None)
                if rank in self.cores:
                    child_env[CORES_VARIABLE] = format_cores(self.cores[rank])
                argv = self.plan.command(rank, settings, task_file)
                # D2 pins kernels through variables torch reads at import: a fresh interpreter.
                # A PS launcher forks its own processes and handles signals: fresh too.
                forkable = (
                    self.plan.spec.determinism != common_pb2.DETERMINISM_LEVEL_D2
                    and self.plan.ps_plan is None
                )
                process = spawner.spawn(
                    SpawnRequest(argv, child_env, self.task_dir, self.log_path(rank), forkable)
                )
                (self.task_dir / f"rank{rank}.pid").write_text(f"{process.pid}\n")
                self._join_cgroup(rank, process.pid)
                with self.lock:
                    self.processes[rank] = process
                    stopping = self.state == common_pb2.TASK_STATE_STOPPING
                if stopping:  # a stop came while we were spawning
                    self._signal(process, self._checkpoint)
        except Exception as exc:  # the task fails, with the reason, instead of the daemon
            with self.lock:
                self._killed_reason = f"could not start the training processes: {exc}"
            self._kill_all()
        with self.lock:
            if self.state == common_pb2.TASK_STATE_STARTING:
                self.state = common_pb2.TASK_STATE_RUNNING
        threading.Thread(target=self._watch, name=f"task-{self.task_id}", daemon=True).start()

    def log_path(self, rank: int) -> Path:
        return self.task_dir / f"rank{rank}.log"

    @property
    def pause_file(self) -> Path:
        return self.task_dir / PAUSE_FILE

    @property
    def membership_file(self) -> Path:
        return self.task_dir / MEMBERSHIP_FILE

    # -- in-place membership changes ---------------------------------------------------

    def change(self, change: Change) -> None:
        """Write `change` (the job's next generation) to the file the processes read at every
        step; a generation already written is a retry and changes nothing."""
        with self.lock:
            if change.generation <= self.generation:
                return
            if self.state not in (common_pb2.TASK_STATE_STARTING, common_pb2.TASK_STATE_RUNNING):
                raise PreconditionError(
                    f"task {self.task_id} is {common_pb2.TaskState.Name(self.state)}: "  # type: ignore[arg-type]
                    "only a running task changes in place"
                )
            if self.plan.ps_plan is not None:
                raise PreconditionError("a parameter-server job does not change in place")
            if change.generation != self.generation + 1:
                raise PreconditionError(
                    f"task {self.task_id} is at generation {self.generation}; "
                    f"the next change is {self.generation + 1}, not {change.generation}"
                )
            procs = len(self.changes[-1].mapping) if self.changes else self.plan.world_size
            check(change, self.plan.spec.num_ests, procs, "change")
            membership.write(self.membership_file, [*self.changes, change])
            self.changes.append(change)
            self.ranks = moved(self.ranks, change)
        log.info(
            "membership change written",
            extra={
                "task_id": self.task_id,
                "generation": change.generation,
                "mapping": list(change.mapping),
                "ranks": self.ranks,
            },
        )

    # -- pause (background tasks) ------------------------------------------------------

    def set_pause(self, paused: bool, reason: str, count: int | None = None) -> None:
        """Hold the processes at their next global step (the file), or let them go."""
        with self.lock:
            if self.state in ENDED_TASK_STATES:
                return
            changed = paused != self.paused
            if changed:
                if paused:
                    self.pause_file.touch()
                else:
                    self.pause_file.unlink(missing_ok=True)
            self.paused, self.pause_reason = paused, reason
            if count is not None:
                self.pause_count = count
        if changed:
            log.info(
                "background task paused" if paused else "background task resumed",
                extra={"task_id": self.task_id, "reason": reason, "pause_count": self.pause_count},
            )

    # -- stop --------------------------------------------------------------------------

    def request_stop(self, *, checkpoint: bool, reason: str) -> None:
        """Ask the processes to stop: with a checkpoint at the next global step (the runtime's
        stop signal), or at once (SIGKILL). A stop without checkpoint overrides one with."""
        with self.lock:
            if self.state in ENDED_TASK_STATES:
                return
            if self.state != common_pb2.TASK_STATE_STOPPING or not checkpoint:
                self._checkpoint = checkpoint
                self._stop_reason = reason
            self.state = common_pb2.TASK_STATE_STOPPING
            processes = list(self.processes.values())
        log.info(
            "stopping task",
            extra={"task_id": self.task_id, "checkpoint": checkpoint, "reason": reason},
        )
        if not checkpoint:
            with self.lock:
                self._killed_reason = f"terminated: {reason or 'stopped without a checkpoint'}"
            self._kill_all()
            return
        for process in processes:
            self._signal(process, checkpoint=True)

    def stop(self, *, checkpoint: bool, reason: str, timeout: float) -> None:
        """request_stop, then wait up to `timeout` for the processes to exit; kill them after."""
        self.request_stop(checkpoint=checkpoint, reason=reason)
        if not self.ended.wait(timeout):
            with self.lock:
                if not self._killed_reason:
                    self._killed_reason = (
                        f"no checkpoint within {timeout:.0f}s of the stop request; killed"
                    )
            self._kill_all()
            self.ended.wait(10.0)

    @staticmethod
    def _signal(process: Child, checkpoint: bool) -> None:
        if process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGUSR1 if checkpoint else signal.SIGKILL)

    def _kill_all(self) -> None:
        with self.lock:
            processes = list(self.processes.values())
        for process in processes:
            self._signal(process, checkpoint=False)

    # -- watching ----------------------------------------------------------------------

    def _watch(self) -> None:
        next_cap = time.monotonic()
        while True:
            with self.lock:
                pending = {r: p for r, p in self.processes.items() if r not in self.codes}
            if not pending:
                break
            if time.monotonic() >= next_cap:  # the logs' history stays within its cap
                next_cap += CAP_CHECK_S
                for rank in pending:
                    cap_log(self.log_path(rank))
            for rank, process in pending.items():
                code = process.poll()
                if code is None:
                    self._check_memory(rank, process)
                    continue
                with self.lock:
                    self.codes[rank] = code
                    failed = code not in CLEAN_EXITS
                    if code == EXIT_OUT_OF_MEMORY and rank not in self._oom:
                        self._oom[rank] = "MemoryError in the training process"
                    cgroup = self._cgroup_of.get(rank)
                    if cgroup is not None and rank not in self._oom and Cgroups.oom_killed(cgroup):
                        self._oom[rank] = "killed by the kernel (its cgroup's memory.max)"
                    if failed and self._first_failure is None:
                        self._first_failure = (rank, code)
                if failed:
                    log.warning(
                        "training process failed",
                        extra={"task_id": self.task_id, "rank": rank, "code": code},
                    )
                    self._kill_all()
            time.sleep(POLL_S)
        self._finish()

    def _join_cgroup(self, rank: int, pid: int) -> None:
        """Put a process into a cgroup with its limits; affinity and the watchdog alone
        hold it when that is refused."""
        if self.cgroups is None or not (rank in self.cores or self.memory_limit > 0):
            return
        try:
            path = self.cgroups.create(
                f"{self.task_id}.rank{rank}", self.cores.get(rank, []), self.memory_limit
            )
            self.cgroups.add(path, pid)
        except OSError as exc:
            log.warning(
                "no cgroup for the process; affinity and the watchdog hold it",
                extra={"task_id": self.task_id, "rank": rank, "error": str(exc)},
            )
            return
        with self.lock:
            self._cgroup_of[rank] = path

    def _check_memory(self, rank: int, process: Child) -> None:
        """The memory watchdog: SIGKILL a process whose RSS is above its limit."""
        if self.memory_limit <= 0 or rank in self._oom:
            return
        rss = rss_bytes(process.pid)
        if rss is None or rss <= self.memory_limit:
            return
        with self.lock:
            self._oom[rank] = (
                f"killed by the worker's watchdog: RSS {format_bytes(rss)} > limit "
                f"{format_bytes(self.memory_limit)}"
            )
        log.warning(
            "training process over its memory limit; killing it",
            extra={"task_id": self.task_id, "rank": rank, "rss": rss, "limit": self.memory_limit},
        )
        self._signal(process, checkpoint=False)

    def _finish(self) -> None:
        with self.lock:
            codes = dict(self.codes)
            if self._first_failure is not None or self._killed_reason or not codes:
                self.state = common_pb2.TASK_STATE_FAILED
                self._describe_failure()
            elif all(code == EXIT_COMPLETED for code in codes.values()):
                self.state = common_pb2.TASK_STATE_COMPLETED
                self.digest = self._read_digest()
                if not self.digest and not any(r is not None for r in self.ranks.values()):
                    self.state = common_pb2.TASK_STATE_LEFT
                    self.message = f"every process left the job at generation {self.generation}"
                elif not self.digest:
                    self.state = common_pb2.TASK_STATE_FAILED
                    self.message = "the processes exited 0 but wrote no digest"
            else:
                self.state = common_pb2.TASK_STATE_CHECKPOINTED
            self.ended_at = time.time()
            self.paused = False
            cgroups = list(self._cgroup_of.values())
        for path in cgroups:  # emptied: every process has exited
            Cgroups.remove(path)
        log.info(
            "task ended",
            extra={
                "task_id": self.task_id,
                "state": common_pb2.TaskState.Name(self.state),
                "exit_code": self.exit_code,
                "detail": self.message[-300:],
            },
        )
        try:
            self.on_end(self)  # first: it frees the task's cores before a stop's waiter returns
        finally:
            self.ended.set()

    def _describe_failure(self) -> None:
        """Exit code and message of a failed task (under the lock)."""
        oom = sorted(r for r in self._oom if r in self.codes)
        if oom:  # the cause, however its peers failed after it
            rank = oom[0]
            code = self.codes[rank]
            self.out_of_memory = True
            self.exit_code = code if code > 0 else 128 - code
            tail = log_tail(self.log_path(rank))
            self.message = f"{OUT_OF_MEMORY}: rank {rank} {self._oom[rank]} ({describe_exit(code)})"
            self.message += f"\n{tail}" if tail else ""
        elif self._first_failure is not None:
            rank, code = self._root_cause(self._first_failure)
            self.exit_code = code if code > 0 else 128 - code
            tail = log_tail(self.log_path(rank))
            error = tail.splitlines()[-1] if tail else ""
            # The error first (a UI shows the first line), then the traceback it ends.
            self.message = f"rank {rank} failed ({describe_exit(code)})" + (
                f": {error}\n{tail}" if tail else ""
            )
            if self._killed_reason:
                self.message = f"{self._killed_reason}; {self.message}"
        else:
            self.exit_code = next((c for c in self.codes.values() if c != 0), 0)
            if self.exit_code < 0:
                self.exit_code = 128 - self.exit_code
            self.message = self._killed_reason or "no process ran"

    def _root_cause(self, first: tuple[int, int]) -> tuple[int, int]:
        """The failed rank whose error is its own: when one process crashes, its peers fail
        too, with a communication error, and either may be seen first."""
        failed = [(r, c) for r, c in sorted(self.codes.items()) if c not in CLEAN_EXITS]
        for rank, code in [first, *failed]:
            last = (log_tail(self.log_path(rank)).splitlines() or [""])[-1]
            if code > 0 and not _PEER_FAILURE.search(last):
                return rank, code
        return first

    def _read_digest(self) -> str:
        """The digest a process of this task wrote at the end (under the rank it ended as)."""
        for path in sorted((self.task_dir / "stats").glob("rank*.json")):
            try:
                return str(json.loads(path.read_text())["digest"])
            except (OSError, ValueError, KeyError):
                continue
        return ""

    # -- status --------------------------------------------------------------------------

    def progress(self) -> common_pb2.JobProgress:
        """Rank 0's latest progress if it runs here (the file it keeps: what heartbeats carry
        to the scheduler); only the steps to run otherwise."""
        progress = common_pb2.JobProgress(total_steps=self.plan.total_steps)
        try:
            data = json.loads((self.task_dir / "progress.json").read_text())
        except (OSError, ValueError):
            data = {}
        if data:
            progress.step = int(data.get("step", 0))
            progress.loss = float(data.get("loss", 0.0))
            progress.samples_per_second = max(float(data.get("samples_per_s", 0.0)), 0.0)
            progress.started_fresh = bool(data.get("started_fresh", False))
            progress.first_step_at = max(float(data.get("first_step_at", 0.0)), 0.0)
            progress.paused_from = max(float(data.get("paused_from", 0.0)), 0.0)
        size = self.plan.spec.dataset.size
        if size > 0:
            progress.epoch = progress.step * self.plan.spec.global_batch_size // size
        return progress

    def progress_report(self) -> tuple[float, int] | None:
        """(time written, step) of rank 0's latest progress here; None before the first. The
        file's modification time is when the runtime wrote it, however late it is read."""
        try:
            with (self.task_dir / "progress.json").open("rb") as f:
                written = os.fstat(f.fileno()).st_mtime  # the version read, not a newer one
                return written, int(json.loads(f.read())["step"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def timings(self) -> list[common_pb2.ProcessTiming]:
        """Each local process's latest compute time per step (the files they keep), for the
        scheduler's straggler detection; a process yet to report one is left out."""
        out = []
        with self.lock:
            ranks = dict(self.ranks)
        for slot, rank in ranks.items():
            if rank is None:  # it left the job
                continue
            try:
                data = json.loads((self.task_dir / timing_file(slot)).read_text())
                timing = common_pb2.ProcessTiming(
                    rank=rank,
                    step=int(data["step"]),
                    compute_seconds_per_step=float(data["compute_s"]),
                    ests=int(data["ests"]),
                )
            except (OSError, ValueError, KeyError, TypeError):
                continue
            out.append(timing)
        return out

    def status(self) -> common_pb2.TaskStatus:
        with self.lock:
            return common_pb2.TaskStatus(
                task_id=self.task_id,
                job_id=self.job_id,
                state=self.state,  # type: ignore[arg-type]
                progress=self.progress(),
                exit_code=self.exit_code,
                message=self.message,
                digest=self.digest,
                checkpoint_path=str(self.plan.checkpoint_dir),
                paused=self.paused,
                pause_reason=self.pause_reason,
                pause_count=self.pause_count,
                enforcement=self.enforcement,
                out_of_memory=self.out_of_memory,
                process_timings=self.timings(),
                ps_metrics=self.ps_metrics(),
            )

    def ps_metrics(self) -> common_pb2.ParameterServerMetrics | None:
        """A PS task's measured use, from the launcher's progress.json (None: not a PS task,
        or nothing written yet)."""
        if self.plan.ps_plan is None:
            return None
        try:
            data = json.loads((self.task_dir / "progress.json").read_text())["ps_metrics"]
            return common_pb2.ParameterServerMetrics(
                worker_cores_used=float(data.get("worker_cores_used", 0.0)),
                ps_cores_per_worker=float(data.get("ps_cores_per_worker", 0.0)),
                ps_cores_used=[float(c) for c in data.get("ps_cores_used", [])],
                worker_memory_bytes_used=int(data.get("worker_memory_bytes_used", 0)),
                ps_memory_bytes_used=int(data.get("ps_memory_bytes_used", 0)),
                ps=int(data.get("ps", 0)),
                workers=int(data.get("workers", 0)),
                heldout_auc=float(data.get("heldout_auc", 0.0)),
                measured_seconds=float(data.get("measured_seconds", 0.0)),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None


def describe_enforcement(
    cores: dict[int, list[int]], memory_limit: int, *, cgroup: bool = False
) -> str:
    """What holds a task's processes to their resources, in words (empty: nothing)."""
    parts = ["cgroup v2 (cpuset.cpus, memory.max)"] if cgroup else []
    if cores:
        each = ", ".join(f"{format_cores(c)} (rank {r})" for r, c in sorted(cores.items()))
        parts.append(f"affinity cores {each}")
    if memory_limit > 0:
        parts.append(f"RSS watchdog {format_bytes(memory_limit)} per process")
    return "; ".join(parts)
