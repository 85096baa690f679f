"""Lua script replies are read by name: a reply that does not match the fields its script
declares for its status fails loudly, naming the script and the field (no Redis needed)."""

from __future__ import annotations

from typing import Any

import pytest

from gearshift.common.errors import InternalError
from gearshift.shardmanager import lua
from gearshift.shardmanager.store import SCRIPTS, Script

RENEW = Script("renew", lua.RENEW, lua.RENEW_REPLIES)


def test_a_reply_is_read_by_name_in_any_order() -> None:
    raw = [b"lost", b"3,5", b"status", b"OK", b"deadline_ms", b"9", b"renewed", 2]
    reply = RENEW.decode(raw)
    assert reply.status == "OK"
    assert (reply.number("renewed"), reply.number("deadline_ms")) == (2, 9)
    assert reply.ids("lost") == (3, 5)
    assert RENEW.decode([b"status", b"MODE", b"mode", b"deterministic"])["mode"] == "deterministic"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (["status", "OK", "renewed", "2", "lost", ""],
         "Lua script 'renew' replied OK without field 'deadline_ms'"),
        (["status", "OK", "renewed", "2", "deadline_ms", "9", "lost", "", "epoch", "0"],
         "Lua script 'renew' replied OK with unknown field 'epoch'"),
        (["status", "GRANTED"], "Lua script 'renew' replied unknown status 'GRANTED'"),
        (["renewed", "2"], "Lua script 'renew' replied without field 'status'"),
        (["status", "OK", "renewed"], "Lua script 'renew' replied .* not name/value pairs"),
        (1, "Lua script 'renew' replied 1, not name/value pairs"),
        (["status", "NOTFOUND", "status", "NOTFOUND"], "Lua script 'renew' replied a field twice"),
    ],
)  # fmt: skip
def test_a_reply_off_its_declared_fields_fails_naming_script_and_field(
    raw: Any, message: str
) -> None:
    with pytest.raises(InternalError, match=message):
        RENEW.decode(raw)


def test_reading_a_field_the_status_does_not_carry_is_an_error() -> None:
    reply = RENEW.decode(["status", "NOTFOUND"])
    message = "Lua script 'renew': reply NOTFOUND has no field 'lost'"
    with pytest.raises(InternalError, match=message):
        reply["lost"]


def test_every_script_declares_its_replies_with_a_status_field_name_free_of_clashes() -> None:
    for script in SCRIPTS:
        assert script.replies, script.name
        for status, names in script.replies.items():
            assert status.isupper() and "status" not in names, (script.name, status)
