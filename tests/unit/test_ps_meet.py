"""A PS phase's meeting across hosts (meet.py): its flags, and the TCP store the
coordinator serves, reached through the scheme rpc.init_rpc is given."""

from __future__ import annotations

import pytest
from torch.distributed.rendezvous import rendezvous

from gearshift.common.ports import free_port_in
from gearshift.worker.ps.meet import Meeting, check_roles, init_method, parse_roles, serve_store
from gearshift.worker.ps.spread import format_roles, spread_roles


def test_roles_parse_and_name_a_bad_item() -> None:
    assert parse_roles("ps:0, worker:1") == {("ps", 0), ("worker", 1)}
    with pytest.raises(ValueError, match="'chief:0' is not ps:N or worker:N"):
        parse_roles("ps:0,chief:0")
    with pytest.raises(ValueError, match="worker:2 not in a phase of 2x2"):
        check_roles({("ps", 1), ("worker", 2)}, 2, 2)


def test_a_spread_job_s_processes_go_round_robin_over_its_ranks() -> None:
    # 2 PS x 1 worker over 2 slots: PS 0 and the worker on rank 0, PS 1 on rank 1.
    assert spread_roles(2, 1, 2, [0]) == [("ps", 0), ("worker", 0)]
    assert spread_roles(2, 1, 2, [1]) == [("ps", 1)]
    assert spread_roles(1, 1, 2, [0, 1]) == [("ps", 0), ("worker", 0)]  # a task of both
    assert spread_roles(1, 1, 3, [2]) == []  # a slot no process reaches
    assert parse_roles(format_roles(spread_roles(2, 2, 2, [1]))) == {("ps", 1), ("worker", 1)}
    assert parse_roles(format_roles([])) == frozenset()
    with pytest.raises(ValueError, match="at least 1 rank"):
        spread_roles(1, 1, 0, [])


def test_a_meeting_needs_host_and_port() -> None:
    with pytest.raises(ValueError, match=r"HOST:PORT, got '10\.0\.0\.1'"):
        Meeting("10.0.0.1", serve=True)
    meeting = Meeting("10.231.0.11:29555", serve=False, roles=parse_roles("ps:1"))
    assert (meeting.host, meeting.port) == ("10.231.0.11", 29555)
    assert meeting.runs("ps", 1) and not meeting.runs("ps", 0)
    assert Meeting("h:1", serve=True).runs("worker", 7)  # no roles: every process


def test_processes_meet_in_the_coordinators_store_under_their_generation() -> None:
    meeting = Meeting(f"127.0.0.1:{free_port_in(20000, 29000)}", serve=True)
    served = serve_store(meeting, timeout_s=10)
    store, rank, world = next(rendezvous(init_method(meeting, 3), rank=1, world_size=2))
    assert (rank, world) == (1, 2)
    store.set("seen", "yes")
    assert served.get("g3/seen") == b"yes"  # keys of one phase cannot meet another's
