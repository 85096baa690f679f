"""Load test of the scheduler daemon: simulated workers, submissions and watchers on Postgres.

    python -m bench.load [--workers 1000] [--submits-per-second 100] [--queued 2000]
                         [--seconds 30] [--processes 4] [--sweep [100,250,500,1000,2000]]
                         [--database-url postgresql://postgres@127.0.0.1:5432/test]
                         [--unplaceable] [--repeat N] [--json FILE]

One trial: a fresh database on the Postgres server (created, then dropped), a real
`gearshift-scheduler` process on it with its default profile (elastic LAS), short
rounds and its Prometheus endpoint; --queued EST jobs submitted first; then
--processes OS processes drive --workers simulated workers with the real workers API
(RegisterWorker once, Heartbeat every second listing its tasks, register again when
told to; the WorkerAgent of a process's workers is one server there that accepts
StartTask and StopTask and trains nothing, so jobs start, are rescaled and preempted
with real calls, and rounds end as on a cluster), while
one more process submits --submits-per-second jobs (open loop), runs a few WatchJob
watchers (time to the first event) and GetClusterState / ListJobs callers, each once a
second. Every latency is
measured in the client; during the --seconds window it prints p50 / p99 / count /
errors per RPC, the round duration (mean from the histogram's sum and count, p50 and
max as the histogram's bucket bounds), the queued job count, and what the scheduler's
log and counters say it did (starts, workers lost, failed rounds).

With --job-seconds S a simulated job is reported completed once it has run S seconds in
all (a preemption or a rescale pauses it), so jobs end and free their devices: the
cluster's steady state, where ending jobs make room for arriving ones and every round
starts some (without it, jobs run until preempted and a full cluster starts few). The
window's completed jobs are printed beside its starts.

With --unplaceable the jobs ask for an accelerator type no simulated worker has: they
stay queued and the scheduler never calls a worker (the rounds' own cost alone).
--sweep runs one trial per worker count and reports the knee: the first count at which
some RPC's p99 in the window passes 100 ms ("RegisterWorker (startup)", every worker
registering at once before the window, is shown but not counted; "RegisterWorker" is
the re-registrations in the window). The `(generator loop lag)` row is how late the
load generator's own event loops woke from 10 ms sleeps: the part of every latency that
is the generator's, not the server's (shown, not counted either). With the scheduler file's
heartbeats.relays (1 by default), the simulated workers heartbeat the relay their
registration names, as worker daemons do. The scheduler runs its defaults (the union
profile) under the bench's own heartbeats, limits and round length; `--config FILE` lays
a scheduler configuration file over them.
--repeat N runs N trials of each configuration and prints each RPC's median p99 and its
range beside the starts each window saw (the p99s follow how many jobs a window starts,
and the same code's runs differ 2-3x on a shared two-core host); the knee is read from
each count's median trial.
Targets (issue 16): 1,000 workers + 100 submissions/s + 2,000 queued jobs with every
p99 < 100 ms and a round under 1 s. Load generator and scheduler share the machine's
CPUs: figures are what one run measured there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc
import yaml

from gearshift.client.processes import DaemonError, DaemonProcess, start_daemon
from gearshift.common.config import merged
from gearshift.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc, worker_pb2, worker_pb2_grpc

C = common_pb2
S = scheduler_pb2
DEFAULT_DATABASE = (
    os.environ.get("GEARSHIFT_TEST_POSTGRES_URL") or "postgresql://postgres@127.0.0.1:5432/test"
)
DEFAULT_SWEEP = (100, 250, 500, 1000, 2000)
TARGET_P99 = 0.100  # seconds, per RPC
TARGET_ROUND = 1.0  # seconds
CALL_TIMEOUT = 10.0
HEARTBEAT_SECONDS = 1.0
TYPES = ("v100", "p100", "k80")  # what the simulated workers offer, in turn
DEVICES_PER_WORKER = 4


def host_of(index: int) -> str:
    """Worker `index`'s host: a loopback address of its own (the scheduler hands out
    rendezvous ports per host, a hundred of them)."""
    return f"127.{1 + index // 65536}.{(index // 256) % 256}.{index % 256}"


@dataclass
class _Work:
    """A simulated job's time on this process's workers: what it has run, and since
    when it runs now (None: no task of it here)."""

    ran: float = 0.0
    since: float | None = None
    tasks: set[str] = field(default_factory=set)

    def seconds(self, now: float) -> float:
        return self.ran + (now - self.since if self.since is not None else 0.0)


class SimulatedAgents(worker_pb2_grpc.WorkerAgentServicer):
    """The WorkerAgent of one load process's simulated workers (one server, one address for
    all of them): StartTask starts nothing but remembers the task under each worker of
    the placement it names, which that worker's heartbeats then list as running (as a
    real worker's do); StopTask forgets it. So the scheduler's starts, rescales and
    preemptions are real calls, and its rounds end as they would on a cluster.
    With `job_seconds`, a job that has run that long in all (a preemption or a rescale
    pauses it, as a checkpoint would) is reported completed by its workers' next
    heartbeats (once each) and forgotten: jobs end and free their devices, as on a
    cluster in its steady state, where the jobs that end make room for those that arrive."""

    def __init__(
        self, job_seconds: float = 0.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.tasks: dict[str, dict[str, str]] = {}  # worker id -> task id -> job id
        self.work: dict[str, _Work] = {}  # job id -> its time run here
        self.job_seconds = job_seconds
        self.clock = clock

    async def StartTask(
        self, request: worker_pb2.StartTaskRequest, context: Any
    ) -> common_pb2.TaskStatus:
        for rank in request.local_ranks:
            worker_id = request.placement.processes[rank].worker_id
            self.tasks.setdefault(worker_id, {})[request.task_id] = request.job_id
        work = self.work.setdefault(request.job_id, _Work())
        if work.since is None:
            work.since = self.clock()
        work.tasks.add(request.task_id)
        return C.TaskStatus(
            task_id=request.task_id, job_id=request.job_id, state=C.TASK_STATE_RUNNING
        )

    async def StopTask(
        self, request: worker_pb2.StopTaskRequest, context: Any
    ) -> common_pb2.TaskStatus:
        job_id = ""
        for tasks in self.tasks.values():
            job_id = tasks.pop(request.task_id, job_id)
        work = self.work.get(job_id)
        if work is not None and request.task_id in work.tasks:
            work.tasks.discard(request.task_id)
            if not work.tasks and work.since is not None:
                work.ran, work.since = work.seconds(self.clock()), None
        state = C.TASK_STATE_CHECKPOINTED if request.checkpoint else C.TASK_STATE_FAILED
        return C.TaskStatus(task_id=request.task_id, job_id=job_id, state=state)

    async def GetTaskStatus(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "a simulated worker")

    async def ChangeMembership(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "a simulated worker")

    async def StreamTaskLogs(self, request: Any, context: Any) -> AsyncIterator[C.LogLine]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "a simulated worker")
        yield C.LogLine()  # never reached: abort raises

    async def ReadStepLog(self, request: Any, context: Any) -> AsyncIterator[C.StepLoss]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "a simulated worker")
        yield C.StepLoss()  # never reached: abort raises

    async def DescribeWorker(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "a simulated worker")

    def statuses(self, worker_id: str) -> list[common_pb2.TaskStatus]:
        """The tasks a heartbeat of `worker_id` lists; those of a job that has run
        `job_seconds` are listed completed this once."""
        tasks = self.tasks.get(worker_id, {})
        now = self.clock()
        out = []
        for task_id, job_id in list(tasks.items()):
            done = bool(self.job_seconds) and self.work[job_id].seconds(now) >= self.job_seconds
            state = C.TASK_STATE_COMPLETED if done else C.TASK_STATE_RUNNING
            out.append(C.TaskStatus(task_id=task_id, job_id=job_id, state=state))
            if done:
                del tasks[task_id]
        return out


TENANTS = 4
STARTUP = "RegisterWorker (startup)"  # the first registrations, all at once: not in the knee
# How late each load-generating process's event loop wakes: its own delay, in every
# latency it measures (a generator process serves 250 simulated workers' agents too).
LOOP_LAG = "(generator loop lag)"
NOT_TARGETS = (STARTUP, LOOP_LAG)  # rows shown, not held to the target
LOG_EVENTS = {  # scheduler log lines worth counting, by a pattern in the line
    "round failed": "round failed",
    "worker lost": "worker lost",
    "start failed": "could not start",
    "StopTask failed": "StopTask failed",
    "exceptions": "Traceback",
}
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class LoadError(RuntimeError):
    """The trial could not run (Postgres unreachable, scheduler did not start, ...)."""


@dataclass
class Config:
    workers: int = 1000
    submits_per_second: float = 100.0
    queued: int = 2000
    seconds: float = 30.0
    processes: int = 4
    watchers: int = 4
    readers: int = 2  # GetClusterState callers, and as many ListJobs callers
    round_seconds: float = 5.0
    warmup_seconds: float = 0.0  # after registering, before measuring: the first fill done
    job_seconds: float = 0.0  # a job completes after running this long in all (0: never)
    unplaceable: bool = False
    database_url: str = DEFAULT_DATABASE
    run_dir: str = ""  # where the scheduler's log stays (empty: a temporary folder)
    # The scheduler's configuration laid over the bench's own (the file's keys, nested).
    scheduler_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class RpcStats:
    count: int
    errors: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    error_codes: dict[str, int] = field(default_factory=dict)


@dataclass
class Report:
    config: dict[str, Any]
    rpcs: dict[str, RpcStats]
    rounds: dict[str, float]
    queued_jobs: int
    running_jobs: int
    counters: dict[str, float]
    log_events: dict[str, int]
    reregistrations: int
    preload_seconds: float
    registration_seconds: float
    # The scheduler's CPU time (user + system) in the window: what the RPCs and rounds
    # cost it, less sensitive than the latencies to what else runs on the machine.
    scheduler_cpu_seconds: float = 0.0
    # The load generator's CPU time in the window (its worker and client processes), on the
    # same machine: what is left of the host's CPUs for the server is the rest.
    generator_cpu_seconds: float = 0.0
    # The host's 1-minute load average at the window's start and end (latencies measured
    # on a shared machine mean little without it).
    load_average: tuple[float, float] = (0.0, 0.0)
    # CPU seconds in the window of the server's helpers: its decision process and its
    # heartbeat relays (the scheduler's children) and PostgreSQL; and the share of the
    # host's CPU time busy.
    helper_cpu_seconds: dict[str, float] = field(default_factory=dict)
    host_busy: float = 0.0
    # The rounds over a second in the window, each its seconds and its phases' (the log's).
    slow_rounds: list[dict[str, float]] = field(default_factory=list)
    # PostgreSQL sessions opened on the trial's database in the window: pools that keep
    # their connections open none (35 a second once, each a backend forked; None: a
    # server older than 14 does not count them).
    database_sessions: int | None = None

    def worst_p99_ms(self) -> float:
        """The highest p99 in the window (the startup registration burst aside)."""
        return max(
            (s.p99_ms for name, s in self.rpcs.items() if s.count and name not in NOT_TARGETS),
            default=0.0,
        )

    def longest_round_s(self) -> float:
        """The longest round in the window if one took over a second (the scheduler logs
        those with their phases), else 0."""
        return max((r["seconds"] for r in self.slow_rounds), default=0.0)

    def errors(self) -> int:
        return sum(s.errors for s in self.rpcs.values())


# The job and the workers --------------------------------------------------------------------
def job_spec(index: int, unplaceable: bool) -> common_pb2.JobSpec:
    """A small elastic EST job (examples/digits-cnn.yaml as a proto)."""
    return C.JobSpec(
        name=f"load-{index}",
        tenant=f"load{index % TENANTS}",
        entrypoint=C.Entrypoint(module="gearshift.examples.digits_cnn", config_json='{"lr":0.05}'),
        num_ests=4,
        global_batch_size=64,
        total_steps=200,
        dataset=C.DatasetSpec(name="digits", size=1797, shard_size=32, seed=1),
        determinism=C.DETERMINISM_LEVEL_D2,
        elastic=C.ElasticBounds(min_devices=1, max_devices=4),
        accelerator_types=["h100"] if unplaceable else [],
        priority_weight=1.0,
    )


def submit_request(index: int, unplaceable: bool) -> S.SubmitJobRequest:
    """With an idempotency key, as the SDK sends every submission."""
    return S.SubmitJobRequest(spec=job_spec(index, unplaceable), idempotency_key=f"load-{index}")


def register_request(
    worker_id: str, index: int, address: str, tasks: Sequence[common_pb2.TaskStatus] = ()
) -> scheduler_pb2.RegisterWorkerRequest:
    kind = TYPES[index % len(TYPES)]
    return S.RegisterWorkerRequest(
        worker_id=worker_id,
        address=address,
        hostname=f"sim-{index}",
        devices=[C.DeviceGroup(accelerator_type=kind, count=DEVICES_PER_WORKER)],
        tasks=tasks,
    )


# Measuring ---------------------------------------------------------------------------------
class Recorder:
    """Latencies and error codes per RPC, kept only inside the measurement window."""

    def __init__(self, window: Any) -> None:
        self.window = window  # shared array: [start, end] wall-clock times (0: not yet)
        self.latencies: dict[str, list[float]] = {}
        self.errors: dict[str, Counter[str]] = {}
        self.reregistrations = 0

    def measuring(self) -> bool:
        start, end = float(self.window[0]), float(self.window[1])
        return start > 0 and start <= time.time() < end

    def over(self) -> bool:
        end = float(self.window[1])
        return end > 0 and time.time() >= end

    async def call(self, name: str, call: Awaitable[Any], always: bool = False) -> Any:
        """Await the call and record how long it took; None when it failed."""
        record = always or self.measuring()
        began = time.perf_counter()
        try:
            result = await call
        except grpc.RpcError as exc:
            if record:
                code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else "ERROR"
                self.errors.setdefault(name, Counter())[code] += 1
                self.latencies.setdefault(name, [])
            return None
        if record:
            self.latencies.setdefault(name, []).append(time.perf_counter() - began)
        return result

    def result(self) -> dict[str, Any]:
        return {
            "latencies": self.latencies,
            "errors": {k: dict(v) for k, v in self.errors.items()},
            "reregistrations": self.reregistrations,
        }


async def _loop_lag(recorder: Recorder, period: float = 0.01) -> None:
    """Record how late this process's event loop wakes from a `period` sleep."""
    loop = asyncio.get_running_loop()
    while not recorder.over():
        before = loop.time()
        await asyncio.sleep(period)
        if recorder.measuring():
            lag = max(0.0, loop.time() - before - period)
            recorder.latencies.setdefault(LOOP_LAG, []).append(lag)


