"""The line `gearshift jobs` / `job` / `cluster` print on stderr when a standby scheduler
answered (Client.standby_leader; seen through a real standby in test_standby.py)."""

from __future__ import annotations

from gearshift.client.render import standby_note


def test_the_note_names_the_leader_or_says_none_is_known() -> None:
    line = standby_note("10.0.0.7:50051")
    assert "answered by a standby scheduler" in line
    assert line.endswith("the leader is 10.0.0.7:50051")
    assert "\n" not in line
    assert standby_note("").endswith("no leader is known yet (a takeover)")
