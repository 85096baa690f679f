"""The leader fence at the worker (worker/fence.py) and the scheduler address lists."""

from __future__ import annotations

import pytest

from gearshift.common.channel import channel_target
from gearshift.common.errors import PreconditionError, ValidationError
from gearshift.worker.fence import EpochFence, admits


def test_the_rule_admits_the_newest_leader_and_refuses_an_older_one() -> None:
    assert admits(0, 0)  # a scheduler without an election, before any elected one
    assert admits(3, 3) and admits(3, 4)
    assert not admits(3, 2)
    assert not admits(1, 0)  # once an elected leader is seen, an unelected one is refused


def test_a_worker_refuses_calls_of_a_deposed_leader() -> None:
    fence = EpochFence()
    fence.admit(1, "StartTask")
    fence.admit(2, "StopTask")  # the new leader: it becomes the one obeyed
    assert fence.seen == 2
    with pytest.raises(PreconditionError, match=r"StartTask refused: leader epoch 1 .* epoch 2"):
        fence.admit(1, "StartTask")
    assert fence.seen == 2
    with pytest.raises(PreconditionError, match="epoch must be >= 0"):
        fence.admit(-1, "StopTask")


def test_an_old_leaders_lease_answer_is_ignored() -> None:
    fence = EpochFence()
    assert fence.current(4)
    assert not fence.current(3)
    assert fence.current(5) and fence.seen == 5


def test_several_scheduler_addresses_become_one_grpc_list() -> None:
    assert channel_target("sched:50051") == "sched:50051"
    assert channel_target("10.0.0.1:1, 10.0.0.2:2") == "ipv4:10.0.0.1:1,10.0.0.2:2"
    assert channel_target("[::1]:1,[::1]:2") == "ipv6:[::1]:1,[::1]:2"
    for bad in ("a:1,b:2", "10.0.0.1:1,[::1]:2", "10.0.0.1:1,", "10.0.0.1,10.0.0.2:2"):
        with pytest.raises(ValidationError, match="several addresses must be IP:PORT"):
            channel_target(bad)
