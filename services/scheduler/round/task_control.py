"""Starting and stopping a job's tasks on the worker daemons (StartTask / StopTask).

A placement becomes one task per worker (the job's processes there), saved
before any StartTask is sent; stops checkpoint (rescale, preemption) or kill
(cancel, failure). StopTask is the only way the scheduler stops a task, and a
stop always ends (see stop_tasks). Calls go out in parallel, outside the
scheduler's lock; the records they change are updated under it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence

import grpc

from gearshift.common import execplan
from gearshift.common.errors import ResourceExhaustedError, rpc_code, rpc_details
from gearshift.common.facts import ENDED_TASK_STATES
from gearshift.common.identity import JobTokens
from gearshift.scheduler.round.hooks import PlansProcesses, StartPlan
from gearshift.scheduler.round.placement import build_placement, local_ranks, workers_of
from gearshift.scheduler.round.process_resources import launcher_cores, process_resources
from gearshift.scheduler.round.workers import WorkerAgents
from gearshift.scheduler.state.records import JobRecord, TaskRecord, WorkerRecord
from gearshift.scheduler.state.state import SchedulerState
from gearshift.scheduler.types import Device
from gearshift.v1 import common_pb2, worker_pb2

log = logging.getLogger("gearshift.scheduler")
C = common_pb2
# Rendezvous ports handed out per worker, from --rendezvous-port-base on, in turn.
RENDEZVOUS_PORTS = 100
# StartTask errors that mean the worker is gone (or unreachable) rather than the request bad.
UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

StartRequests = list[tuple[str, worker_pb2.StartTaskRequest]]


class TaskControl:
    """StartTask and StopTask for the scheduler's jobs."""

    def __init__(
        self,
        state: SchedulerState,
        agents: WorkerAgents,
        job_tokens: JobTokens | None = None,
        processes: PlansProcesses | None = None,
    ) -> None:
        self.state = state
        self.agents = agents
        self.job_tokens = job_tokens  # each task's processes call as their job (identity.py)
        self.processes = processes  # the process plans (hooks.py; None: the worker's share)
        self._last_port: dict[str, int] = {}  # host -> last rendezvous port handed out
        self._ports_in_use: dict[str, set[int]] | None = None  # within ports_indexed()

    # Starting ---------------------------------------------------------------------
    def prepare_start(
        self,
        job: JobRecord,
        assignments: Sequence[tuple[Device, int]],
        *,
        profile_first: bool = False,
        profile_rubick: bool = False,
        plan: common_pb2.ExecutionPlan | None = None,
        cpus_per_device: int = 0,
    ) -> tuple[common_pb2.Placement, list[TaskRecord], StartRequests]:
        """Tasks and StartTask requests of a new placement, saved before any is sent
        (under the lock); `profile_first`: rank 0 measures the job's layer profile first;
        `profile_rubick`: rank 0 runs Rubick's profiling run first;
        `plan`: the execution plan to run (None: the job's current one). A plan the job's
        spec does not allow raises ValidationError naming the plan's field, before anything
        changes. Each process gets its worker's share of cores and memory
        (process_resources; `cpus_per_device` > 0 sets the cores), or what the process
        plan (`PlansProcesses`) gives, with its loader processes. A parameter-server job
        runs the processes its plan names, its one process holding the plan's cores, at
        most its worker's share."""
        plan = job.plan if plan is None else plan
        execplan.check_allowed(job.spec, plan)
        start = self.processes.start_plan(job) if self.processes is not None else StartPlan()
        state = self.state
        placement = build_placement(assignments)
        rendezvous = self.rendezvous_for(placement)  # raises before anything changes
        resume = job.generation > 0
        job.generation += 1
        tasks: list[TaskRecord] = []
        requests: StartRequests = []
        for worker_id in workers_of(placement):
            ranks = local_ranks(placement, worker_id)
            task, request = self._task(
                job,
                placement,
                worker_id,
                f"{job.job_id}.g{job.generation}.{worker_id}",
                ranks=ranks,
                rendezvous=rendezvous,
                start=start,
                plan=plan,
                cpus_per_device=cpus_per_device,
            )
            request.resume = resume
            request.profile_first = profile_first and 0 in ranks
            request.profile_rubick = profile_rubick and 0 in ranks
            tasks.append(task)
            requests.append((state.workers[worker_id].address, request))
        job.process_plan = start.process_plan  # a restarted scheduler keeps them
        if start.ps_plan:
            job.ps_plan = start.ps_plan
        state.store.save_tasks(tasks)
        state.store.save_job(job)
        return placement, tasks, requests

    def prepare_join(
        self,
        job: JobRecord,
        placement: common_pb2.Placement,
        change: worker_pb2.MembershipChange,
        joining: Mapping[str, Sequence[int]],
        *,
        group: str,
        cpus_per_device: int = 0,
    ) -> tuple[list[TaskRecord], StartRequests]:
        """Under the lock: the tasks and StartTask requests of the processes that join a
        running job in place (`joining`: their new ranks by worker), saved before any is
        sent. Each task's id shares the running tasks' rendezvous group (`group`, JOB.gN)
        and names the change's generation, unique on its worker."""
        start = self.processes.start_plan(job) if self.processes is not None else StartPlan()
        tasks: list[TaskRecord] = []
        requests: StartRequests = []
        for worker_id, ranks in joining.items():
            task, request = self._task(
                job,
                placement,
                worker_id,
                f"{group}.{worker_id}-m{change.generation}",
                ranks=ranks,
                rendezvous=change.master_addr,
                start=start,
                plan=job.plan,
                cpus_per_device=cpus_per_device,
            )
            request.join_generation = change.generation
            request.membership.CopyFrom(change)
            tasks.append(task)
            requests.append((self.state.workers[worker_id].address, request))
        self.state.store.save_tasks(tasks)
        return tasks, requests

    def rendezvous_for(self, placement: common_pb2.Placement) -> str:
        """A free rendezvous address on the host of the placement's rank 0 (under the lock;
        ResourceExhaustedError when the host has none)."""
        rank0 = self.state.workers[placement.processes[0].worker_id]
        host = rank0.address.rpartition(":")[0] or "127.0.0.1"
        return f"{host}:{self._free_port(host)}"

    def _task(
        self,
        job: JobRecord,
        placement: common_pb2.Placement,
        worker_id: str,
        task_id: str,
        *,
        ranks: Sequence[int],
        rendezvous: str,
        start: StartPlan,
        plan: common_pb2.ExecutionPlan,
        cpus_per_device: int,
    ) -> tuple[TaskRecord, worker_pb2.StartTaskRequest]:
        """Under the lock: one worker's task of a placement (recorded in the state, not yet
        saved) and its StartTask request. Each process gets its worker's share of cores
        and memory (process_resources; `cpus_per_device` > 0 sets the cores), or what the
        process plan (`start`) gives, with its loader processes."""
        state = self.state
        settings = state.settings
        now = state.clock()
        checkpoint_dir = os.path.join(settings.checkpoint_root, job.job_id)
        task = TaskRecord(
            task_id=task_id,
            job_id=job.job_id,
            worker_id=worker_id,
            generation=job.generation,
            state=C.TASK_STATE_STARTING,
            local_ranks=tuple(ranks),
            rendezvous_address=rendezvous,
            lease_expires_at=now + settings.lease_seconds,
            created_at=now,
            checkpoint_path=checkpoint_dir,
        )
        state.tasks[task_id] = task
        worker = state.workers[worker_id]
        cores, memory = process_resources(
            worker.cpu_cores,
            worker.memory_bytes,
            worker.devices,
            cpus_per_device,
            state.memory_factor.get(job.job_id, 1),
            plan_cores=start.cpu_cores,
            plan_memory=start.memory_bytes,
        )
        if start.ps is not None:
            cores = launcher_cores(start.ps_cores, cores or worker.cpu_cores)
        request = worker_pb2.StartTaskRequest(
            task_id=task_id,
            job_id=job.job_id,
            spec=job.spec,
            placement=placement,
            local_ranks=ranks,
            rendezvous_address=rendezvous,
            checkpoint_dir=checkpoint_dir,
            lease=common_pb2.Lease(task_id=task_id, expires_at=task.lease_expires_at),
            endpoints=worker_pb2.ServiceEndpoints(
                brain=settings.brain_address,
                shard_manager=settings.shard_manager_address,
            ),
            dataset_id=job.job_id,
            job_token=self.job_tokens.mint(job.job_id) if self.job_tokens else "",
            collocation=job.collocation if job.collocation.role else None,
            plan=plan,
            cpu_cores_per_process=cores,
            memory_bytes_per_process=memory,
            loader_procs_per_process=start.loader_procs,
            generation=job.generation,
            ps_plan=start.ps,
            epoch=state.epoch,
        )
        return task, request

    @contextlib.contextmanager
    def ports_indexed(self) -> Iterator[None]:
        """For a run of starts (a round's, in its holds of the lock): the rendezvous ports
        in use found once, by host, and each port handed out added (a round of a thousand
        starts scanned every task a thousand times: most of the round's CPU). Found once for
        the run, not in each of its holds (3-4 ms of each at 3,000 tasks, bench/load.py):
        a task's address is set when it is made, only the rounds make tasks, and a port
        freed meanwhile stays taken until the next run."""
        with self.state.lock:
            tasks = list(self.state.tasks.values())
        self._ports_in_use = ports_by_host(tasks)
        try:
            yield
        finally:
            self._ports_in_use = None

    def _free_port(self, host: str) -> int:
        """A rendezvous port on the host: not held by an open task's rank 0 there (of any
        worker: several worker daemons may share a host), and not the one handed out last
        (a port some other program holds fails the start; the restart then tries the next
        one instead of failing again)."""
        index = self._ports_in_use
        used = (index if index is not None else ports_by_host(self.state.tasks.values())).get(
            host, set()
        )
        base = self.state.settings.rendezvous_port_base
        span = RENDEZVOUS_PORTS
        start = self._last_port.get(host, base - 1) + 1 - base
        for offset in range(span):
            port = base + (start + offset) % span
            if port not in used:
                self._last_port[host] = port
                if index is not None:
                    index.setdefault(host, set()).add(port)
                return port
        raise ResourceExhaustedError(
            f"no free rendezvous port on {host} in {base}-{base + span - 1} "
            f"({span} jobs with rank 0 on that host already): the job waits for one"
        )

    def start_jobs(self, jobs: Sequence[StartRequests]) -> list[tuple[list[str], set[str]] | None]:
        """Send the StartTask calls of several jobs' placements, all at once
        (WorkerAgents.start_all): for each job, its failures and the addresses of workers
        that could not be reached, or None when a call of its broke (logged)."""
        answers = self.agents.start_all([call for requests in jobs for call in requests])
        out: list[tuple[list[str], set[str]] | None] = []
        delivered: list[str] = []
        first = 0
        for requests in jobs:
            mine = answers[first : first + len(requests)]
            first += len(requests)
            out.append(_start_outcome(requests, mine, delivered))
        with self.state.lock:  # their workers have them now: from here on they must list them
            now = self.state.clock()
            for task_id in delivered:
                task = self.state.tasks.get(task_id)
                if task is not None:
                    task.last_listed_at = now
        return out

    # Stopping ---------------------------------------------------------------------
    def stop_tasks(self, tasks: Sequence[TaskRecord], *, checkpoint: bool, reason: str) -> None:
        """StopTask every task (with a checkpoint, or not) and close their records.

        StopTask is the one stop request, and a stop always ends: whatever becomes of the
        call (a lost or unreachable worker, a call that fails or times out, an error), the
        task is given up, out of the scheduler's tasks. Its worker, once it reaches the
        scheduler again, has the task's lease refused (the fence, registry.renew_lease) and
        terminates it without a checkpoint (its job may run elsewhere by then). StopTask is
        not retried: a worker that did not answer it would learn no sooner."""

        tasks = list(tasks)
        (statuses,) = self.stop_many([(tasks, checkpoint, reason)])
        with self.state.store.locked_batch(self.state.lock):  # the records: one transaction
            self.close_stopped(tasks, statuses, checkpoint=checkpoint)

    def stop_many(
        self, groups: Sequence[tuple[Sequence[TaskRecord], bool, str]]
    ) -> list[list[common_pb2.TaskStatus | None]]:
        """StopTask for groups of tasks, each with its checkpoint flag and reason, all in
        flight at once (WorkerAgents.stop_all): each task's final status, or None (its
        worker lost, no answer, or the call broke). A round makes the calls of all its
        stops first and records them together (close_stopped), a few transactions for a
        thousand."""
        state = self.state
        with state.lock:  # the address of each task's worker, if it is alive
            addresses = {
                t.worker_id: _address(state.workers.get(t.worker_id)) for g in groups for t in g[0]
            }
        timeout = state.settings.stop_timeout_seconds
        calls = [
            (
                addresses[task.worker_id],
                worker_pb2.StopTaskRequest(
                    task_id=task.task_id,
                    checkpoint=checkpoint,
                    reason=reason,
                    timeout_seconds=timeout,
                    epoch=state.epoch,
                ),
            )
            for tasks, checkpoint, reason in groups
            for task in tasks
            if addresses[task.worker_id]
        ]
        answers = iter(self.agents.stop_all(calls))
        return [
            [_stop_outcome(t, next(answers)) if addresses[t.worker_id] else None for t in tasks]
            for tasks, _, _ in groups
        ]

    def close_stopped(
        self,
        tasks: Sequence[TaskRecord],
        statuses: Sequence[common_pb2.TaskStatus | None],
        *,
        checkpoint: bool,
    ) -> None:
        """Under the lock: the records of tasks stop_many stopped, ended as their workers
        said or as the stop asked."""
        for task, status in zip(tasks, statuses, strict=True):
            self._close(task, status, checkpoint=checkpoint)

    def _close(
        self, task: TaskRecord, status: common_pb2.TaskStatus | None, *, checkpoint: bool
    ) -> None:
        """Under the lock: the stopped task's record, ended as its worker said or as the
        stop asked."""
        state = self.state
        task.state = (
            status.state
            if status is not None and status.state in ENDED_TASK_STATES
            else C.TASK_STATE_CHECKPOINTED
            if checkpoint
            else C.TASK_STATE_FAILED
        )
        if status is not None and status.checkpoint_path:
            task.checkpoint_path = status.checkpoint_path
        task.ended_at = state.clock()
        state.tasks.pop(task.task_id, None)
        state.stopping.discard(task.task_id)
        state.store.save_tasks([task])

    def kill(self, tasks: Sequence[TaskRecord], reason: str) -> None:
        """Stop tasks without a checkpoint, in the background."""
        if not tasks:
            return
        with self.state.lock:
            self.state.stopping.update(t.task_id for t in tasks)
        with contextlib.suppress(RuntimeError):  # the pool is shut down: the process is leaving
            self.state.pool.submit(self.stop_tasks, list(tasks), checkpoint=False, reason=reason)


