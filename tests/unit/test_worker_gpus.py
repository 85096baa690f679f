"""Which GPU each training process takes and which backend its job uses, decided on CPU.

The runtime's rule (runtime/backend.py) for the local launcher and for processes started
one by one, and what a worker daemon shows and tells each process of a task (its
CUDA_VISIBLE_DEVICES, --local-device and --backend), for 1, 2 and 4 processes on one
worker, ranks spread over workers, and processes sharing a GPU.
"""

from __future__ import annotations

from typing import Any

import pytest

from gearshift.common.errors import ValidationError
from gearshift.v1 import common_pb2, worker_pb2
from gearshift.worker.command import CommandSettings, TaskPlan, plan_task
from gearshift.worker.gpus import GpuView, task_gpus
from gearshift.worker.runtime.backend import DeviceChoice, choose_backend, choose_device
from tests.unit.task_requests import resolved

CUDA = CommandSettings(python="python", accelerator="cuda")
CPU = CommandSettings(python="python", accelerator="cpu")
BASE_ENV = {"PATH": "/usr/bin", "GEARSHIFT_TOKEN": "t"}


@pytest.mark.parametrize(
    ("device", "gpus", "backend"),
    [
        ("cpu", [0, 1], "gloo"),
        ("cpu", [0], "gloo"),
        ("cuda", [0], "nccl"),
        ("cuda", [0, 1], "nccl"),
        ("cuda", [0, 1, 2, 3], "nccl"),
        ("cuda", [0, 0], "gloo"),
        ("cuda", [0, 1, 0, 1], "gloo"),
        ("cuda", [("wA", 0), ("wB", 0)], "nccl"),  # same index, other machine
        ("cuda", [("wA", 0), ("wA", 1), ("wB", 0), ("wA", 1)], "gloo"),
    ],
)
def test_nccl_only_when_every_process_has_a_gpu_of_its_own(
    device: str, gpus: list[object], backend: str
) -> None:
    assert choose_backend(device, gpus) == backend


# The launcher (all processes on this machine): processes, visible GPUs -> per rank
# (GPU index, backend, whether the backend sends from the GPU).
LAUNCHER_TABLE = [
    (1, 1, [(0, "nccl", True)]),
    (2, 1, [(0, "gloo", False)] * 2),
    (4, 1, [(0, "gloo", False)] * 4),
    (2, 2, [(0, "nccl", True), (1, "nccl", True)]),
    (4, 2, [(0, "gloo", False), (1, "gloo", False), (0, "gloo", False), (1, "gloo", False)]),
    (4, 4, [(r, "nccl", True) for r in range(4)]),
]


@pytest.mark.parametrize(("procs", "visible", "per_rank"), LAUNCHER_TABLE)
def test_the_launchers_processes_share_the_visible_gpus_round_robin(
    procs: int, visible: int, per_rank: list[tuple[int, str, bool]]
) -> None:
    got = [choose_device("cuda", rank, procs, visible) for rank in range(procs)]
    assert got == [DeviceChoice(*row) for row in per_rank]


def test_cpu_is_gloo_from_host_memory_whatever_the_gpus() -> None:
    for procs in (1, 2, 4):
        for rank in range(procs):
            assert choose_device("cpu", rank, procs, 0) == DeviceChoice(None, "gloo", False)
            assert choose_device("cpu", rank, procs, 2, backend="gloo").backend == "gloo"


def test_a_process_told_its_gpu_takes_it_and_the_backend_it_is_told() -> None:
    assert choose_device("cuda", 3, 4, 2, local_device=1, backend="nccl") == DeviceChoice(
        1, "nccl", True
    )
    assert choose_device("cuda", 0, 2, 1, local_device=0, backend="gloo") == DeviceChoice(
        0, "gloo", False
    )
    # gloo may always be asked for, also with a GPU per process.
    assert choose_device("cuda", 1, 2, 2, backend="gloo") == DeviceChoice(1, "gloo", False)


def choice(
    device: str, rank: int, procs: int, visible: int, *, local: int | None = None, backend: str
) -> tuple[tuple[str, int, int, int], dict[str, object]]:
    return (device, rank, procs, visible), {"local_device": local, "backend": backend}


