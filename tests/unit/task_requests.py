"""Representative StartTaskRequests, each with the daemon settings and the local rank whose
training process the tests look at: an elastic EST job over two workers on GPUs, a D2 job
with threads, a background collocated task and a dynamic-mode job."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gearshift.v1 import common_pb2, worker_pb2
from gearshift.worker.command import CommandSettings, TaskPlan
from gearshift.worker.training_task import ProcessSettings, resolve

C, W = common_pb2, worker_pb2
TASK_DIR = Path("/w/tasks/t")
CODE_DIR = Path("/w/code/abc")


def resolved(
    plan: TaskPlan, settings: CommandSettings, rank: int = 0, task_dir: Path = TASK_DIR
) -> ProcessSettings:
    """What local rank `rank` of `plan` runs with, read from the message the daemon writes."""
    return resolve(plan.training_task(settings, task_dir), rank)


@dataclass(frozen=True)
class Case:
    request: W.StartTaskRequest
    worker_id: str
    device_types: tuple[str, ...]
    settings: CommandSettings
    rank: int
    code_dir: Path | None = None


def _spec(**fields: object) -> C.JobSpec:
    spec = C.JobSpec(
        name="t",
        entrypoint=C.Entrypoint(module="gearshift.examples.mlp", config_json='{"hidden": 8}'),
        num_ests=4,
        global_batch_size=32,
        total_steps=50,
        dataset=C.DatasetSpec(size=256, shard_size=16, seed=7),
    )
    for name, value in fields.items():
        target = spec
        *path, last = name.split(".")
        for part in path:
            target = getattr(target, part)
        if isinstance(value, (C.PlanDimensions, C.Entrypoint)):
            getattr(target, last).CopyFrom(value)
        else:
            setattr(target, last, value)
    return spec


def _placement(spread: list[tuple[str, int, list[int]]]) -> C.Placement:
    return C.Placement(
        processes=[
            C.ProcessAssignment(
                rank=r, worker_id=worker, device_index=device, est_ids=ests, accelerator_type="h"
            )
            for r, (worker, device, ests) in enumerate(spread)
        ]
    )


def elastic() -> Case:
    """Four ESTs 3+1 over two workers' GPUs; this worker runs rank 1 (a resumed placement)."""
    request = W.StartTaskRequest(
        task_id="job-e.g3.wB",
        job_id="job-e",
        spec=_spec(model_type="mlp"),
        placement=_placement([("wA", 0, [0, 1, 2]), ("wB", 1, [3])]),
        local_ranks=[1],
        rendezvous_address="10.0.0.1:29500",
        checkpoint_dir="/w/ckpt/job-e",
        resume=True,
        endpoints=W.ServiceEndpoints(brain="10.0.0.9:7001", shard_manager="10.0.0.9:7002"),
        dataset_id="ds-e",
        job_token="secret-token",
        profile_first=True,
        generation=3,
    )
    settings = CommandSettings(python="py", accelerator="cuda", log_every=3)
    return Case(request, "wB", ("h", "h"), settings, rank=1)


def elastic_rank0() -> Case:
    """The same job's rank 0 (profiles first; the progress file is its)."""
    case = elastic()
    request = W.StartTaskRequest()
    request.CopyFrom(case.request)
    request.task_id = "job-e.g3.wA"
    del request.local_ranks[:]
    request.local_ranks.append(0)
    return Case(request, "wA", ("h",), case.settings, rank=0)


def d2_threads() -> Case:
    """D2 with two threads, gradient checkpointing, loader processes and the job's own code."""
    request = W.StartTaskRequest(
        task_id="job-d.g1.wA",
        job_id="job-d",
        spec=_spec(
            determinism=C.DETERMINISM_LEVEL_D2,
            checkpoint_every_steps=7,
            plan_dimensions=C.PlanDimensions(threads=True, gradient_checkpointing=True),
            **{"entrypoint.code_sha256": "ab" * 32},
        ),
        placement=_placement([("wA", 0, [0, 1]), ("wA", 1, [2, 3])]),
        local_ranks=[0, 1],
        rendezvous_address="127.0.0.1:29501",
        checkpoint_dir="/w/ckpt/job-d",
        plan=C.ExecutionPlan(threads_per_process=2, gradient_checkpointing=True),
        loader_procs_per_process=2,
        profile_rubick=True,
        endpoints=W.ServiceEndpoints(brain="10.0.0.9:7001"),
    )
    settings = CommandSettings(python="py", checkpoint_every=11, process_group_timeout=30.0)
    return Case(request, "wA", ("cpu", "cpu"), settings, rank=0, code_dir=CODE_DIR)


def background() -> Case:
    """A background task collocated with job-f on the same devices."""
    request = W.StartTaskRequest(
        task_id="job-b.g2.wA",
        job_id="job-b",
        spec=_spec(num_ests=2, global_batch_size=8),
        placement=_placement([("wA", 0, [0]), ("wA", 1, [1])]),
        local_ranks=[0, 1],
        rendezvous_address="127.0.0.1:29502",
        checkpoint_dir="/w/ckpt/job-b",
        collocation=C.Collocation(role=C.COLLOCATION_ROLE_BACKGROUND, partner_job_id="job-f"),
    )
    settings = CommandSettings(python="py", report_interval=2.5)
    return Case(request, "wA", ("cpu", "cpu"), settings, rank=1)


def dynamic() -> Case:
    """Dynamic data from the shard manager, fenced by its generation, logged for tests."""
    request = W.StartTaskRequest(
        task_id="job-y.g7.wA",
        job_id="job-y",
        spec=_spec(**{"dataset.mode": C.DATA_MODE_DYNAMIC, "epochs": 2}),
        placement=_placement([("wA", 0, [0, 1, 2, 3])]),
        local_ranks=[0],
        checkpoint_dir="/w/ckpt/job-y",
        endpoints=W.ServiceEndpoints(shard_manager="10.0.0.9:7002"),
        generation=7,
    )
    settings = CommandSettings(
        python="py", step_delay=0.25, index_log_dir=Path("/w/index"), zygote=False
    )
    return Case(request, "wA", ("cpu",), settings, rank=0)


CASES = {
    "elastic": elastic,
    "elastic_rank0": elastic_rank0,
    "d2_threads": d2_threads,
    "background": background,
    "dynamic": dynamic,
}