def _channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=[("grpc.enable_retries", 0)])


class _HeartbeatPath:
    """Where one simulated worker heartbeats: Heartbeat calls at the scheduler, or the
    HeartbeatStream of the relay the scheduler named (opened at the first heartbeat), as
    the worker daemon does."""

    def __init__(self, stub: Any, relay: bool) -> None:  # a stub on a grpc.aio channel
        self.stub = stub
        self.relay = relay
        self.stream: Any = None

    async def beat(self, request: S.HeartbeatRequest) -> S.HeartbeatResponse:
        if not self.relay:
            reply = await self.stub.Heartbeat(request, timeout=CALL_TIMEOUT)
            return cast("S.HeartbeatResponse", reply)
        if self.stream is None:
            self.stream = self.stub.HeartbeatStream()
        try:
            async with asyncio.timeout(CALL_TIMEOUT):
                await self.stream.write(request)
                reply = await self.stream.read()
        except TimeoutError:
            raise _stream_error(grpc.StatusCode.DEADLINE_EXCEEDED, "no reply in time") from None
        if not isinstance(reply, S.HeartbeatResponse):  # grpc.aio.EOF: the stream ended
            raise _stream_error(grpc.StatusCode.UNAVAILABLE, "the relay ended the stream")
        return reply

    def close(self) -> None:
        if self.stream is not None:
            self.stream.cancel()