@pytest.mark.parametrize(
    ("case", "message"),
    [
        (choice("cuda", 0, 1, 0, backend="auto"), "--device: cuda was asked for but no GPU is"),
        (
            choice("cpu", 0, 1, 0, local=0, backend="auto"),
            "--local-device: is only for --device cuda",
        ),
        (choice("cpu", 0, 2, 0, backend="nccl"), "--backend: nccl needs --device cuda"),
        (choice("tpu", 0, 1, 1, backend="auto"), "--device: 'tpu' is not cpu or cuda"),
        (choice("cuda", 0, 2, 1, backend="mpi"), "--backend: 'mpi' is not one of auto, nccl, gloo"),
        (
            choice("cuda", 0, 2, 2, local=2, backend="nccl"),
            "--local-device: 2 is not a visible GPU (0..1",
        ),
        (
            choice("cuda", 0, 2, 2, local=1, backend="auto"),
            "--backend: give nccl or gloo with --local-device",
        ),
        (choice("cuda", 1, 2, 1, backend="nccl"), "--backend: nccl needs a GPU per process: 2"),
    ],
)
def test_impossible_choices_name_the_flag(
    case: tuple[tuple[str, int, int, int], dict[str, Any]], message: str
) -> None:
    args, flags = case
    with pytest.raises(ValidationError) as exc:
        choose_device(*args, **flags)
    assert exc.value.message.startswith(message), exc.value.message


def test_every_local_rank_sees_the_tasks_gpus_and_takes_its_own() -> None:
    assert task_gpus({0: 2}) == {0: GpuView("2", 0)}
    assert task_gpus({0: 0, 1: 1}) == {0: GpuView("0,1", 0), 1: GpuView("0,1", 1)}
    assert task_gpus({4: 3, 5: 1}) == {4: GpuView("1,3", 1), 5: GpuView("1,3", 0)}
    # Two ranks on one GPU (the daemon refuses such a task; the view stays consistent).
    assert task_gpus({0: 1, 1: 1}) == {0: GpuView("1", 0), 1: GpuView("1", 0)}


# -- what the worker daemon gives each process of a task ---------------------------------


def request(
    placement: list[tuple[str, int]], local: list[int], ests: int = 4
) -> worker_pb2.StartTaskRequest:
    """A task of a job whose rank r runs on placement[r] = (worker, device index), with the
    ESTs spread evenly in rank order."""
    per = ests // len(placement)
    processes = [
        common_pb2.ProcessAssignment(
            rank=rank,
            worker_id=worker,
            device_index=index,
            est_ids=list(range(rank * per, (rank + 1) * per)),
        )
        for rank, (worker, index) in enumerate(placement)
    ]
    spec = common_pb2.JobSpec(
        name="j",
        entrypoint=common_pb2.Entrypoint(module="gearshift.examples.mlp"),
        num_ests=ests,
        global_batch_size=8 * ests,
        total_steps=10,
        dataset=common_pb2.DatasetSpec(size=256, shard_size=16, seed=1),
    )
    return worker_pb2.StartTaskRequest(
        task_id="t1",
        job_id="j1",
        spec=spec,
        placement=common_pb2.Placement(processes=processes),
        local_ranks=local,
        rendezvous_address="127.0.0.1:29500",
        checkpoint_dir="/tmp/ckpt",
    )


