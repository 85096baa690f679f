"""Which interface gloo and TensorPipe bind to (runtime/interface.py): the one whose
address routes to the rendezvous host; none chosen on one machine, and a user's choice
kept. (Across real network namespaces: tests/e2e/test_multi_host.py.)"""

from __future__ import annotations

from gearshift.worker.runtime.interface import (
    GLOO_IFNAME,
    TENSORPIPE_IFNAME,
    interface_addresses,
    interface_toward,
    set_interface,
)


def test_loopback_is_listed_and_a_local_rendezvous_keeps_the_default() -> None:
    assert interface_addresses()["lo"] == "127.0.0.1"
    assert interface_toward("127.0.0.1:29500") is None
    env: dict[str, str] = {}
    assert set_interface("127.0.0.1:29500", GLOO_IFNAME, env) == "" and env == {}


def test_a_users_choice_wins_and_an_unknown_host_changes_nothing() -> None:
    env = {TENSORPIPE_IFNAME: "eth7"}
    assert set_interface("10.1.2.3:29500", TENSORPIPE_IFNAME, env) == "eth7"
    assert env == {TENSORPIPE_IFNAME: "eth7"}
    assert interface_toward("no-such-host.invalid:1") is None
