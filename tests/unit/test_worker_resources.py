"""A worker's cores and memory: detection parsing, the core allocator, the scheduler's share,
how a task's enforcement is described."""

from __future__ import annotations

import os

import pytest

from gearshift.client.render import cluster_text
from gearshift.common.errors import ResourceExhaustedError, ValidationError
from gearshift.scheduler.round.process_resources import process_resources
from gearshift.v1 import common_pb2, scheduler_pb2
from gearshift.worker.resources import (
    CoreAllocator,
    format_bytes,
    format_cores,
    offered_cores,
    parse_cores,
    parse_meminfo_total,
    pin_from_environment,
)
from gearshift.worker.tasks import describe_enforcement

MEMINFO = "MemTotal:       16315188 kB\nMemFree:         1234 kB\n"


def test_meminfo_total_is_read_in_bytes() -> None:
    assert parse_meminfo_total(MEMINFO) == 16315188 * 1024
    with pytest.raises(ValueError, match="MemTotal"):
        parse_meminfo_total("MemFree: 1 kB\n")


def test_offered_cores_are_the_first_n_or_all() -> None:
    assert offered_cores(0, [2, 3, 5]) == [2, 3, 5]
    assert offered_cores(2, [2, 3, 5]) == [2, 3]
    with pytest.raises(ValidationError, match=r"--cpu-cores: 4 asked but .* only 3"):
        offered_cores(4, [2, 3, 5])
    with pytest.raises(ValidationError, match="--cpu-cores"):
        offered_cores(-1, [0])


@pytest.mark.parametrize(
    ("cores", "text"), [([0], "0"), ([0, 1, 2, 3, 6], "0-3,6"), ([5, 1, 2], "1-2,5"), ([], "")]
)
def test_core_lists_round_trip(cores: list[int], text: str) -> None:
    assert format_cores(cores) == text
    assert parse_cores(text) == sorted(cores)


def test_a_bad_core_list_is_refused() -> None:
    with pytest.raises(ValueError, match="not a core list"):
        parse_cores("0-x")


def test_the_allocator_gives_distinct_free_cores_and_takes_them_back() -> None:
    cores = CoreAllocator([0, 1, 2, 3])
    assert cores.take("a", 1, 2) == [[0], [1]]
    assert cores.take("b", 2, 1) == [[2, 3]]
    held = r"1 cores asked but only 0 .* \(held by a, b\)"
    with pytest.raises(ResourceExhaustedError, match=held):
        cores.take("c", 1, 1)
    cores.release("a")
    assert cores.free() == [0, 1]
    assert cores.take("c", 1, 1) == [[0]]


def test_the_allocator_refuses_more_than_the_worker_has_and_bad_counts() -> None:
    cores = CoreAllocator([0, 1])
    with pytest.raises(ResourceExhaustedError, match=r"3 process\(es\) x 1 cores = 3 .* has 2"):
        cores.take("a", 1, 3)
    with pytest.raises(ValidationError, match="cpu_cores_per_process"):
        cores.take("a", 0, 1)
    assert cores.free() == [0, 1]  # a refusal holds nothing


def test_collocated_tasks_share_the_least_used_cores() -> None:
    cores = CoreAllocator([0, 1, 2])
    assert cores.take("fg", 1, 2) == [[0], [1]]
    assert cores.take("bg", 1, 2, share=True) == [[2], [0]]  # the free one first
    cores.release("fg")
    assert cores.free() == [1]


def test_the_scheduler_shares_a_workers_cores_and_memory_per_device() -> None:
    two = [common_pb2.DeviceGroup(accelerator_type="cpu", count=2)]
    assert process_resources(8, 16 << 30, two) == (4, 8 << 30)
    assert process_resources(8, 16 << 30, two, cpus_per_device=3) == (3, 8 << 30)
    assert process_resources(1, 0, two) == (0, 0)  # fewer cores than devices: no core limit
    assert process_resources(0, 0, two, cpus_per_device=2) == (2, 0)


def test_enforcement_is_described() -> None:
    assert describe_enforcement({}, 0) == ""
    assert (
        describe_enforcement({0: [2], 1: [3]}, 3 << 29)
        == "affinity cores 2 (rank 0), 3 (rank 1); RSS watchdog 1.5 GiB per process"
    )
    assert format_bytes(100) == "100 B"


def test_a_process_pins_itself_to_the_cores_named() -> None:
    before = os.sched_getaffinity(0)
    one = min(before)
    try:
        said = pin_from_environment({"GEARSHIFT_PROCESS_CORES": str(one)})
        assert os.sched_getaffinity(0) == {one}
        assert said == f"resources: pinned to CPU cores {one}"
    finally:
        os.sched_setaffinity(0, before)
    assert pin_from_environment({}) == ""


def test_gearshift_cluster_shows_each_workers_cores_and_memory() -> None:
    state = scheduler_pb2.ClusterState(policy="fifo")
    cpu = [common_pb2.DeviceGroup(accelerator_type="cpu", count=2)]
    state.workers.add(
        worker_id="w1", address="h:1", devices=cpu, cpu_cores=8, memory_bytes=16 << 30
    )
    state.workers.add(worker_id="w2", address="h:2", devices=cpu)  # told nothing
    rows = cluster_text(state).splitlines()
    header = next(r for r in rows if r.startswith("WORKER"))
    assert "CPUS" in header and "MEMORY" in header
    assert next(r for r in rows if r.startswith("w1")).split()[4:6] == ["8", "16.0G"]
    assert next(r for r in rows if r.startswith("w2")).split()[4:6] == ["?", "?"]
