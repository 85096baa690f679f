"""The worker daemon's domain: its devices and tasks; what the WorkerAgent RPCs do.

StartTask is idempotent by task id (a retried call returns the running task's
status and spawns nothing). An ended task is kept (for GetTaskStatus, the
heartbeats and TaskFinished) until the scheduler has acknowledged its end and
`keep_seconds` have passed.

Collocated tasks (a role in StartTaskRequest.collocation) share devices on purpose;
the background ones are paused and resumed by the collocation loop (multiplex.py),
which starts with the first of them.

A task asking for CPU cores per process gets concrete cores from this worker's
(CoreAllocator), held until it ends; a start that cannot get them is refused
(RESOURCE_EXHAUSTED) and starts nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gearshift.common.codepkg import unpack
from gearshift.common.errors import NotFoundError, PreconditionError, ValidationError
from gearshift.common.facts import ENDED_TASK_STATES
from gearshift.v1 import common_pb2, worker_pb2
from gearshift.worker import metrics, task_logs
from gearshift.worker.cgroups import Cgroups
from gearshift.worker.collocation import Policy
from gearshift.worker.command import STEP_LOG, CommandSettings, plan_task
from gearshift.worker.devices import device_types
from gearshift.worker.fence import EpochFence
from gearshift.worker.inplace import to_change
from gearshift.worker.multiplex import Multiplexer
from gearshift.worker.resources import CoreAllocator, detect_cores, format_bytes
from gearshift.worker.spawner import Spawner
from gearshift.worker.step_log import read_steps
from gearshift.worker.tasks import Task

log = logging.getLogger("gearshift.worker.agent")

DEFAULT_STOP_TIMEOUT_S = 60.0
KEEP_SECONDS = 600.0
ACTIVE = (
    common_pb2.TASK_STATE_STARTING,
    common_pb2.TASK_STATE_RUNNING,
    common_pb2.TASK_STATE_STOPPING,
)


class Agent:
    """Tasks of this worker; the servicer and the scheduler link call it."""

    def __init__(
        self,
        worker_id: str,
        devices: Sequence[common_pb2.DeviceGroup],
        work_dir: Path,
        settings: CommandSettings,
        *,
        env: Mapping[str, str] | None = None,
        spawner: Spawner | None = None,
        keep_seconds: float = KEEP_SECONDS,
        collocation: Policy | None = None,
        cores: Sequence[int] | None = None,
        memory_bytes: int = 0,
        cgroups: Cgroups | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.devices = list(devices)
        self.work_dir = work_dir
        self.settings = settings
        self.env = dict(os.environ if env is None else env)
        self.spawner = spawner or Spawner(
            zygote_python=settings.python if settings.zygote else None, env=self.env
        )
        self.keep_seconds = keep_seconds
        self.on_task_end: Callable[[Task], None] = lambda task: None
        # Set by the scheduler link: a code package's bytes by hash (FetchCode).
        self.fetch_code: Callable[[str], bytes] | None = None
        self._code_lock = threading.Lock()
        self._tasks: dict[str, Task] = {}
        self._reported: set[str] = set()  # ended tasks whose end the scheduler acknowledged
        self._lock = threading.Lock()
        self._closing = False
        self._types = device_types(self.devices)
        self.multiplexer = Multiplexer(self.running, collocation or Policy())
        self.cores = CoreAllocator(detect_cores() if cores is None else cores)
        self.memory_bytes = memory_bytes  # host memory offered (0: unknown)
        self.cgroups = cgroups  # set up by the daemon when it may create cgroups
        self.fence = EpochFence()  # the newest scheduler leader heard from (fence.py)

    # -- RPCs ----------------------------------------------------------------------

    def start(self, request: worker_pb2.StartTaskRequest) -> common_pb2.TaskStatus:
        """Start a task, or return the status of the one with that id (refused from a
        deposed scheduler leader: fence.py)."""
        self.fence.admit(request.epoch, "StartTask")
        plan = plan_task(request, self.worker_id, self._types)
        self._check_resources(request)
        with self._lock:
            existing = self._tasks.get(plan.task_id)
            if existing is not None:
                return existing.status()
            if self._closing:
                raise PreconditionError(f"worker {self.worker_id!r} is shutting down")
            collocated = plan.collocation.role != common_pb2.COLLOCATION_ROLE_UNSPECIFIED
            cores: list[list[int]] = []
            if request.cpu_cores_per_process > 0:  # refused here, before anything changes
                cores = self.cores.take(
                    plan.task_id,
                    request.cpu_cores_per_process,
                    len(plan.ranks),
                    share=collocated,
                )
            busy = {
                d: t.task_id
                for t in self._tasks.values()
                if t.state in ACTIVE
                for d in t.plan.device_of.values()
            }
            for rank, device in plan.device_of.items():
                if device in busy and not collocated:
                    log.warning(
                        "device still held by an earlier task",
                        extra={"device": device, "task_id": busy[device], "rank": rank},
                    )
            task = Task(plan, self.work_dir / "tasks" / plan.task_id, self._ended)
            task.lease_expires_at = request.lease.expires_at
            task.cores = dict(zip(plan.ranks, cores, strict=False))
            task.memory_limit = request.memory_bytes_per_process
            task.cgroups = self.cgroups
            self._tasks[plan.task_id] = task
        log.info(
            "starting task",
            extra={
                "task_id": plan.task_id,
                "job_id": plan.job_id,
                "ranks": list(plan.ranks),
                "world_size": plan.world_size,
                "resume": plan.resume,
                "enforcement": task.enforcement or "none",
            },
        )
        if plan.background:
            self.multiplexer.start()
        task.start(self.spawner, self.settings, self.env, self.code_dir)
        metrics.task_started()
        return task.status()

    def code_dir(self, sha256: str) -> Path:
        """A code package's folder in this worker's cache, fetched and unpacked once."""
        cache = self.work_dir / "code"
        with self._code_lock:  # one fetch per package, however many tasks start at once
            if (cache / sha256).is_dir():
                return cache / sha256
            if self.fetch_code is None:
                raise PreconditionError(f"worker {self.worker_id!r} has no scheduler to fetch from")
            data = self.fetch_code(sha256)
            log.info("code package fetched", extra={"sha256": sha256, "size": len(data)})
            return unpack(data, cache, sha256)

    def logs(
        self, task_id: str, rank: int, tail_lines: int, follow: bool, active: Callable[[], bool]
    ) -> Iterator[common_pb2.LogLine]:
        """A task's output lines, by rank (-1: every rank of it here)."""
        task = self._task(task_id)
        # A process keeps the log of the rank it started as; an in-place change gives it
        # another rank (Task.ranks: started as -> now), which is the one asked for.
        now = {current: slot for slot, current in task.ranks.items() if current is not None}
        if rank >= 0 and rank not in now:
            raise NotFoundError(f"rank {rank} of task", task_id)
        paths = (
            {r: task.log_path(r) for r in task.plan.ranks}
            if rank < 0
            else {rank: task.log_path(now[rank])}
        )
        for r, text in task_logs.follow(
            paths, tail_lines, keep_following=follow, done=task.ended.is_set, active=active
        ):
            yield common_pb2.LogLine(
                job_id=task.job_id, rank=r, time=time.time(), text=text, task_id=task_id
            )

    def step_log(self, task_id: str, after_step: int) -> list[common_pb2.StepLoss]:
        """The step log of the task's job (its checkpoint folder is the job's, whichever
        task of it wrote there), from `after_step` on."""
        return read_steps(self._task(task_id).plan.checkpoint_dir / STEP_LOG, after_step)

    def stop(
        self, task_id: str, *, checkpoint: bool, reason: str, timeout: float, epoch: int = 0
    ) -> common_pb2.TaskStatus:
        """Stop a task and wait (bounded) for its processes; an ended task's status as is
        (refused from a deposed scheduler leader: fence.py)."""
        self.fence.admit(epoch, "StopTask")
        task = self._task(task_id)
        task.stop(checkpoint=checkpoint, reason=reason, timeout=timeout or DEFAULT_STOP_TIMEOUT_S)
        return task.status()

    def change(
        self, task_id: str, message: worker_pb2.MembershipChange, epoch: int = 0
    ) -> common_pb2.TaskStatus:
        """Write an in-place membership change for a running task's processes (refused from
        a deposed scheduler leader: fence.py; see Task.change)."""
        self.fence.admit(epoch, "ChangeMembership")
        task = self._task(task_id)
        task.change(to_change(message, "change"))
        return task.status()

    def status(self, task_id: str) -> common_pb2.TaskStatus:
        return self._task(task_id).status()

    def describe(self) -> worker_pb2.WorkerDescription:
        return worker_pb2.WorkerDescription(
            worker_id=self.worker_id, devices=self.devices, tasks=self.statuses()
        )

    def _task(self, task_id: str) -> Task:
        with self._lock:
            task = self._tasks.get(task_id)
        if task is None:
            raise NotFoundError("task", task_id)
        return task

    # -- for the scheduler link ------------------------------------------------------

    def statuses(self) -> list[common_pb2.TaskStatus]:
        """Every known task, running and recently ended."""
        self._forget_old()
        with self._lock:
            tasks = list(self._tasks.values())
        return [t.status() for t in tasks]

    def unreported(self) -> list[common_pb2.TaskStatus]:
        """Active tasks, and ended ones whose end the scheduler has not acknowledged."""
        with self._lock:
            tasks = [t for t in self._tasks.values() if t.task_id not in self._reported]
        return [t.status() for t in tasks]

    def running(self) -> list[Task]:
        with self._lock:
            return [t for t in self._tasks.values() if t.state in ACTIVE]

    def acknowledged(self, task_id: str) -> None:
        """The scheduler took note of the task's end."""
        with self._lock:
            self._reported.add(task_id)

    def _check_resources(self, request: worker_pb2.StartTaskRequest) -> None:
        if request.cpu_cores_per_process < 0:
            raise ValidationError("cpu_cores_per_process", "must be >= 0 (0: no limit)")
        if request.memory_bytes_per_process < 0:
            raise ValidationError("memory_bytes_per_process", "must be >= 0 (0: no limit)")
        if self.memory_bytes and request.memory_bytes_per_process > self.memory_bytes:
            raise ValidationError(
                "memory_bytes_per_process",
                f"{format_bytes(request.memory_bytes_per_process)} is more than this worker's "
                f"{format_bytes(self.memory_bytes)}",
            )

    def _ended(self, task: Task) -> None:
        self.cores.release(task.task_id)
        metrics.task_ended(task.state)
        self.on_task_end(task)

    def _forget_old(self) -> None:
        cutoff = time.time() - self.keep_seconds
        with self._lock:
            for task_id, task in list(self._tasks.items()):
                if (
                    task.state in ENDED_TASK_STATES
                    and task_id in self._reported
                    and task.ended_at < cutoff
                ):
                    del self._tasks[task_id]
                    self._reported.discard(task_id)

    # -- shutdown ----------------------------------------------------------------------

    def shutdown(self, timeout: float) -> None:
        """Stop every task with a checkpoint, in parallel, waiting up to `timeout` each."""
        with self._lock:
            self._closing = True
        self.multiplexer.close()  # a paused task stops all the same (a stop ends the wait)
        tasks = self.running()
        if not tasks:
            return
        log.info("checkpointing tasks before exit", extra={"tasks": [t.task_id for t in tasks]})
        with ThreadPoolExecutor(max_workers=len(tasks)) as pool:
            for task in tasks:
                pool.submit(
                    task.stop, checkpoint=True, reason="worker shutting down", timeout=timeout
                )
