"""The scheduler as the daemon wires it, in one process: an in-memory store, simulated worker
daemons and a manual clock (for tests of the round that need no gRPC)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gearshift.scheduler.round.brain import BrainAdvisor
from gearshift.scheduler.round.workers import WorkerAgents
from gearshift.scheduler.service import Scheduler, SchedulerSettings
from gearshift.scheduler.state.memory_store import MemoryStore
from gearshift.scheduler.state.store import Store
from gearshift.scheduler.types import Allocator
from gearshift.v1 import common_pb2, worker_pb2


class SimulatedAgents(WorkerAgents):
    """Worker daemons that start and checkpoint at once, and remember what they were told."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[worker_pb2.StartTaskRequest] = []
        self.stopped: list[tuple[str, bool]] = []  # (task id, checkpoint)
        self.changed: list[worker_pb2.ChangeMembershipRequest] = []

    def start_all(
        self, calls: Sequence[tuple[str, worker_pb2.StartTaskRequest]]
    ) -> list[common_pb2.TaskStatus | Exception]:
        """Each call in turn, through `start` (which tests override)."""
        return [_answer(self.start, address, request) for address, request in calls]

    def stop_all(
        self, calls: Sequence[tuple[str, worker_pb2.StopTaskRequest]]
    ) -> list[common_pb2.TaskStatus | Exception]:
        """Each call in turn, through `stop` (which tests override)."""
        return [_answer(self._stop, address, request) for address, request in calls]

    def change_all(
        self, calls: Sequence[tuple[str, worker_pb2.ChangeMembershipRequest]]
    ) -> list[common_pb2.TaskStatus | Exception]:
        """Each call in turn, through `change` (which tests override)."""
        return [_answer(self.change, address, request) for address, request in calls]

    def change(
        self, address: str, request: worker_pb2.ChangeMembershipRequest
    ) -> common_pb2.TaskStatus:
        self.changed.append(request)
        return common_pb2.TaskStatus(task_id=request.task_id, state=common_pb2.TASK_STATE_RUNNING)

    def _stop(self, address: str, r: worker_pb2.StopTaskRequest) -> common_pb2.TaskStatus:
        return self.stop(
            address, r.task_id, checkpoint=r.checkpoint, reason=r.reason, timeout=r.timeout_seconds
        )

    def start(self, address: str, request: worker_pb2.StartTaskRequest) -> common_pb2.TaskStatus:
        self.started.append(request)
        return common_pb2.TaskStatus(
            task_id=request.task_id, job_id=request.job_id, state=common_pb2.TASK_STATE_RUNNING
        )

    def stop(
        self, address: str, task_id: str, *, checkpoint: bool, reason: str, timeout: float
    ) -> common_pb2.TaskStatus:
        self.stopped.append((task_id, checkpoint))
        return common_pb2.TaskStatus(
            task_id=task_id, state=common_pb2.TASK_STATE_CHECKPOINTED, checkpoint_path="/ckpt"
        )


def _answer(
    call: Callable[[str, Any], common_pb2.TaskStatus], address: str, request: Any
) -> common_pb2.TaskStatus | Exception:
    try:
        return call(address, request)
    except Exception as exc:
        return exc


class Clock:
    """A clock the test moves."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class TableBrain(BrainAdvisor):
    """A Brain that answers EstimateThroughput from a function (global steps/s)."""

    def __init__(self, estimate: Callable[[str, str, int], float]) -> None:
        super().__init__("table")
        self.estimate = estimate
        self.asked = 0

    def throughput(self, job_id: str, model_type: str, worker_type: str, count: int) -> float:
        self.asked += 1
        return self.estimate(job_id, worker_type, count)

    def report_event(self, *args: object, **kwargs: object) -> None:
        return None


def make_scheduler(
    settings: SchedulerSettings,
    *,
    clock: Clock,
    brain: BrainAdvisor | None = None,
    allocator: Allocator | None = None,
    store: Store | None = None,
    agents: SimulatedAgents | None = None,
) -> tuple[Scheduler, SimulatedAgents]:
    agents = agents or SimulatedAgents()
    scheduler = Scheduler(
        store or MemoryStore(),
        settings,
        agents=agents,
        brain=brain or BrainAdvisor(),
        clock=clock,
        allocator=allocator,
    )
    return scheduler, agents


def register(scheduler: Scheduler, worker_id: str, groups: Mapping[str, int]) -> None:
    scheduler.register_worker(
        worker_id,
        f"127.0.0.1:{abs(hash(worker_id)) % 50000 + 1000}",
        "test",
        [common_pb2.DeviceGroup(accelerator_type=t, count=n) for t, n in groups.items()],
        [],
    )


def job_spec(name: str, ests: int, **fields: object) -> common_pb2.JobSpec:
    spec = common_pb2.JobSpec(
        name=name,
        entrypoint=common_pb2.Entrypoint(module="gearshift.examples.mlp"),
        model_type=name,
        num_ests=ests,
        global_batch_size=8 * ests,
        total_steps=1000,
        dataset=common_pb2.DatasetSpec(name="d", size=100, shard_size=10),
        elastic=common_pb2.ElasticBounds(min_devices=1, max_devices=ests),
    )
    for key, value in fields.items():
        if key == "accelerator_types":
            spec.accelerator_types.extend(value)  # type: ignore[arg-type]
        else:
            setattr(spec, key, value)
    return spec