def ports_by_host(tasks: Iterable[TaskRecord]) -> dict[str, set[int]]:
    """The rendezvous ports the open tasks' rank 0 hold, by host."""
    out: dict[str, set[int]] = {}
    for t in tasks:
        if t.rendezvous_address and t.local_ranks and 0 in t.local_ranks:
            host, _, port = t.rendezvous_address.rpartition(":")
            out.setdefault(host, set()).add(int(port))
    return out


def _start_outcome(
    requests: StartRequests,
    answers: Sequence[common_pb2.TaskStatus | Exception],
    delivered: list[str],
) -> tuple[list[str], set[str]] | None:
    """One job's StartTask answers: its failures and unreachable workers (None: a call
    broke); the tasks its workers took are added to `delivered`."""
    failures: list[str] = []
    unreachable: set[str] = set()
    for (address, request), answer in zip(requests, answers, strict=True):
        if isinstance(answer, grpc.RpcError):
            if rpc_code(answer) in UNREACHABLE:
                unreachable.add(address)
            failures.append(f"{request.task_id} on {address}: {rpc_details(answer)}")
        elif isinstance(answer, Exception):
            log.error("starting a job failed", exc_info=answer, extra={"job_id": request.job_id})
            return None
        else:
            delivered.append(request.task_id)
    return failures, unreachable


def _address(worker: WorkerRecord | None) -> str:
    """Where to call a task's worker ("": lost or unknown, no call)."""
    return worker.address if worker is not None and worker.alive else ""


def _stop_outcome(
    task: TaskRecord, answer: common_pb2.TaskStatus | Exception
) -> common_pb2.TaskStatus | None:
    """A StopTask's final status, or None (logged) when the call failed or broke."""
    if isinstance(answer, grpc.RpcError):
        log.warning(
            "StopTask failed; the task is given up (its lease will be refused)",
            extra={"task_id": task.task_id, "error": rpc_details(answer)},
        )
        return None
    if isinstance(answer, Exception):
        log.error("StopTask broke; task given up", exc_info=answer, extra={"task_id": task.task_id})
        return None
    return answer
