"""The scheduler's calls to worker daemons (WorkerAgents) over real gRPC, against in-process
WorkerAgent servers: a round's calls are all in flight at once without a thread each, and
each answer or error comes back in its call's place."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from gearshift.common.ports import free_port_in
from gearshift.scheduler.round.workers import WorkerAgents
from gearshift.v1 import common_pb2, worker_pb2, worker_pb2_grpc

C = common_pb2
CALLS = 40  # more than the scheduler's pool of 16 threads that used to make them
WAIT = 20.0
SERVER_THREADS = "agent-server"


class GatheringAgent(worker_pb2_grpc.WorkerAgentServicer):
    """Answers StartTask only once `parties` calls are in the servers together; counts the
    threads other than the servers' own at that moment."""

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, action=self._count, timeout=WAIT)
        self.client_threads = 0

    def _count(self) -> None:
        self.client_threads = client_threads()

    def StartTask(
        self, request: worker_pb2.StartTaskRequest, context: grpc.ServicerContext
    ) -> C.TaskStatus:
        if request.task_id.startswith("bad"):
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"no such entrypoint in {request.task_id}"
            )
        self._meet(context)
        return C.TaskStatus(task_id=request.task_id, state=C.TASK_STATE_RUNNING)

    def StopTask(
        self, request: worker_pb2.StopTaskRequest, context: grpc.ServicerContext
    ) -> C.TaskStatus:
        self._meet(context)
        return C.TaskStatus(task_id=request.task_id, state=C.TASK_STATE_CHECKPOINTED)

    def _meet(self, context: grpc.ServicerContext) -> None:
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the other calls never came")


@pytest.fixture
def agents() -> Iterator[WorkerAgents]:
    out = WorkerAgents(timeout=WAIT)
    yield out
    out.close()


def client_threads() -> int:
    return sum(not t.name.startswith(SERVER_THREADS) for t in threading.enumerate())


def serve(agent: GatheringAgent) -> tuple[grpc.Server, str]:
    pool = futures.ThreadPoolExecutor(max_workers=CALLS + 4, thread_name_prefix=SERVER_THREADS)
    server = grpc.server(pool)
    worker_pb2_grpc.add_WorkerAgentServicer_to_server(agent, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    return server, address


def test_a_rounds_calls_are_all_in_flight_at_once_from_one_thread(agents: WorkerAgents) -> None:
    """40 StartTask calls to two workers meet in the servers before any is answered, and
    then 40 StopTask calls: all were sent before the first answer was awaited, from the
    calling thread, without a thread per call (with one, the round's 16-thread pool let
    16 in at a time and the barrier broke)."""
    agent = GatheringAgent(CALLS)  # type: ignore[abstract]  # the rest: UNIMPLEMENTED
    first, one = serve(agent)
    second, two = serve(agent)
    try:
        addresses = [one if i % 2 else two for i in range(CALLS)]
        threads = client_threads()
        started = agents.start_all(
            [(a, worker_pb2.StartTaskRequest(task_id=f"t{i}")) for i, a in enumerate(addresses)]
        )
        assert [a.task_id for a in started if isinstance(a, C.TaskStatus)] == [
            f"t{i}" for i in range(CALLS)
        ], started
        # gRPC's own: at most a thread per channel to wait for the answers
        assert agent.client_threads - threads <= 2, f"{agent.client_threads - threads} threads"
        stopped = agents.stop_all(
            [
                (a, worker_pb2.StopTaskRequest(task_id=f"t{i}", checkpoint=True))
                for i, a in enumerate(addresses)
            ]
        )
        assert [a.state for a in stopped if isinstance(a, C.TaskStatus)] == [
            C.TASK_STATE_CHECKPOINTED
        ] * CALLS, stopped
        assert agent.client_threads - threads <= 2, f"{agent.client_threads - threads} threads"
    finally:
        first.stop(None)
        second.stop(None)


def test_each_answer_or_error_comes_back_in_its_calls_place(agents: WorkerAgents) -> None:
    """A refused request and a worker that cannot be reached fail only their own calls, as
    gRPC errors with their codes; the others are answered."""
    agent = GatheringAgent(2)  # type: ignore[abstract]
    server, address = serve(agent)
    gone = f"127.0.0.1:{free_port_in(20000, 30000)}"
    try:
        answers = agents.start_all(
            [
                (address, worker_pb2.StartTaskRequest(task_id="a")),
                (gone, worker_pb2.StartTaskRequest(task_id="lost")),
                (address, worker_pb2.StartTaskRequest(task_id="bad-spec")),
                (address, worker_pb2.StartTaskRequest(task_id="b")),
            ]
        )
    finally:
        server.stop(None)
    ok, lost, bad, other = answers
    assert isinstance(ok, C.TaskStatus) and ok.task_id == "a"
    assert isinstance(other, C.TaskStatus) and other.task_id == "b"
    assert isinstance(lost, grpc.RpcError) and lost.code() == grpc.StatusCode.UNAVAILABLE
    assert isinstance(bad, grpc.RpcError) and bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "bad-spec" in (bad.details() or "")


def test_calls_to_many_workers_wake_no_thread_per_worker(agents: WorkerAgents) -> None:
    """40 StartTask calls to 40 workers (40 addresses, 40 channels) meet in the server with
    at most two threads of the client's more than before: its calls' event loop and gRPC's
    own. A plain channel's futures were answered on a thread per channel: a round's
    hundreds of starts woke hundreds of threads, each waiting for the interpreter."""
    agent = GatheringAgent(CALLS)  # type: ignore[abstract]
    pool = futures.ThreadPoolExecutor(max_workers=CALLS + 4, thread_name_prefix=SERVER_THREADS)
    server = grpc.server(pool)
    worker_pb2_grpc.add_WorkerAgentServicer_to_server(agent, server)
    port = server.add_insecure_port("0.0.0.0:0")  # every 127.x.y.z of this host reaches it
    server.start()
    try:
        threads = client_threads()
        started = agents.start_all(
            [
                (f"127.0.0.{i + 2}:{port}", worker_pb2.StartTaskRequest(task_id=f"t{i}"))
                for i in range(CALLS)
            ]
        )
        assert [a.task_id for a in started if isinstance(a, C.TaskStatus)] == [
            f"t{i}" for i in range(CALLS)
        ], started
        assert agent.client_threads - threads <= 2, f"{agent.client_threads - threads} threads"
    finally:
        server.stop(None)


def test_a_closed_agents_answers_each_call_with_an_error() -> None:
    agents = WorkerAgents(timeout=WAIT)
    agents.close()
    (answer,) = agents.start_all([("127.0.0.1:1", worker_pb2.StartTaskRequest(task_id="t"))])
    assert isinstance(answer, RuntimeError) and "closed" in str(answer)
