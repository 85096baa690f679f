"""What rank 0 of a job tells the Brain while it trains: runtime samples (ReportSamples).

Its progress does not go from here: rank 0 keeps it in a file that its worker daemon
reads and sends with its heartbeats (gearshift.worker.wiring), the one path progress
takes to the scheduler; and a stop comes from the worker daemon (StopTask), as a
signal. A training process calls no scheduler RPC.

Everything here is best effort and off the training thread: the training loop only
turns each progress into a sample; a background thread sends them every `interval`
seconds. A Brain that is down or restarting costs a log line and a retry at the next
tick, never a training step. Sample batches carry an id (`<task>:<n>`), so a batch
resent after a lost answer is stored once.
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
from gearshift.v1 import brain_pb2, brain_pb2_grpc

log = logging.getLogger("gearshift.worker.reporting")

CALL_TIMEOUT_S = 5.0
SAMPLE_BATCH = 500  # most samples per ReportSamples call
_DROP = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}


@dataclass(frozen=True)
class ReportTarget:
    """Who reports (job, task) and to which Brain; what the samples describe."""

    job_id: str
    task_id: str
    brain: str
    token: str | None = None
    tls: ClientTls | None = None
    accelerator_type: str = "cpu"
    ests_per_device: Sequence[int] = ()


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


class SampleReporter:
    """Rank 0's runtime samples for the Brain; `record()` from the training loop, the
    sending on a thread."""

    def __init__(
        self,
        target: ReportTarget,
        *,
        interval: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.target = target
        self.interval = interval
        self.clock = clock
        self._lock = threading.Lock()
        self._samples: list[brain_pb2.RuntimeSample] = []
        self._batch: tuple[str, list[brain_pb2.RuntimeSample]] | None = None
        self._batches = 0
        self._last: tuple[float, int, float] | None = None  # (time, step, cpu seconds)
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._channel = connect(
            target.brain, token=target.token, tls=target.tls, timeout=CALL_TIMEOUT_S
        )
        self._brain = brain_pb2_grpc.BrainStub(self._channel)

    # -- the training thread ----------------------------------------------------

    def record(self, step: int, samples_per_second: float) -> None:
        """Turn rank 0's progress into a runtime sample (cheap, no I/O)."""
        now, cpu = self.clock(), _cpu_seconds()
        with self._lock:
            if self._last is not None and step > self._last[1] and now > self._last[0]:
                elapsed = now - self._last[0]
                t = self.target
                self._samples.append(
                    brain_pb2.RuntimeSample(
                        time=now,
                        node_id="rank-0",
                        step=step,
                        steps_per_second=(step - self._last[1]) / elapsed,
                        samples_per_second=max(samples_per_second, 0.0),
                        cpu_cores_used=max(cpu - self._last[2], 0.0) / elapsed,
                        memory_bytes_used=_rss_bytes(),
                        accelerator_type=t.accelerator_type,
                        device_count=max(len(t.ests_per_device), 1),
                        ests_per_device=list(t.ests_per_device),
                    )
                )
            self._last = (now, step, cpu)

    # -- the reporting thread -----------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sample-reporter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closed.wait(self.interval):
            self.send_samples()

    def close(self, flush_timeout: float = 2.0) -> None:
        """Stop the thread and send what is left (bounded: a dead Brain may not hold us)."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=CALL_TIMEOUT_S + 1)
        deadline = time.monotonic() + flush_timeout
        while self._samples or self._batch:
            left = deadline - time.monotonic()
            if left <= 0 or not self.send_samples(timeout=left):
                break
        self._channel.close()

    def send_samples(self, *, timeout: float = CALL_TIMEOUT_S) -> bool:
        """Send the pending batch (or form one); False when the Brain did not take it."""
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
