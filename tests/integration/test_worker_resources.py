"""A real worker daemon holds its training processes to their cores and memory: it registers
what it offers, pins each process to cores of its own, refuses cores it does not have free,
and reports a process that ran out of memory (its watchdog's kill, or a MemoryError) as OOM."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import grpc
import pytest

from gearshift.common.channel import connect
from gearshift.common.facts import EXIT_OUT_OF_MEMORY
from gearshift.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from gearshift.worker.resources import parse_cores
from tests.conftest import DaemonFactory
from tests.helpers import wait_until
from tests.integration.test_worker_daemon import (
    WAIT,
    FakeScheduler,
    fake,
    finished,
    spec,
    start_request,
    start_worker,
)

C = common_pb2
__all__ = ["fake"]  # the fixture, used by name
MEMORY_FLAG = "3G"


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--memory", "lots"], "--memory: 'lots' is not a memory size"),
        (["--memory", "0"], "--memory must be > 0"),
        (["--cpu-cores", "9999"], "--cpu-cores: 9999 asked but this daemon may use only"),
        (["--cpu-cores", "-1"], "--cpu-cores: must be >= 0"),
        (["--step-delay", "-0.5"], "--step-delay must be >= 0"),
    ],
)
def test_bad_resource_flags_fail_the_start_naming_the_flag(flags: list[str], error: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gearshift.worker", "--listen", "127.0.0.1:0", *flags],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert error in result.stderr, result.stderr


def allowed_cores(pid: int) -> list[int] | None:
    """The cores a process may run on (/proc's Cpus_allowed_list); None when it is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    text = next(line.split(":", 1)[1] for line in lines if line.startswith("Cpus_allowed_list"))
    return parse_cores(text)


def test_processes_run_on_one_core_each_and_busy_cores_are_refused(
    daemons: DaemonFactory, fake: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    recorder, address = fake
    worker = start_worker(daemons, address, tmp_path, "cpu:2", "--memory", MEMORY_FLAG)
    mine = sorted(os.sched_getaffinity(0))
    registered = wait_until(lambda: recorder.registrations, WAIT, "registration")[0]
    assert registered.cpu_cores == len(mine)
    assert registered.memory_bytes == 3 * 10**9
    request = start_request(tmp_path, "t-pin", spec(1_000_000))
    request.cpu_cores_per_process = 1
    task_dir = tmp_path / "work" / "tasks" / "t-pin"
    with connect(worker.address) as channel:
        stub = worker_pb2_grpc.WorkerAgentStub(channel)
        started = stub.StartTask(request)
        assert started.enforcement.startswith("affinity cores "), started.enforcement
        files = [task_dir / f"rank{r}.pid" for r in (0, 1)]
        pids = [int(wait_until(partial(_read, f), WAIT, f"{f.name}")) for f in files]
        held = [wait_until(partial(_one_core, p), WAIT, f"{p} on one core") for p in pids]
        assert all(set(c) <= set(mine) for c in held)
        if len(mine) >= 2:
            assert held[0] != held[1], held  # each its own
            busy = start_request(tmp_path, "t-busy", spec(10))
            busy.cpu_cores_per_process = 1
            with pytest.raises(grpc.RpcError) as exc:
                stub.StartTask(busy)
            assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "cores asked but only" in (exc.value.details() or "")
        log = wait_until(
            lambda: "resources: pinned to CPU cores" in _read(task_dir / "rank0.log"),
            WAIT,
            "the pin in rank 0's log",
        )
        assert log
        stopped = stub.StopTask(worker_pb2.StopTaskRequest(task_id="t-pin", checkpoint=False))
        assert stopped.state == C.TASK_STATE_FAILED and not stopped.out_of_memory
        # Its cores are free again: the same request under another id now starts.
        again = start_request(tmp_path, "t-again", spec(1_000_000))
        again.cpu_cores_per_process = 1
        assert stub.StartTask(again).enforcement
        stub.StopTask(worker_pb2.StopTaskRequest(task_id="t-again", checkpoint=False))


def test_a_process_over_its_memory_limit_is_killed_and_reported_oom(
    daemons: DaemonFactory, fake: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    recorder, address = fake
    worker = start_worker(daemons, address, tmp_path)
    request = start_request(tmp_path, "t-oom", spec(1_000_000))
    request.memory_bytes_per_process = 32 << 20  # less than torch alone holds
    with connect(worker.address) as channel:
        started = worker_pb2_grpc.WorkerAgentStub(channel).StartTask(request)
    assert "RSS watchdog 32.0 MiB per process" in started.enforcement
    final = finished(recorder, "t-oom")
    assert final.state == C.TASK_STATE_FAILED
    assert final.out_of_memory
    assert final.message.startswith("out of memory: rank "), final.message
    assert "killed by the worker's watchdog: RSS" in final.message
    assert final.exit_code == 128 + 9  # SIGKILL


def test_a_memory_error_is_reported_oom(
    daemons: DaemonFactory, fake: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    recorder, address = fake
    worker = start_worker(daemons, address, tmp_path)
    job = spec(1000, "tests.integration.worker_jobs", '{"samples": 256, "error": "memory"}')
    with connect(worker.address) as channel:
        worker_pb2_grpc.WorkerAgentStub(channel).StartTask(start_request(tmp_path, "t-me", job))
    final = finished(recorder, "t-me")
    assert final.state == C.TASK_STATE_FAILED
    assert final.out_of_memory
    assert final.exit_code == EXIT_OUT_OF_MEMORY
    assert final.message.startswith("out of memory: rank "), final.message
    assert "MemoryError" in final.message


def _one_core(pid: int) -> list[int]:
    """The process's cores once it is pinned to exactly one (empty until then)."""
    cores = allowed_cores(pid)
    return cores if cores is not None and len(cores) == 1 else []


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
