"""Which of a PS job's processes each of its launchers runs, when the job holds several
worker slots (ParameterServerSpec.slots): a plain function, without torch, for the
worker daemon that writes the launchers' command lines.

The processes, in order PS 0.. then worker 0.., go round-robin over the placement's
ranks: process k runs with rank k mod world. A launcher runs the processes of its task's
ranks; the task with rank 0 serves the TCP store they meet through (its worker's host
is the placement's rendezvous host) and publishes the checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterable


def spread_roles(
    num_ps: int, num_workers: int, world: int, ranks: Iterable[int]
) -> list[tuple[str, int]]:
    """The (role, index) of the processes that run on `ranks` of a `world` of slots."""
    if world < 1:
        raise ValueError(f"a PS job's placement needs at least 1 rank, got {world}")
    mine = set(ranks)
    processes = [("ps", i) for i in range(num_ps)] + [("worker", i) for i in range(num_workers)]
    return [p for k, p in enumerate(processes) if k % world in mine]


def format_roles(roles: Iterable[tuple[str, int]]) -> str:
    """--roles' form: 'ps:0,worker:1' ('' for none)."""
    return ",".join(f"{role}:{index}" for role, index in roles)
