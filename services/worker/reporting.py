"""What rank 0 of a job tells the services while it trains: progress to the scheduler (whose
answer may ask the job to stop) and runtime samples to the Brain.

Everything here is best effort and off the training thread: the training loop
only records the latest progress; a background thread sends it every
`interval` seconds. A service that is down or restarting costs a log line and
a retry at the next tick, never a training step. Sample batches carry an id
(`<task>:<n>`), so a batch resent after a lost answer is stored once.
"""

from __future__ import annotations

import logging
import os
import resource
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from gearshift.common.auth import ClientTls
from gearshift.common.channel import connect
from gearshift.common.errors import rpc_code, rpc_details
from gearshift.v1 import brain_pb2, brain_pb2_grpc, common_pb2, scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger("gearshift.worker.reporting")

CALL_TIMEOUT_S = 5.0
SAMPLE_BATCH = 500  # most samples per ReportSamples call
_DROP = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}


@dataclass(frozen=True)
class ReportTarget:
    """Who reports (job, task) and to whom; what the Brain's samples describe."""

    job_id: str
    task_id: str
    scheduler: str = ""
    brain: str = ""
    token: str | None = None
    tls: ClientTls | None = None
    accelerator_type: str = "cpu"
    ests_per_device: Sequence[int] = ()
    global_batch_size: int = 1
    dataset_size: int = 0
    started_fresh: bool = False  # told to resume, found no checkpoint: started at step 0


@dataclass(frozen=True)
class Snapshot:
    """The progress a report carries."""

    step: int
    total_steps: int
    loss: float
    samples_per_second: float


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # loader processes
    return usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime


class Reporter:
    """Rank 0's reports; `record()` from the training loop, the rest on a thread."""

    def __init__(
        self,
        target: ReportTarget,
        on_stop_requested: Callable[[], None],
        *,
        interval: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.target = target
        self.on_stop_requested = on_stop_requested
        self.interval = interval
        self.clock = clock
        self.stop_requested = False
        self._lock = threading.Lock()
        self._latest: Snapshot | None = None
        self._samples: list[brain_pb2.RuntimeSample] = []
        self._batch: tuple[str, list[brain_pb2.RuntimeSample]] | None = None
        self._batches = 0
        self._last: tuple[float, int, float] | None = None  # (time, step, cpu seconds)
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._scheduler: scheduler_pb2_grpc.WorkerRegistryStub | None = None
        self._brain: brain_pb2_grpc.BrainStub | None = None
        self._channels: list[grpc.Channel] = []
        if target.scheduler:
            channel = connect(
                target.scheduler, token=target.token, tls=target.tls, timeout=CALL_TIMEOUT_S
            )
            self._channels.append(channel)
            self._scheduler = scheduler_pb2_grpc.WorkerRegistryStub(channel)
        if target.brain:
            channel = connect(
                target.brain, token=target.token, tls=target.tls, timeout=CALL_TIMEOUT_S
            )
            self._channels.append(channel)
            self._brain = brain_pb2_grpc.BrainStub(channel)

    # -- the training thread ----------------------------------------------------

    def record(self, snapshot: Snapshot) -> None:
        """Keep the latest progress and turn it into a runtime sample (cheap, no I/O)."""
        now, cpu = self.clock(), _cpu_seconds()
        with self._lock:
            self._latest = snapshot
            if self._last is not None and snapshot.step > self._last[1] and now > self._last[0]:
                elapsed = now - self._last[0]
                t = self.target
                self._samples.append(
                    brain_pb2.RuntimeSample(
                        time=now,
                        node_id="rank-0",
                        step=snapshot.step,
                        steps_per_second=(snapshot.step - self._last[1]) / elapsed,
                        samples_per_second=max(snapshot.samples_per_second, 0.0),
                        cpu_cores_used=max(cpu - self._last[2], 0.0) / elapsed,
                        memory_bytes_used=_rss_bytes(),
                        accelerator_type=t.accelerator_type,
                        device_count=max(len(t.ests_per_device), 1),
                        ests_per_device=list(t.ests_per_device),
                    )
                )
            self._last = (now, snapshot.step, cpu)

    # -- the reporting thread -----------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="reporter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closed.wait(self.interval):
            self.send_progress()
            self.send_samples()

    def close(self, flush_timeout: float = 2.0) -> None:
        """Stop the thread and send what is left (bounded: a dead service may not hold us)."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=CALL_TIMEOUT_S + 1)
        deadline = time.monotonic() + flush_timeout
        self.send_progress(timeout=flush_timeout)
        while self._samples or self._batch:
            left = deadline - time.monotonic()
            if left <= 0 or not self.send_samples(timeout=left):
                break
        for channel in self._channels:
            channel.close()

    def _epoch(self, step: int) -> int:
        size = self.target.dataset_size
        return step * self.target.global_batch_size // size if size > 0 else 0

    def send_progress(self, *, timeout: float = CALL_TIMEOUT_S) -> bool:
        """ReportProgress with the latest snapshot, unchanged or not (the answer may ask the job
        to stop); sets the stop request when it does."""
        with self._lock:
            snapshot = self._latest
        if self._scheduler is None or snapshot is None:
            return True
        request = scheduler_pb2.ReportProgressRequest(
            job_id=self.target.job_id,
            task_id=self.target.task_id,
            progress=common_pb2.JobProgress(
                step=snapshot.step,
                total_steps=snapshot.total_steps,
                epoch=self._epoch(snapshot.step),
                loss=snapshot.loss,
                samples_per_second=max(snapshot.samples_per_second, 0.0),
                started_fresh=self.target.started_fresh,
            ),
        )
        try:
            reply = self._scheduler.ReportProgress(request, timeout=timeout)
        except grpc.RpcError as exc:
            log.info(
                "progress not reported (will retry)",
                extra={"code": str(rpc_code(exc)), "error": rpc_details(exc)},
            )
            return False
        if reply.stop_requested and not self.stop_requested:
            self.stop_requested = True
            log.info("the scheduler asks the job to stop", extra={"step": snapshot.step})
            self.on_stop_requested()
        return True

    def send_samples(self, *, timeout: float = CALL_TIMEOUT_S) -> bool:
        """Send the pending batch (or form one); False when the Brain did not take it."""
        if self._brain is None:
            return True
        if self._batch is None:
            with self._lock:
                if not self._samples:
                    return True
                taken, self._samples = self._samples[:SAMPLE_BATCH], self._samples[SAMPLE_BATCH:]
            self._batches += 1
            self._batch = (f"{self.target.task_id}:{self._batches}", taken)
        batch_id, samples = self._batch
        request = brain_pb2.ReportSamplesRequest(
            batch_id=batch_id, job_id=self.target.job_id, samples=samples
        )
        try:
            self._brain.ReportSamples(request, timeout=timeout)
        except grpc.RpcError as exc:
            if rpc_code(exc) in _DROP:  # the same batch would be refused again
                log.warning(
                    "runtime samples refused; dropped",
                    extra={"batch_id": batch_id, "error": rpc_details(exc)},
                )
                self._batch = None
                return True
            log.info(
                "runtime samples not reported (will retry)",
                extra={"code": str(rpc_code(exc)), "error": rpc_details(exc)},
            )
            return False
        self._batch = None
        return True