def given(plan: TaskPlan, settings: CommandSettings) -> dict[int, tuple[str | None, list[str]]]:
    """Local rank -> (its CUDA_VISIBLE_DEVICES, its GPU settings as the runner's flags would
    say them), as its process gets them."""
    out: dict[int, tuple[str | None, list[str]]] = {}
    for rank in plan.ranks:
        env = plan.environment(rank, settings, BASE_ENV)
        assert {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"} == BASE_ENV
        p = resolved(plan, settings, rank)
        flags = [f"--device {p.device}", f"--local-device {p.local_device}"]
        flags += [f"--backend {p.backend}"]
        plain = (p.device, p.local_device, p.backend) == ("cpu", None, "auto")
        out[rank] = (env.get("CUDA_VISIBLE_DEVICES"), [] if plain else flags)
    return out


def gpu(visible: str, local: int, backend: str) -> tuple[str, list[str]]:
    return visible, ["--device cuda", f"--local-device {local}", f"--backend {backend}"]


DAEMON_TABLE = [
    # (placement of the job: rank -> (worker, device)), this worker, -> local rank: given
    pytest.param([("wA", 2)], "wA", {0: gpu("2", 0, "nccl")}, id="1 process"),
    pytest.param(
        [("wA", 0), ("wA", 1)],
        "wA",
        {0: gpu("0,1", 0, "nccl"), 1: gpu("0,1", 1, "nccl")},
        id="2 processes",
    ),
    pytest.param(
        [("wA", 3), ("wA", 0), ("wA", 2), ("wA", 1)],
        "wA",
        {
            0: gpu("0,1,2,3", 3, "nccl"),
            1: gpu("0,1,2,3", 0, "nccl"),
            2: gpu("0,1,2,3", 2, "nccl"),
            3: gpu("0,1,2,3", 1, "nccl"),
        },
        id="4 processes",
    ),
    pytest.param(
        [("wA", 0), ("wA", 1), ("wB", 0), ("wB", 1)],
        "wB",
        {2: gpu("0,1", 0, "nccl"), 3: gpu("0,1", 1, "nccl")},
        id="spread over 2 workers, worker B",
    ),
    pytest.param(
        [("wA", 0), ("wA", 1), ("wB", 0), ("wB", 1)],
        "wA",
        {0: gpu("0,1", 0, "nccl"), 1: gpu("0,1", 1, "nccl")},
        id="spread over 2 workers, worker A",
    ),
    pytest.param(
        [("wA", 1), ("wB", 1), ("wC", 0), ("wD", 5)],
        "wD",
        {3: gpu("5", 0, "nccl")},
        id="one process on each of 4 workers",
    ),
    pytest.param(
        [("wA", 0), ("wB", 0), ("wA", 0), ("wB", 1)],
        "wB",
        {1: gpu("0,1", 0, "gloo"), 3: gpu("0,1", 1, "gloo")},
        id="ranks 0 and 2 share wA's GPU 0: gloo for the whole job (wA refuses its task)",
    ),
]


@pytest.mark.parametrize(("placement", "worker", "expected"), DAEMON_TABLE)
def test_what_each_process_of_a_task_sees_and_is_told(
    placement: list[tuple[str, int]],
    worker: str,
    expected: dict[int, tuple[str, list[str]]],
) -> None:
    local = [rank for rank, (w, _) in enumerate(placement) if w == worker]
    plan = plan_task(request(placement, local), worker, ["h100"] * 8)
    assert given(plan, CUDA) == expected
    # On CPU slots nothing GPU is set or passed: gloo, as before.
    assert given(plan, CPU) == {rank: (None, []) for rank in local}


def test_every_worker_of_a_job_picks_the_same_backend() -> None:
    placements = [
        [("wA", 0), ("wA", 1), ("wB", 0), ("wB", 1)],
        [("wA", 0), ("wB", 0), ("wC", 0), ("wB", 1)],
    ]
    for placement in placements:
        workers = sorted({w for w, _ in placement})
        backends = set()
        for worker in workers:
            local = [rank for rank, (w, _) in enumerate(placement) if w == worker]
            backends.add(plan_task(request(placement, local), worker, ["h100"] * 2).backend)
        assert len(backends) == 1, placement


def test_a_task_with_two_local_ranks_on_one_gpu_is_refused() -> None:
    with pytest.raises(ValidationError) as exc:
        plan_task(request([("wA", 0), ("wA", 0)], [0, 1]), "wA", ["h100"])
    assert exc.value.message == "placement.processes: two local ranks share one device"


def test_a_tasks_processes_call_with_the_token_the_scheduler_minted_for_the_job() -> None:
    """The job's token replaces the daemon's own in each process's environment; none given,
    the daemon's stays; a token that could not be a header value is refused, naming it."""
    start = request([("wA", 0), ("wA", 1)], [0, 1])
    assert plan_task(start, "wA", ["h100"] * 2).environment(0, CPU, BASE_ENV) == BASE_ENV
    start.job_token = "gsjob.job-1.abc"
    plan = plan_task(start, "wA", ["h100"] * 2)
    for rank in plan.ranks:
        assert plan.environment(rank, CPU, BASE_ENV)["GEARSHIFT_TOKEN"] == "gsjob.job-1.abc"
    start.job_token = "two words"
    with pytest.raises(ValidationError, match="job_token: at most 512 printable"):
        plan_task(start, "wA", ["h100"] * 2)