def _stream_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, "")


async def _until(when: float) -> None:
    await asyncio.sleep(max(0.0, when - time.time()))


async def _workers(
    address: str, first: int, count: int, window: Any, ready: Any, *, job_seconds: float = 0.0
) -> dict[str, Any]:
    """Register `count` workers, then heartbeat each every second until the window ends;
    their WorkerAgent is one server of this process (SimulatedAgents)."""
    recorder = Recorder(window)
    agents = SimulatedAgents(job_seconds)
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerAgentServicer_to_server(agents, server)
    # Every loopback address reaches it: each worker registers at its own (`host_of`),
    # as workers on a real cluster have hosts of their own.
    port = server.add_insecure_port("0.0.0.0:0")
    await server.start()
    async with _channel(address) as channel:
        stub = scheduler_pb2_grpc.WorkerRegistryStub(channel)
        gate = asyncio.Semaphore(32)
        # Where each worker heartbeats: the scheduler, or the relay it named (heartbeat_port).
        heartbeats: dict[str, _HeartbeatPath] = {}
        relays: dict[int, grpc.aio.Channel] = {}

        def heartbeat_at(worker_id: str, reply: Any) -> None:
            relay = reply.heartbeat_port if reply is not None else 0
            if relay and relay not in relays:
                relays[relay] = _channel(f"{address.rpartition(':')[0]}:{relay}")
            if worker_id in heartbeats:
                heartbeats[worker_id].close()
            heartbeats[worker_id] = _HeartbeatPath(
                scheduler_pb2_grpc.WorkerRegistryStub(relays[relay]) if relay else stub,
                relay=bool(relay),
            )

        async def register(index: int) -> bool:
            request = register_request(f"sim-{index:05d}", index, f"{host_of(index)}:{port}")
            async with gate:
                reply = await recorder.call(
                    STARTUP, stub.RegisterWorker(request, timeout=CALL_TIMEOUT), True
                )
            heartbeat_at(request.worker_id, reply)
            return reply is not None

        async def worker(index: int) -> None:
            worker_id = f"sim-{index:05d}"
            tick = time.time() + random.uniform(0, HEARTBEAT_SECONDS)
            while not recorder.over():
                await _until(tick)
                request = S.HeartbeatRequest(worker_id=worker_id, tasks=agents.statuses(worker_id))
                at = heartbeats[worker_id]
                reply = await recorder.call("Heartbeat", at.beat(request))
                # A relay that failed: the worker registers again, at the scheduler.
                lost_relay = reply is None and at.relay
                if lost_relay or (reply is not None and reply.reregister):
                    recorder.reregistrations += 1
                    again = await recorder.call(
                        "RegisterWorker",
                        stub.RegisterWorker(
                            register_request(
                                worker_id,
                                index,
                                f"{host_of(index)}:{port}",
                                agents.statuses(worker_id),
                            ),
                            timeout=CALL_TIMEOUT,
                        ),
                    )
                    heartbeat_at(worker_id, again)
                now = time.time()
                tick += HEARTBEAT_SECONDS * max(1, int((now - tick) // HEARTBEAT_SECONDS) + 1)

        indexes = range(first, first + count)
        registered = await asyncio.gather(*(register(i) for i in indexes))
        ready.put(("ready", sum(registered)))
        await asyncio.gather(_loop_lag(recorder), *(worker(i) for i in indexes))
        for path in heartbeats.values():
            path.close()
        for relay in relays.values():
            await relay.close(None)
    await server.stop(grace=None)
    return recorder.result()


async def _clients(address: str, config: Config, first_job: int, window: Any, ready: Any) -> Any:
    """Submissions at the configured rate, watchers and readers, inside the window."""
    recorder = Recorder(window)
    job_ids: list[str] = []
    async with _channel(address) as channel:
        jobs = scheduler_pb2_grpc.JobServiceStub(channel)
        ready.put(("ready", 0))
        while window[0] <= 0:
            await asyncio.sleep(0.01)
        start = window[0]
        in_flight: set[asyncio.Task[None]] = set()

        async def submit(index: int) -> None:
            request = submit_request(index, config.unplaceable)
            reply = await recorder.call("SubmitJob", jobs.SubmitJob(request, timeout=CALL_TIMEOUT))
            if reply is not None:
                job_ids.append(reply.job.job_id)

        async def submitter() -> None:
            if config.submits_per_second <= 0:
                return
            k = 0
            while True:
                when = start + k / config.submits_per_second
                if when >= window[1]:
                    return
                await _until(when)
                if len(in_flight) < 1000:  # bounded: a stalled scheduler cannot pile up tasks
                    task = asyncio.create_task(submit(first_job + k))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
                k += 1

        async def every_second(make: Callable[[], Awaitable[Any]], name: str = "") -> None:
            """Call `make()` once a second (recorded under `name` when given)."""
            tick = start + random.uniform(0, 1)
            while not recorder.over():
                await _until(tick)
                if recorder.over():
                    return
                await (recorder.call(name, make()) if name else make())
                tick = max(tick + 1, time.time())

        async def watch_once() -> None:
            if not job_ids:
                return
            call = jobs.WatchJob(
                S.WatchJobRequest(job_id=random.choice(job_ids)), timeout=CALL_TIMEOUT
            )

            async def first_event() -> Any:
                return await call.read()

            try:
                await recorder.call("WatchJob (first event)", first_event())
            finally:
                call.cancel()

        loops = [submitter(), *(every_second(watch_once) for _ in range(config.watchers))]
        for _ in range(config.readers):
            loops.append(
                every_second(
                    lambda: jobs.GetClusterState(S.GetClusterStateRequest(), timeout=CALL_TIMEOUT),
                    "GetClusterState",
                )
            )
            loops.append(
                every_second(
                    lambda: jobs.ListJobs(
                        S.ListJobsRequest(
                            states=[C.JOB_STATE_QUEUED], page=C.PageRequest(page_size=50)
                        ),
                        timeout=CALL_TIMEOUT,
                    ),
                    "ListJobs",
                )
            )
        await asyncio.gather(_loop_lag(recorder), *loops)
        if in_flight:
            await asyncio.wait(in_flight, timeout=CALL_TIMEOUT + 1)
    return recorder.result()


def _worker_process(
    address: str, first: int, count: int, window: Any, out: Any, *, job_seconds: float
) -> None:
    try:
        out.put(
            (
                "result",
                asyncio.run(_workers(address, first, count, window, out, job_seconds=job_seconds)),
            )
        )
    except BaseException as exc:  # the parent waits for a message: always send one
        out.put(("failed", f"workers {first}..{first + count - 1}: {exc!r}"))


def _client_process(address: str, config: Config, first_job: int, window: Any, out: Any) -> None:
    try:
        out.put(("result", asyncio.run(_clients(address, config, first_job, window, out))))
    except BaseException as exc:
        out.put(("failed", f"clients: {exc!r}"))


async def _preload(address: str, count: int, unplaceable: bool) -> None:
    """Submit `count` jobs, 32 at a time; LoadError on the first refusal."""
    async with _channel(address) as channel:
        jobs = scheduler_pb2_grpc.JobServiceStub(channel)
        gate = asyncio.Semaphore(32)

        async def one(index: int) -> None:
            async with gate:
                try:
                    await jobs.SubmitJob(
                        submit_request(index, unplaceable),
                        timeout=CALL_TIMEOUT * 3,
                    )
                except grpc.aio.AioRpcError as exc:
                    raise LoadError(
                        f"pre-submitting job {index}: {exc.code().name}: {exc.details()}"
                    ) from None

        await asyncio.gather(*(one(i) for i in range(count)))


# Postgres and the daemon ----------------------------------------------------------------------
@contextlib.contextmanager
def fresh_database(url: str) -> Iterator[str]:
    """A new, empty database on the server of `url` (gearshift.common.db.scratch_database),
    dropped afterwards; LoadError when the URL is not PostgreSQL or the server cannot be
    reached."""
    import sqlalchemy

    from gearshift.common.db import database_url, scratch_database

    try:
        server = database_url(url)
    except Exception as exc:
        raise LoadError(f"--database-url {url!r}: {exc}") from None
    if server.get_backend_name() != "postgresql":
        raise LoadError(f"--database-url {url!r}: a PostgreSQL URL is needed")
    with contextlib.ExitStack() as stack:
        try:
            database = stack.enter_context(scratch_database(server, "gs_load"))
        except sqlalchemy.exc.OperationalError as exc:
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            raise LoadError(
                f"PostgreSQL at {server.render_as_string()} is unreachable: {reason}"
            ) from None
        yield database


def database_sessions(server_url: str, database: str) -> int | None:
    """Sessions PostgreSQL has opened on `database` so far (pg_stat_database.sessions,
    PostgreSQL 14 and later; None on older servers). Asked from the server's own database,
    so that asking adds none."""
    import sqlalchemy

    from gearshift.common.db import database_url

    engine = sqlalchemy.create_engine(database_url(server_url), poolclass=sqlalchemy.pool.NullPool)
    name = database_url(database).database
    try:
        with engine.connect() as conn:
            row = conn.execute(
                sqlalchemy.text("SELECT sessions FROM pg_stat_database WHERE datname = :name"),
                {"name": name},
            ).first()
    except sqlalchemy.exc.ProgrammingError:  # no such column before PostgreSQL 14
        return None
    finally:
        engine.dispose()
    return int(row[0]) if row is not None else None


def start_scheduler(database: str, config: Config, run_dir: Path) -> DaemonProcess:
    limit = str(max(10 * (config.queued + config.submits_per_second * config.seconds), 1000))
    own = {
        "round": {"seconds": config.round_seconds},
        "heartbeats": {"intervalSeconds": HEARTBEAT_SECONDS, "timeoutSeconds": 10},
        "limits": {
            "maxSubmitsPerSecond": max(1000.0, 10 * config.submits_per_second),
            "maxQueuedJobs": int(float(limit)),
            "maxStreams": 1000,
        },
        "cluster": {"checkpointRoot": str(run_dir / "checkpoints")},
    }
    file = run_dir / "scheduler.yaml"
    run_dir.mkdir(parents=True, exist_ok=True)
    file.write_text(yaml.safe_dump(merged(own, config.scheduler_config), sort_keys=False))
    flags = [
        *("--database-url", database),
        *("--config", str(file)),
        *("--metrics-listen", "127.0.0.1:0"),
        *("--log-format", "text"),
    ]
    daemon = start_daemon("scheduler", flags, run_dir=run_dir)
    try:
        daemon.wait_ready(90)
    except DaemonError as exc:
        daemon.stop()
        raise LoadError(f"the scheduler did not start: {exc}") from None
    return daemon


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far, from /proc (0.0 where there is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_busy() -> tuple[float, float]:
    """The host's busy and total CPU time so far, from /proc/stat ((0, 0) where there is
    none): their change over the window is how busy the machine was."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return float(sum(fields) - idle), float(sum(fields))


def helper_pids(server: int) -> dict[str, list[int]]:
    """The processes that work for the server beside it: its children (the scheduler's
    decision process and heartbeat relays) and PostgreSQL's."""
    children: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{server}/task"):
            text = Path(f"/proc/{server}/task/{task}/children").read_text()
            children.extend(int(p) for p in text.split())
    relays: list[int] = []
    for pid in list(children):
        with contextlib.suppress(OSError):
            if b"heartbeat_relay" in Path(f"/proc/{pid}/cmdline").read_bytes():
                children.remove(pid)
                relays.append(pid)
    postgres: list[int] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{entry}/comm").read_text().strip() == "postgres":
                    postgres.append(int(entry))
    return {"decision": children, "relays": relays, "postgres": postgres}


def helper_cpu(server: int) -> dict[str, dict[int, float]]:
    return {k: {p: cpu_seconds(p) for p in pids} for k, pids in helper_pids(server).items()}


def cpu_spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds that processes spent between two readings (one that started meanwhile
    counts whole; one that ended is missed)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def scrape(daemon: DaemonProcess) -> dict[str, Any]:
    """The scheduler's metrics that matter here, from its Prometheus endpoint."""
    from prometheus_client.parser import text_string_to_metric_families

    with _LOCAL.open(daemon.metrics_url, timeout=30) as reply:
        text = reply.read().decode()
    out: dict[str, Any] = {"buckets": {}, "jobs": {}, "phases": {}}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gearshift_scheduler_round_phase_seconds_sum":
                out["phases"][sample.labels["phase"]] = sample.value
            elif sample.name == "gearshift_scheduler_round_duration_seconds_bucket":
                out["buckets"][float(sample.labels["le"])] = sample.value
            elif sample.name.startswith("gearshift_scheduler_round_duration_seconds_"):
                out[sample.name.rsplit("_", 1)[1]] = sample.value
            elif sample.name == "gearshift_jobs":
                out["jobs"][sample.labels["state"]] = int(sample.value)
            elif sample.name in (
                "gearshift_scheduler_round",
                "gearshift_scheduler_job_starts_total",
                "gearshift_scheduler_workers_lost_total",
                "gearshift_scheduler_preemptions_total",
            ):
                out[sample.name.removeprefix("gearshift_scheduler_")] = sample.value
    return out


def slow_rounds_line(rounds: list[dict[str, float]]) -> str:
    if not rounds:
        return "rounds over 1 s: none"
    worst = max(rounds, key=lambda r: r["seconds"])
    phases = sorted(((k, v) for k, v in worst.items() if k != "seconds"), key=lambda kv: -kv[1])
    return (
        f"rounds over 1 s: {len(rounds)}, the longest {worst['seconds']:.2f}s ("
        + ", ".join(f"{k} {v:.2f}" for k, v in phases[:3])
        + ")"
    )


def round_figures(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """Rounds that ended in the window: count, mean, and p50 / max as bucket upper bounds."""
    count = after.get("count", 0.0) - before.get("count", 0.0)
    total = after.get("sum", 0.0) - before.get("sum", 0.0)
    out = {"rounds": count, "mean_s": total / count if count else 0.0}
    for phase, seconds in after.get("phases", {}).items():  # each phase's mean
        spent = seconds - before.get("phases", {}).get(phase, 0.0)
        out[f"{phase}_mean_s"] = spent / count if count else 0.0
    deltas = sorted((le, n - before["buckets"].get(le, 0.0)) for le, n in after["buckets"].items())
    for key, share in (("p50_le_s", 0.5), ("max_le_s", 1.0)):
        out[key] = next((le for le, n in deltas if count and n >= share * count), float("nan"))
    return out


def window_log(path: Path, offset: int) -> str:
    """The scheduler's log from `offset` (the window's start) on ("" if unreadable)."""
    try:
        with path.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")
    except OSError:
        return ""


def log_events(text: str) -> dict[str, int]:
    return {name: text.count(pattern) for name, pattern in LOG_EVENTS.items()}


_SLOW_ROUND = re.compile(r"gearshift\.scheduler: slow round (.*)$", re.MULTILINE)


def slow_rounds(text: str) -> list[dict[str, float]]:
    """The rounds the scheduler logged as slow (over a second), each its seconds and its
    phases' (`seconds=1.2 asks=0.02 ...`): which phase the histogram's max falls in."""
    out = []
    for match in _SLOW_ROUND.finditer(text):
        fields = dict(pair.split("=", 1) for pair in match.group(1).split())
        out.append({k: float(v) for k, v in fields.items() if k != "round"})
    return out


# One trial -------------------------------------------------------------------------------------
def _collect(out: Any, expected: int, deadline: float, what: str) -> list[Any]:
    """`expected` messages of kind `what` from the processes; LoadError on a failure."""
    got: list[Any] = []
    while len(got) < expected:
        left = deadline - time.monotonic()
        if left <= 0:
            raise LoadError(f"{expected - len(got)} load processes not {what} in time")
        try:
            kind, value = out.get(timeout=min(left, 1.0))
        except Exception:  # queue.Empty
            continue
        if kind == "failed":
            raise LoadError(f"a load process failed: {value}")
        if kind == what:
            got.append(value)
    return got


def run_trial(config: Config, log: Callable[[str], None] = print) -> Report:
    """Start Postgres database and scheduler, load it, measure, tear everything down."""
    with contextlib.ExitStack() as stack:
        if config.run_dir:
            run_dir = Path(config.run_dir) / f"{config.workers}-workers"
        else:
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gs-load-")))
        database = stack.enter_context(fresh_database(config.database_url))
        daemon = start_scheduler(database, config, run_dir)
        metrics: list[dict[str, Any]] = []
        sessions: list[int | None] = []
        try:
            began = time.monotonic()
            asyncio.run(_preload(daemon.address, config.queued, config.unplaceable))
            preload = time.monotonic() - began
            log(f"  {config.queued} jobs pre-submitted in {preload:.1f}s")
            log_offset = 0

            def mark() -> None:  # at the window's start and end
                nonlocal log_offset
                if not metrics:
                    log_offset = daemon.log_path.stat().st_size
                metrics.append(scrape(daemon))
                sessions.append(database_sessions(config.database_url, database))

            drive = _drive(daemon.address, daemon.process.pid, config, log, mark)
            if daemon.process.poll() is not None:
                raise LoadError(f"the scheduler exited:\n{daemon.log_tail()}")
            text = window_log(daemon.log_path, log_offset)
        finally:
            daemon.stop(timeout=30)
    before, after = metrics
    counters = {
        key: after.get(key, 0.0) - before.get(key, 0.0)
        for key in ("job_starts_total", "workers_lost_total", "preemptions_total")
    }
    counters["jobs_succeeded"] = after["jobs"].get("succeeded", 0) - before["jobs"].get(
        "succeeded", 0
    )
    return Report(
        config=asdict(config),
        rpcs=drive.rpcs,
        rounds=round_figures(before, after),
        queued_jobs=after["jobs"].get("queued", 0),
        running_jobs=after["jobs"].get("running", 0),
        counters=counters,
        log_events=log_events(text),
        slow_rounds=slow_rounds(text),
        reregistrations=drive.reregistrations,
        preload_seconds=preload,
        registration_seconds=drive.registration_seconds,
        scheduler_cpu_seconds=drive.cpu_seconds,
        generator_cpu_seconds=drive.generator_cpu_seconds,
        helper_cpu_seconds=drive.helper_cpu_seconds,
        host_busy=drive.host_busy,
        load_average=drive.load_average,
        database_sessions=_opened(sessions),
    )


def _opened(sessions: list[int | None]) -> int | None:
    first, last = sessions
    return last - first if first is not None and last is not None else None


def run_baseline(config: Config, log: Callable[[str], None] = print) -> Report:
    """The same load on bench/bare_server.py (answers at once, does nothing): what Python's
    gRPC alone costs on this machine, the floor the scheduler is measured against."""
    from bench.bare_server import serve

    ctx = mp.get_context("spawn")
    ready, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=serve, args=(ready, stop))
    server.start()
    try:
        (port,) = _collect(ready, 1, time.monotonic() + 60, "ready")
        drive = _drive(f"127.0.0.1:{port}", server.pid or 0, config, log, lambda: None)
    finally:
        stop.set()
        server.join(timeout=15)
        if server.is_alive():
            server.kill()
            server.join()
    return Report(
        config={**asdict(config), "baseline": True},
        rpcs=drive.rpcs,
        rounds={},
        queued_jobs=0,
        running_jobs=0,
        counters={},
        log_events={},
        reregistrations=drive.reregistrations,
        preload_seconds=0.0,
        registration_seconds=drive.registration_seconds,
        scheduler_cpu_seconds=drive.cpu_seconds,
        generator_cpu_seconds=drive.generator_cpu_seconds,
        helper_cpu_seconds=drive.helper_cpu_seconds,
        host_busy=drive.host_busy,
        load_average=drive.load_average,
    )


@dataclass
class Drive:
    """What one run of the load processes measured."""

    rpcs: dict[str, RpcStats]
    reregistrations: int
    registration_seconds: float
    cpu_seconds: float  # the server's, in the window
    generator_cpu_seconds: float  # the worker and client processes', in the window
    load_average: tuple[float, float]
    helper_cpu_seconds: dict[str, float] = field(default_factory=dict)  # by HELPERS' keys
    host_busy: float = 0.0  # share of the host's CPU time busy in the window


def _drive(
    address: str, pid: int, config: Config, log: Callable[[str], None], mark: Callable[[], None]
) -> Drive:
    """The workers' and the clients' processes against `address` (the server's process is
    `pid`): registered, then measured for the window; `mark` runs at its start and end."""
    ctx = mp.get_context("spawn")  # no fork after grpc is initialised in this process
    window = ctx.Array("d", [0.0, 0.0], lock=False)
    out = ctx.Queue()
    parts = max(1, min(config.processes, config.workers))
    sizes = [config.workers // parts + (i < config.workers % parts) for i in range(parts)]
    processes: list[Any] = []
    first = 0
    for size in sizes:
        processes.append(
            ctx.Process(
                target=_worker_process,
                args=(address, first, size, window, out),
                kwargs={"job_seconds": config.job_seconds},
            )
        )
        first += size
    processes.append(
        ctx.Process(target=_client_process, args=(address, config, config.queued, window, out))
    )
    try:
        began = time.monotonic()
        for process in processes:
            process.start()
        ready = _collect(out, len(processes), time.monotonic() + 60 + config.workers * 0.2, "ready")
        registration = time.monotonic() - began
        if sum(ready) < config.workers:
            raise LoadError(f"only {sum(ready)} of {config.workers} workers registered")
        log(f"  {config.workers} workers registered in {registration:.1f}s")
        time.sleep(2 * HEARTBEAT_SECONDS)  # every worker heartbeating before measuring
        if config.warmup_seconds:
            log(f"  warming up for {config.warmup_seconds:g}s (no submissions yet)")
            time.sleep(config.warmup_seconds)
        mark()
        generators = [p.pid or 0 for p in processes]
        cpu_before, load_before = cpu_seconds(pid), os.getloadavg()[0]
        helpers_before, busy_before = helper_cpu(pid), host_busy()
        generated_before = sum(cpu_seconds(p) for p in generators)
        start = time.time()
        window[0], window[1] = start, start + config.seconds
        # The generators' and the helpers' CPU at the window's end, before they drain.
        generated: list[float] = []
        helpers_after: list[dict[str, dict[int, float]]] = []
        busy_after: list[tuple[float, float]] = []

        def at_end() -> None:
            generated.append(sum(cpu_seconds(p) for p in generators))
            helpers_after.append(helper_cpu(pid))
            busy_after.append(host_busy())

        timer = threading.Timer(config.seconds, at_end)
        timer.start()
        results = _collect(
            out, len(processes), time.monotonic() + config.seconds + 3 * CALL_TIMEOUT, "result"
        )
        cpu_after, load_after = cpu_seconds(pid), os.getloadavg()[0]
        timer.join()
        mark()
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
    latencies: dict[str, list[float]] = {}
    errors: dict[str, Counter[str]] = {}
    for result in results:
        for name, values in result["latencies"].items():
            latencies.setdefault(name, []).extend(values)
        for name, codes in result["errors"].items():
            errors.setdefault(name, Counter()).update(codes)
    return Drive(
        rpcs={
            name: _stats(latencies[name], errors.get(name, Counter())) for name in sorted(latencies)
        },
        reregistrations=sum(r["reregistrations"] for r in results),
        registration_seconds=registration,
        cpu_seconds=cpu_after - cpu_before,
        generator_cpu_seconds=(generated[0] - generated_before) if generated else 0.0,
        load_average=(load_before, load_after),
        helper_cpu_seconds={
            kind: cpu_spent(helpers_before[kind], helpers_after[0][kind]) if helpers_after else 0.0
            for kind in helpers_before
        },
        host_busy=_busy_share(busy_before, busy_after[0]) if busy_after else 0.0,
    )


def _busy_share(before: tuple[float, float], after: tuple[float, float]) -> float:
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0


def _stats(values: list[float], codes: Counter[str]) -> RpcStats:
    ordered = sorted(values)

    def pick(q: float) -> float:
        if not ordered:
            return 0.0
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return RpcStats(
        count=len(ordered),
        errors=sum(codes.values()),
        p50_ms=statistics.median(ordered) * 1000 if ordered else 0.0,
        p99_ms=pick(0.99),
        max_ms=ordered[-1] * 1000 if ordered else 0.0,
        error_codes=dict(codes),
    )


# Output ----------------------------------------------------------------------------------------
def print_report(report: Report) -> None:
    c = report.config
    baseline = bool(c.get("baseline"))
    print(
        ("baseline (bench/bare_server.py, answers at once): " if baseline else "")
        + f"{c['workers']} workers, {c['submits_per_second']:g} submissions/s, "
        + (f"{c['queued']} pre-queued, " if not baseline else "")
        + f"{c['seconds']:g}s measured"
        + (f" after {c['warmup_seconds']:g}s of warm-up" if c.get("warmup_seconds") else "")
        + (" (unplaceable jobs)" if c["unplaceable"] and not baseline else "")
    )
    print(f"  {'RPC':<24}{'count':>8}{'errors':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    for name, s in report.rpcs.items():
        flag = "  > 100 ms" if s.p99_ms > TARGET_P99 * 1000 else ""
        print(
            f"  {name:<24}{s.count:>8}{s.errors:>8}{s.p50_ms:>9.1f}{s.p99_ms:>9.1f}"
            f"{s.max_ms:>9.1f}{flag}" + (f"  {s.error_codes}" if s.error_codes else "")
        )
    if baseline:
        print(
            f"  server CPU in the window: {report.scheduler_cpu_seconds:.1f} s "
            f"({cpu_per_call(report) * 1000:.2f} ms per RPC); host load average "
            f"{report.load_average[0]:.2f} -> {report.load_average[1]:.2f} on {os.cpu_count()} CPUs"
        )
        print(generator_line(report))
        return
    r = report.rounds
    print(
        f"  rounds: {r['rounds']:.0f} ended, mean {r['mean_s']:.3f}s, p50 <= {r['p50_le_s']:g}s, "
        f"max <= {r['max_le_s']:g}s (histogram buckets)"
    )
    phases = [(k.removesuffix("_mean_s"), v) for k, v in r.items() if k.endswith("_mean_s")]
    if phases:
        print("  round phases, mean s: " + ", ".join(f"{k} {v:.3f}" for k, v in phases))
    print("  " + slow_rounds_line(report.slow_rounds))
    print(
        f"  jobs: {report.queued_jobs} queued, {report.running_jobs} running at the end; "
        f"in the window: {report.counters['job_starts_total']:.0f} starts, "
        f"{report.counters.get('jobs_succeeded', 0):.0f} jobs completed, "
        f"{report.counters['workers_lost_total']:.0f} workers lost, "
        f"{report.reregistrations} re-registrations"
    )
    print(f"  scheduler log in the window: {report.log_events}")
    print(
        f"  scheduler CPU in the window: {report.scheduler_cpu_seconds:.1f} s "
        f"({cpu_per_call(report) * 1000:.2f} ms per RPC, rounds included); host load average "
        f"{report.load_average[0]:.2f} -> {report.load_average[1]:.2f} "
        f"on {os.cpu_count()} CPUs"
    )
    if report.database_sessions is not None:
        print(f"  PostgreSQL sessions opened in the window: {report.database_sessions}")
    print(generator_line(report))


def generator_line(report: Report) -> str:
    """What the load generator, the server's helpers and the host took of the machine."""
    seconds = report.config["seconds"]
    share = report.generator_cpu_seconds / seconds if seconds else 0.0
    helpers = "".join(
        f", {HELPERS[k]} {v:.1f} s" for k, v in report.helper_cpu_seconds.items() if k in HELPERS
    )
    return (
        f"  load generator CPU in the window: {report.generator_cpu_seconds:.1f} s "
        f"({share:.2f} of {os.cpu_count()} CPUs){helpers}; "
        f"host CPU busy {report.host_busy:.0%}"
    )


HELPERS = {"decision": "decision process", "relays": "heartbeat relays", "postgres": "PostgreSQL"}


def cpu_per_call(report: Report) -> float:
    """The server's CPU seconds per RPC in the window (the startup registrations aside)."""
    calls = sum(s.count for name, s in report.rpcs.items() if name not in NOT_TARGETS)
    return report.scheduler_cpu_seconds / max(calls, 1)


def compare(scheduler: Report, baseline: Report) -> dict[str, Any]:
    """The scheduler against the bare server under the same load: p99 per RPC and CPU per
    RPC, each as a ratio (a figure that means more than the milliseconds on a shared,
    noisy machine)."""
    rpcs = {}
    for name, s in scheduler.rpcs.items():
        b = baseline.rpcs.get(name)
        if name in NOT_TARGETS or b is None or not s.count or not b.count:
            continue
        rpcs[name] = {
            "p99_ms": s.p99_ms,
            "baseline_p99_ms": b.p99_ms,
            "ratio": s.p99_ms / b.p99_ms if b.p99_ms else float("inf"),
        }
    cpu, floor = cpu_per_call(scheduler), cpu_per_call(baseline)
    return {
        "rpcs": rpcs,
        "cpu_ms_per_rpc": cpu * 1000,
        "baseline_cpu_ms_per_rpc": floor * 1000,
        "cpu_ratio": cpu / floor if floor else float("inf"),
    }


def print_comparison(comparison: dict[str, Any]) -> None:
    print("  against the baseline (same load, same run):")
    for name, r in comparison["rpcs"].items():
        print(
            f"    {name:<24} p99 {r['p99_ms']:>8.1f} ms vs {r['baseline_p99_ms']:>7.1f} ms"
            f"  ({r['ratio']:.1f}x)"
        )
    print(
        f"    CPU per RPC: {comparison['cpu_ms_per_rpc']:.2f} ms vs "
        f"{comparison['baseline_cpu_ms_per_rpc']:.2f} ms ({comparison['cpu_ratio']:.1f}x)"
    )


def median_report(reports: Sequence[Report]) -> Report:
    """Of one configuration's repeated trials, the one with the median worst p99: what the
    knee is read from (runs of the same code on a shared host differ 2-3x)."""
    ranked = sorted(reports, key=Report.worst_p99_ms)
    return ranked[(len(ranked) - 1) // 2]


def spread(reports: Sequence[Report]) -> dict[str, tuple[float, float, float]]:
    """Each RPC's p99 over repeated trials: (median, lowest, highest), in ms."""
    out: dict[str, tuple[float, float, float]] = {}
    for name in reports[0].rpcs:
        values = [r.rpcs[name].p99_ms for r in reports if name in r.rpcs and r.rpcs[name].count]
        if values:
            out[name] = (statistics.median(values), min(values), max(values))
    return out


def print_spread(reports: Sequence[Report]) -> None:
    """The trials of one configuration side by side: p99s, starts, rounds, host."""
    print(f"{reports[0].config['workers']} workers, {len(reports)} trials: p99 median (range)")
    for name, (mid, low, high) in spread(reports).items():
        flag = "  > 100 ms" if mid > TARGET_P99 * 1000 and name not in NOT_TARGETS else ""
        print(f"  {name:<24}{mid:>9.1f}  ({low:.1f}-{high:.1f}){flag}")
    print(
        "  starts in the window: "
        + ", ".join(f"{r.counters['job_starts_total']:.0f}" for r in reports)
        + "; rounds mean s: "
        + ", ".join(f"{r.rounds['mean_s']:.2f}" for r in reports)
        + "; longest round s: "
        + ", ".join(f"{r.longest_round_s():.2f}" for r in reports)
        + "; host busy: "
        + ", ".join(f"{r.host_busy:.0%}" for r in reports)
    )


def knee(reports: Sequence[Report]) -> int | None:
    """The first worker count at which some RPC's p99 passes the target."""
    for report in reports:
        if report.worst_p99_ms() > TARGET_P99 * 1000:
            return int(report.config["workers"])
    return None


def _counts(text: str) -> list[int]:
    if not re.fullmatch(r"\d+(,\d+)*", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of counts")
    return [int(x) for x in text.split(",")]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workers", type=int, default=1000, help="simulated workers")
    parser.add_argument("--submits-per-second", type=float, default=100.0)
    parser.add_argument("--queued", type=int, default=2000, help="jobs submitted first")
    parser.add_argument("--seconds", type=float, default=30.0, help="measurement window")
    parser.add_argument("--processes", type=int, default=4, help="worker-driving processes")
    parser.add_argument("--watchers", type=int, default=4)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--round-seconds", type=float, default=5.0)
    parser.add_argument(
        "--warmup",
        type=float,
        default=0.0,
        help="seconds between the workers' registration and the window (the pre-queued jobs "
        "placed first, without submissions): the steady state rather than the first fill",
    )
    parser.add_argument(
        "--job-seconds",
        type=float,
        default=0.0,
        help="a simulated job completes after running this long in all (a preemption or a "
        "rescale pauses it), freeing its devices "
        "(the cluster's steady state: the jobs that end make room for those that arrive); "
        "0: jobs run until preempted",
    )
    parser.add_argument(
        "--unplaceable", action="store_true", help="jobs ask for a type no worker has"
    )
    parser.add_argument(
        "--sweep",
        nargs="?",
        const=",".join(map(str, DEFAULT_SWEEP)),
        type=_counts,
        default=None,
        help="one trial per worker count (default 100,250,500,1000,2000); reports the knee",
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="first run the same load on a server that answers at once (bench/bare_server.py) "
        "and report the scheduler's p99 and CPU per RPC as ratios to it",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="trials per worker count; with more than one, each RPC's median p99 and its "
        "range, and the knee read from each count's median trial",
    )
    parser.add_argument("--database-url", default=DEFAULT_DATABASE)
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="a scheduler configuration file laid over the bench's own settings (e.g. "
        "`round: {eventRoundGap: 0}`, to compare with a run of the defaults)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument(
        "--run-dir", default="", help="keep the scheduler's log here (default: a temporary folder)"
    )
    args = parser.parse_args(argv)
    for name in ("workers", "processes", "seconds", "round_seconds", "repeat"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")
    for name in ("queued", "submits_per_second", "watchers", "readers", "warmup", "job_seconds"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    counts = args.sweep or [args.workers]
    overrides: dict[str, Any] = {}
    if args.config is not None:
        try:
            overrides = yaml.safe_load(args.config.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            print(f"--config: {args.config}: {exc}", file=sys.stderr)
            return 2
    reports: list[Report] = []
    medians: list[Report] = []  # each count's median trial
    baselines: list[Report] = []
    comparisons: list[dict[str, Any]] = []
    try:
        for workers in counts:
            config = Config(
                workers=workers,
                submits_per_second=args.submits_per_second,
                queued=args.queued,
                seconds=args.seconds,
                processes=args.processes,
                watchers=args.watchers,
                readers=args.readers,
                round_seconds=args.round_seconds,
                warmup_seconds=args.warmup,
                job_seconds=args.job_seconds,
                unplaceable=args.unplaceable,
                database_url=args.database_url,
                run_dir=args.run_dir,
                scheduler_config=overrides,
            )
            say = lambda line: print(line, flush=True)  # noqa: E731
            if args.baseline:
                print(f"baseline: {workers} workers ...", flush=True)
                floor = run_baseline(config, log=say)
                print_report(floor)
                baselines.append(floor)
            trials: list[Report] = []
            for trial in range(args.repeat):
                number = f" (trial {trial + 1} of {args.repeat})" if args.repeat > 1 else ""
                print(f"trial: {workers} workers{number} ...", flush=True)
                report = run_trial(config, log=say)
                print_report(report)
                trials.append(report)
                if args.baseline:
                    comparisons.append(compare(report, floor))
                    print_comparison(comparisons[-1])
            if args.repeat > 1:
                print_spread(trials)
            reports.extend(trials)
            medians.append(median_report(trials))
    except LoadError as exc:
        print(f"load: {exc}", file=sys.stderr)
        return 2
    found = knee(medians)
    if args.sweep:
        print(
            "knee: "
            + (
                f"some RPC's p99 passes {TARGET_P99 * 1000:.0f} ms at {found} workers"
                if found is not None
                else f"no RPC's p99 passed {TARGET_P99 * 1000:.0f} ms up to {counts[-1]} workers"
            )
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "targets": {"p99_ms": TARGET_P99 * 1000, "round_s": TARGET_ROUND},
                    "trials": [asdict(r) for r in reports],
                    "baselines": [asdict(r) for r in baselines],
                    "comparisons": comparisons,
                    "knee_workers": found,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
