"""The workers API's domain: worker daemons register, heartbeat and renew their tasks' leases,
tasks end; workers that fall silent are lost.

What a worker says of its tasks is applied here: rank 0's progress (read by its worker
from the training process and carried by the heartbeat, the one path progress takes)
updates the job and feeds the throughput estimates (gearshift.scheduler.round.estimates); a
completed task completes the job, a failed one queues it again from its last
checkpoint (a bounded number of times) or fails it, a task that checkpointed on its
own queues the job.
"""

from __future__ import annotations

import copy
import logging
import threading
import uuid
from collections.abc import Callable, Sequence

from gearshift.common.facts import ENDED_TASK_STATES, EXIT_BAD_INPUT
from gearshift.scheduler.plugins.dlrover.stragglers import Report, Track, expired, observe
from gearshift.scheduler.round.estimates import Estimates
from gearshift.scheduler.round.process_resources import cannot_fit, memory_text, process_resources
from gearshift.scheduler.round.task_control import TaskControl
from gearshift.scheduler.state.records import JobRecord, TaskRecord, WorkerRecord
from gearshift.scheduler.state.state import RUNNING_STATES, SchedulerState
from gearshift.v1 import common_pb2, scheduler_pb2

log = logging.getLogger("gearshift.scheduler")
C = common_pb2
S = scheduler_pb2
HEARTBEATS_PER_HOLD = 256  # a relay batch's heartbeats applied in one hold of the lock


class WorkerRows:
    """Writes of worker rows that converge on the newest in-memory state, grouped.

    A registration writes its row outside the scheduler's lock (a database round trip
    under it holds up every heartbeat of every worker). Each change takes a version
    under the scheduler's lock (`stamp`); `write` queues the stamped copies and the
    caller that gets the write lock saves everything queued, newest version of each
    worker, in one transaction (a group commit: hundreds of workers registering at once
    cost a few transactions, not hundreds in a row). A version older than one written
    already is dropped, so the row ends as the newest version whatever the order. The
    write lock is taken after the scheduler's lock when both are held, never the other
    way round.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one writer at a time
        self._queue_lock = threading.Lock()
        self._next = 0
        self._queued: dict[str, tuple[int, WorkerRecord]] = {}
        self._written: dict[str, int] = {}

    def stamp(self, workers: Sequence[WorkerRecord]) -> list[tuple[int, WorkerRecord]]:
        """Versions and copies of the workers as they are now (under the scheduler's lock)."""
        out = []
        for worker in workers:
            self._next += 1
            out.append((self._next, copy.copy(worker)))
        return out

    def write(self, stamped: Sequence[tuple[int, WorkerRecord]], save: Callable[..., None]) -> None:
        """Queue the stamped copies and save what is queued; returns once they are saved
        (by this call or by the one that held the write lock meanwhile)."""
        with self._queue_lock:
            for version, worker in stamped:
                queued = self._queued.get(worker.worker_id)
                if queued is None or queued[0] < version:
                    self._queued[worker.worker_id] = (version, worker)
        with self._lock:
            with self._queue_lock:
                batch, self._queued = self._queued, {}
            newer = [(v, w) for v, w in batch.values() if v > self._written.get(w.worker_id, 0)]
            if not newer:
                return
            try:
                save([w for _, w in newer])
            except BaseException:
                with self._queue_lock:  # not written: the next write tries them again
                    for worker_id, item in batch.items():
                        self._queued.setdefault(worker_id, item)
                raise
            for version, worker in newer:
                self._written[worker.worker_id] = version


class WorkerRegistry:
    """Registration, heartbeats, leases and task reports (progress among them)."""

    def __init__(
        self,
        state: SchedulerState,
        control: TaskControl,
        estimates: Estimates,
        wake: Callable[[], None],
    ) -> None:
        self.state = state
        self.control = control
        self.estimates = estimates
        self.wake = wake
        self.workers_changed: list[Callable[[], None]] = []
        self.rows = WorkerRows()
        # job -> (placement generation, rank -> its step-time track): the straggler
        # detection's memory of the running placement (in memory only; under the lock).
        self._tracks: dict[str, tuple[int, dict[int, Track]]] = {}
        state.ended_listeners.append(self._forget_tracks)
        self._taskless: dict[str, float] = {}  # job -> when it was first seen running taskless
        self._strays: dict[str, float] = {}  # task -> when it was first seen not running its job
        self._aucs: dict[str, float] = {}  # PS job -> the held-out AUC last announced
        state.ended_listeners.append(self._forget_auc)

    def register_worker(
        self,
        worker_id: str,
        address: str,
        hostname: str,
        devices: Sequence[common_pb2.DeviceGroup],
        tasks: Sequence[common_pb2.TaskStatus],
        *,
        cpu_cores: int = 0,
        memory_bytes: int = 0,
    ) -> WorkerRecord:
        state = self.state
        now = state.clock()
        with state.lock:
            worker = WorkerRecord(
                worker_id=worker_id or "worker-" + uuid.uuid4().hex[:8],
                address=address,
                hostname=hostname,
                devices=list(devices),
                alive=True,
                registered_at=now,
                last_heartbeat_at=now,
                cpu_cores=cpu_cores,
                memory_bytes=memory_bytes,
            )
            previous = state.workers.get(worker.worker_id)
            if previous is not None:
                worker.registered_at = previous.registered_at
                worker.degraded_reason = previous.degraded_reason  # registering heals nothing
                worker.degraded_at = previous.degraded_at
            state.workers[worker.worker_id] = worker
            stamped = self.rows.stamp([worker])
            for listener in self.workers_changed:
                listener()
        self.rows.write(stamped, state.store.save_workers)  # outside the lock
        log.info(
            "worker registered",
            extra={
                "worker_id": worker.worker_id,
                "address": address,
                "devices": len(devices),
                "cpu_cores": cpu_cores,
                "memory_bytes": memory_bytes,
            },
        )
        self.task_reports(worker.worker_id, tasks)
        self.wake()
        return worker

    def heartbeat(self, worker_id: str, tasks: Sequence[common_pb2.TaskStatus]) -> bool:
        """Record liveness; True when the worker must register again."""
        return self.heartbeats([(worker_id, tasks)])[0]

    def heartbeats(
        self, beats: Sequence[tuple[str, Sequence[common_pb2.TaskStatus]]]
    ) -> list[bool]:
        """A relay's batch of heartbeats (worker id, its tasks), in holds of the lock of up
        to HEARTBEATS_PER_HOLD with one commit each, rather than two holds and a commit per
        heartbeat (bench/load.py: a thousand workers' heartbeats each waited for the lock
        twice); True for each worker that must register again."""
        replies: list[bool] = []
        for start in range(0, len(beats), HEARTBEATS_PER_HOLD):
            replies.extend(self._heartbeats(beats[start : start + HEARTBEATS_PER_HOLD]))
        return replies

    def _heartbeats(
        self, beats: Sequence[tuple[str, Sequence[common_pb2.TaskStatus]]]
    ) -> list[bool]:
        state = self.state
        replies: list[bool] = []
        kill: list[TaskRecord] = []
        ended = False
        with state.store.locked_batch(state.lock):
            now = state.clock()
            for worker_id, tasks in beats:
                worker = state.workers.get(worker_id)
                replies.append(worker is None or not worker.alive)
                if worker is None or not worker.alive:
                    continue
                worker.last_heartbeat_at = now
                ended = self._apply_reports(worker_id, tasks, now, kill) or ended
        self._after_reports(kill, ended)
        return replies

    def renew_lease(self, worker_id: str, task_id: str) -> tuple[bool, common_pb2.Lease]:
        """Extend the lease of a task the scheduler holds for this worker; refuse it for any
        other, which the worker then terminates. A lease is only this fence: a stop is
        StopTask's (gearshift.scheduler.round.task_control), even while one is under way."""
        state = self.state
        with state.lock:
            task = state.tasks.get(task_id)
            if task is None or task.worker_id != worker_id:
                return False, common_pb2.Lease(task_id=task_id)
            task.lease_expires_at = state.clock() + state.settings.lease_seconds
            return True, common_pb2.Lease(task_id=task_id, expires_at=task.lease_expires_at)

    def _started_fresh(self, job: JobRecord, generation: int) -> None:
        """A placement that found nothing to resume from says so once, as an event: a job
        that starts over is never silent (a lost checkpoint fails the job instead)."""
        if self.state.started_fresh.get(job.job_id) == generation:
            return
        self.state.started_fresh[job.job_id] = generation
        self.state.record(
            job,
            S.JOB_EVENT_TYPE_STARTED_FRESH,
            "no checkpoint to resume from (the job never wrote one): started again at step 0",
        )

    def task_finished(self, worker_id: str, status: common_pb2.TaskStatus) -> None:
        self.task_reports(worker_id, [status])

    # Lost workers -----------------------------------------------------------------------
    def detect_lost(self, now: float) -> list[str]:
        """Workers silent for the heartbeat timeout are lost (under the lock)."""
        timeout = self.state.settings.heartbeat_timeout
        lost = [
            w.worker_id
            for w in self.state.workers.values()
            if w.alive and now - w.last_heartbeat_at > timeout
        ]
        if lost:
            self.lose(lost, now, "missed heartbeats")
        return lost

    def lose(self, lost: Sequence[str], now: float, why: str) -> None:
        """Declare workers lost: their tasks fail, their jobs go back to the queue."""
        state = self.state
        for worker_id in lost:
            state.workers[worker_id].alive = False
            log.warning("worker lost", extra={"worker_id": worker_id, "why": why})
        # One transaction for all of them (a round may lose hundreds at once).
        self.rows.write(self.rows.stamp([state.workers[w] for w in lost]), state.store.save_workers)
        for listener in self.workers_changed:
            listener()
        gone = set(lost)
        dead = [t for t in state.tasks.values() if t.worker_id in gone]
        self._tasks_gone(dead, now, "worker lost", lambda w: f"worker {w} lost ({why})")

    def detect_forgotten(self, now: float) -> list[str]:
        """Tasks a live worker has stopped listing in its heartbeats are gone (under the lock).

        A worker daemon that restarted within the heartbeat timeout comes back under its id
        without the tasks it ran (its training processes died with it): it is never lost,
        and nothing would ever end those tasks. A task counts once its worker has had it
        (StartTask answered, or listed since) for the heartbeat timeout without listing
        it: a start still in flight is not one. Tasks their jobs no longer run are stopped
        too (_stop_strays). Returns the jobs sent back to the queue."""
        state = self.state
        # The test that rules out nearly every task first, one comparison: the walk runs
        # under the lock each second and each round (2.3 ms at 2,700 tasks with the
        # membership and lookups first, bench/load.py)
        silent_since = now - state.settings.heartbeat_timeout
        dead = [
            t
            for t in state.tasks.values()
            if 0 < t.last_listed_at < silent_since
            and t.task_id not in state.stopping
            and (worker := state.workers.get(t.worker_id)) is not None
            and worker.alive
        ]
        for task in dead:
            log.warning(
                "task forgotten by its worker",
                extra={"task_id": task.task_id, "worker_id": task.worker_id},
            )
        self._tasks_gone(
            dead,
            now,
            "its worker no longer runs it",
            lambda w: f"worker {w} no longer runs the job's task (the worker restarted)",
        )
        requeued = sorted({t.job_id for t in dead} | set(self._detect_taskless(now)))
        self._stop_strays(now)
        return requeued

    def _detect_taskless(self, now: float) -> list[str]:
        """Jobs recorded as running with no task left, for the heartbeat timeout: requeued.

        A scheduler (or its database) that stops between saving a task's end and saving its
        job's requeue leaves the job so; nothing else would ever move it again."""
        state = self.state
        with_tasks = {t.job_id for t in state.tasks.values()}
        taskless = {
            j.job_id
            for j in state.jobs.values()
            if j.state in RUNNING_STATES and j.job_id not in with_tasks
        }
        for job_id in set(self._taskless) - taskless:
            del self._taskless[job_id]
        requeued = []
        for job_id in sorted(taskless):
            since = self._taskless.setdefault(job_id, now)
            if now - since <= state.settings.heartbeat_timeout:
                continue
            del self._taskless[job_id]
            job = state.jobs[job_id]
            log.warning("running job without tasks", extra={"job_id": job_id})
            # No task is left to say which placement ran; the job's generation is its
            # last one (a newer one starts only after this requeue).
            state.release_holders(job, "the job has no task left", job.generation)
            state.requeue(
                job, S.JOB_EVENT_TYPE_PREEMPTED, "no task of the job runs any more; rescheduling"
            )
            requeued.append(job_id)
        return requeued

    def _stop_strays(self, now: float) -> None:
        """Tasks that are not their job's running placement (the job is queued or ended, or
        runs a newer placement), left unstopped for the heartbeat timeout: stopped, without
        a checkpoint (it could overwrite the newer placement's).

        Every stop the scheduler decides is a StopTask, and a lease stops nothing. A
        scheduler (or its database) that stops between requeuing a job and stopping its
        tasks, or a start abandoned half-way, leaves such tasks, which nothing else would
        ever stop. A start in flight is never one: this runs between rounds."""
        state = self.state
        strays = {
            t.task_id: t
            for t in state.tasks.values()
            if t.task_id not in state.stopping
            and (
                (job := state.jobs.get(t.job_id)) is None
                or job.state not in RUNNING_STATES
                or t.generation != job.generation
            )
        }
        for task_id in set(self._strays) - set(strays):
            del self._strays[task_id]
        stop = []
        for task_id, task in sorted(strays.items()):
            since = self._strays.setdefault(task_id, now)
            if now - since > state.settings.heartbeat_timeout:
                del self._strays[task_id]
                log.warning("task of a job that does not run it", extra={"task_id": task_id})
                stop.append(task)
        self.control.kill(stop, "its job no longer runs it")

    def _tasks_gone(
        self,
        dead: Sequence[TaskRecord],
        now: float,
        message: str,
        event: Callable[[str], str],
    ) -> None:
        """Tasks that ended without a word: failed; their jobs requeued, their peers killed."""
        state = self.state
        by_job: dict[str, list[TaskRecord]] = {}
        for task in dead:
            by_job.setdefault(task.job_id, []).append(task)
        for job_id, tasks in by_job.items():
            for task in tasks:
                task.state = C.TASK_STATE_FAILED
                task.ended_at = now
                task.message = message
                state.tasks.pop(task.task_id, None)
            state.store.save_tasks(tasks)
            job = state.jobs.get(job_id)
            if job is None:
                continue
            survivors = state.open_tasks(job_id)
            state.release_holders(
                job,
                f"a task of the job ended: {message}",
                max(t.generation for t in tasks),
            )
            workers = ", ".join(sorted({t.worker_id for t in tasks}))
            state.requeue(job, S.JOB_EVENT_TYPE_WORKER_LOST, f"{event(workers)}; rescheduling")
            self.control.kill(survivors, f"a task of the job ended: {message}")

    # Task reports -----------------------------------------------------------------------
    def task_reports(self, worker_id: str, statuses: Sequence[common_pb2.TaskStatus]) -> None:
        """Apply what a worker says of its tasks; an ended task frees devices (wake a round)."""
        if not statuses:  # most heartbeats of an idle cluster: no lock to take
            return
        state = self.state
        kill: list[TaskRecord] = []
        with state.store.locked_batch(state.lock):  # what one report changes: one transaction
            ended = self._apply_reports(worker_id, statuses, state.clock(), kill)
        self._after_reports(kill, ended)

    def _after_reports(self, kill: list[TaskRecord], ended: bool) -> None:
        """Outside the lock: stop the other tasks of jobs whose task failed; an ended task
        freed devices (wake a round)."""
        self.control.kill(kill, "a task of the job failed")
        if ended:
            self.wake()

    def _apply_reports(
        self,
        worker_id: str,
        statuses: Sequence[common_pb2.TaskStatus],
        now: float,
        kill: list[TaskRecord],
    ) -> bool:
        """Under the lock, in a batch: one worker's task statuses applied; the tasks to
        kill are added to `kill`; True when a task ended."""
        state = self.state
        ended = False
        for status in statuses:
            task = state.tasks.get(status.task_id)
            if task is None or task.worker_id != worker_id:
                continue
            task.last_listed_at = now
            job = state.jobs.get(task.job_id)
            if job is not None and status.HasField("progress"):
                self._progress(job, task, status.progress, now)
            ps_run = job is not None and task.generation == job.generation
            if job is not None and ps_run and status.HasField("ps_metrics"):
                self._ps_metrics(job, status.ps_metrics)
            if job is not None and status.process_timings:
                self._timings(job, task, status.process_timings, now)
            if job is not None and status.paused != job.paused and not job.terminal:
                self._paused(job, status)
            if status.state in (C.TASK_STATE_STARTING, C.TASK_STATE_RUNNING):
                task.state = status.state
                continue
            if status.state not in ENDED_TASK_STATES or task.task_id in state.stopping:
                continue  # a stop we asked for is finished by the stopping thread
            ended = True
            task.state = status.state
            task.ended_at = state.clock()
            task.message = status.message
            if status.checkpoint_path:
                task.checkpoint_path = status.checkpoint_path
            state.tasks.pop(task.task_id, None)
            state.store.save_tasks([task])
            if job is not None:
                kill.extend(self._task_ended(job, task, worker_id, status))
        return ended

    def _forget_auc(self, job_id: str) -> None:
        self._aucs.pop(job_id, None)

    def _ps_metrics(self, job: JobRecord, metrics: common_pb2.ParameterServerMetrics) -> None:
        """A PS task's measured use, for its plans (ps_jobs.py); a new held-out AUC (a
        phase ended) is a PROGRESS event saying it (under the lock)."""
        state = self.state
        state.ps_metrics[job.job_id] = metrics
        auc = metrics.heldout_auc
        if auc > 0 and self._aucs.get(job.job_id) != auc:
            self._aucs[job.job_id] = auc  # a restarted task reports its last phase's again
            state.record(
                job,
                S.JOB_EVENT_TYPE_PROGRESS,
                f"held-out AUC {auc:.4f} at step {job.progress.step} "
                f"({metrics.ps} PS x {metrics.workers} workers)",
            )

    def _paused(self, job: JobRecord, status: common_pb2.TaskStatus) -> None:
        """A background job's worker paused it for its foreground, or let it run again."""
        job.paused = status.paused
        kind = S.JOB_EVENT_TYPE_PAUSED if status.paused else S.JOB_EVENT_TYPE_RESUMED
        self.state.record(job, kind, status.pause_reason)

    def _progress(
        self, job: JobRecord, task: TaskRecord, progress: common_pb2.JobProgress, now: float
    ) -> None:
        """A task's progress as its worker reports it (heartbeat, end): the one path by which
        training progress reaches the scheduler. It updates the job, feeds the measured
        throughputs and is recorded as a PROGRESS event now and then (under the lock)."""
        if progress.started_fresh:
            self._started_fresh(job, task.generation)
        if progress.first_step_at and task.generation == job.generation:
            self._first_step(job, progress.first_step_at, progress.paused_from)
        if not _advances(job.progress, progress):
            return
        job.progress.CopyFrom(progress)
        state = self.state
        if job.state == C.JOB_STATE_RUNNING and job.placement.processes:
            self.estimates.observe(job, task.generation, progress, now)
        last = state.last_progress_event.get(job.job_id, 0.0)
        if now - last >= state.settings.progress_event_seconds:
            state.last_progress_event[job.job_id] = now
            state.record(job, S.JOB_EVENT_TYPE_PROGRESS, "")

    def _first_step(self, job: JobRecord, at: float, paused_from: float) -> None:
        """The running placement's first step: it closes an open rescale decision, whose
        cost is kept and said in a PROGRESS event (under the lock)."""
        state = self.state
        measured = state.rescale_costs.first_step(
            job.job_id, job.spec.model_type, at, paused_from=paused_from
        )
        if measured is None:
            return
        seconds, cost = measured.seconds, measured.cost
        if measured.in_place:
            job.in_place_rescale_cost = cost
            self.estimates.measured_in_place(job.job_id, seconds)  # JobSnapshot.resize_seconds
        else:
            job.rescale_cost = cost
            self.estimates.measured_restart(job.job_id, seconds)  # the allocators' restart_seconds
        state.record(
            job,
            S.JOB_EVENT_TYPE_PROGRESS,
            f"rescale cost{' in place' if measured.in_place else ''} {seconds:.2f} s from the "
            f"{'pause' if measured.from_pause else 'decision'} to the first step "
            f"(mean {cost.mean_s:.2f} s over {cost.count})",
        )

    def _timings(
        self,
        job: JobRecord,
        task: TaskRecord,
        timings: Sequence[common_pb2.ProcessTiming],
        now: float,
    ) -> None:
        """Per-process step times of the job's running placement into the straggler
        detection (gearshift.scheduler.plugins.dlrover.stragglers); a straggler's worker is marked
        degraded, and the job's events say so (under the lock)."""
        state = self.state
        if job.state != C.JOB_STATE_RUNNING or task.generation != job.generation:
            return
        generation, tracks = self._tracks.get(job.job_id, (-1, {}))
        if generation != job.generation:
            tracks = {}
            self._tracks[job.job_id] = (job.generation, tracks)
        kinds = {p.rank: p.accelerator_type for p in job.placement.processes}
        reports = [
            Report(
                t.rank,
                task.worker_id,
                t.step,
                t.compute_seconds_per_step,
                t.ests,
                kinds.get(t.rank, ""),
            )
            for t in timings
            if t.step > 0 and t.compute_seconds_per_step >= 0
        ]
        policy = state.settings.stragglers
        outcome = observe(tracks, reports, policy)
        for verdict in outcome.stragglers:
            worker = state.workers.get(verdict.worker_id)
            if worker is None:
                continue
            first = verdict.reports == policy.reports
            worker.degraded_at = now  # still slow: the mark lasts from now
            if worker.degraded_reason and not first:
                continue
            worker.degraded_reason = verdict.describe() + f" (job {job.job_id})"
            log.warning(
                "straggler: worker degraded",
                extra={
                    "worker_id": worker.worker_id,
                    "job_id": job.job_id,
                    "rank": verdict.rank,
                    "seconds_per_step": verdict.seconds_per_step,
                    "median": verdict.median,
                },
            )
            if first:
                state.record(
                    job,
                    S.JOB_EVENT_TYPE_STRAGGLER,
                    f"{verdict.describe()}; worker {worker.worker_id} marked degraded, "
                    "the job moves off it when another placement exists",
                )
        for worker_id in outcome.recovered:
            self._clear_degraded(worker_id, "its processes report normal step times again")

    def _forget_tracks(self, job_id: str) -> None:
        self._tracks.pop(job_id, None)

    def _clear_degraded(self, worker_id: str, why: str) -> None:
        worker = self.state.workers.get(worker_id)
        if worker is None or not worker.degraded_reason:
            return
        worker.degraded_reason, worker.degraded_at = "", 0.0
        log.info("worker no longer degraded", extra={"worker_id": worker_id, "why": why})

    def degraded_workers(self, now: float) -> frozenset[str]:
        """The live workers marked degraded, after clearing the marks that lasted
        --straggler-clear-seconds (under the lock): the place stage avoids them."""
        state = self.state
        marks = {w.worker_id: w.degraded_at for w in state.workers.values() if w.degraded_reason}
        for worker_id in expired(marks, now, state.settings.stragglers):
            self._clear_degraded(worker_id, "its degraded mark expired")
        return frozenset(
            w.worker_id for w in state.workers.values() if w.alive and w.degraded_reason
        )

    def _task_ended(
        self, job: JobRecord, task: TaskRecord, worker_id: str, status: common_pb2.TaskStatus
    ) -> list[TaskRecord]:
        """What one ended task means for its job; returns the peers to kill."""
        state = self.state
        if status.state == C.TASK_STATE_LEFT:  # its processes handed their ESTs over in place
            return []
        others = state.open_tasks(job.job_id)
        if status.state == C.TASK_STATE_COMPLETED:
            job.final_digest = status.digest
            if job.progress.total_steps:
                job.progress.step = max(job.progress.step, job.progress.total_steps)
            for other in others:  # its peers finish the same step; close them
                other.state = C.TASK_STATE_COMPLETED
                other.ended_at = state.clock()
                state.tasks.pop(other.task_id, None)
            state.store.save_tasks(others)
            state.finish(job, C.JOB_STATE_SUCCEEDED, S.JOB_EVENT_TYPE_SUCCEEDED, "done")
            return []
        if status.state == C.TASK_STATE_FAILED:
            # The decision on the first line, after the error's; its log tail below them.
            detail, _, tail = (status.message or f"exit code {status.exit_code}").partition("\n")
            tail = f"\n{tail}" if tail else ""
            state.release_holders(job, f"task {task.task_id} failed", task.generation)
            restarts = job.restart_count
            limit = state.settings.max_restarts
            what = f"task {task.task_id} on {worker_id} failed: {detail}"
            worker = state.workers.get(worker_id)
            factor = state.memory_factor.get(job.job_id, 1)
            had = doubled = 0
            if worker is not None:
                had = process_resources(0, worker.memory_bytes, worker.devices, 0, factor)[1]
                doubled = process_resources(0, worker.memory_bytes, worker.devices, 0, 2 * factor)[
                    1
                ]
            memories = [w.memory_bytes for w in state.workers.values() if w.alive]
            if status.out_of_memory and cannot_fit(had, memories):
                state.finish(
                    job,
                    C.JOB_STATE_FAILED,
                    S.JOB_EVENT_TYPE_FAILED,
                    f"{what}; the job cannot fit: a process ran out of memory with "
                    f"{memory_text(had)}, the whole memory of the largest worker{tail}",
                )
            elif status.exit_code == EXIT_BAD_INPUT or restarts >= limit:
                state.finish(job, C.JOB_STATE_FAILED, S.JOB_EVENT_TYPE_FAILED, what + tail)
            else:
                # A peer that died (a lost node) fails the others' collectives before its
                # worker is declared lost; and a crash may be transient. Resume from the
                # last checkpoint, a bounded number of times.
                job.restart_count = restarts + 1  # saved with the event below
                more = ""
                if status.out_of_memory:  # the same memory would fail the same way
                    state.memory_factor[job.job_id] = 2 * factor
                    more = f" with {2 * factor}x its memory share"
                    if had and doubled:
                        more += (
                            f" ({memory_text(doubled)} a process on {worker_id}, "
                            f"was {memory_text(had)})"
                        )
                state.requeue(
                    job,
                    S.JOB_EVENT_TYPE_PREEMPTED,
                    f"{what}; restarting from the last checkpoint{more} "
                    f"(restart {restarts + 1} of {limit}){tail}",
                )
            return others
        if not others and job.state in RUNNING_STATES:
            state.requeue(job, S.JOB_EVENT_TYPE_CHECKPOINTED, "stopped after a checkpoint")
        return []


def _advances(job: common_pb2.JobProgress, reported: common_pb2.JobProgress) -> bool:
    """Whether a task's progress is the job's: only rank 0's task knows it (the others report
    step 0), from its first step on; a placement resumed from a checkpoint repeats steps the
    job already reported, and counts again once it passes them. A placement that started
    fresh did go back to step 0: its progress counts from its first step."""
    if reported.step < 1:
        return False
    return reported.started_fresh or reported.step >= job.step
