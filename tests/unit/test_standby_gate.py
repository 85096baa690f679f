"""The standby's table of reads (api/standby.py) against the contracts, and what a
standby's metadata says to a client (gearshift.common.leader_follow)."""

from __future__ import annotations

from gearshift.common.leader_follow import refusal_trailers, standby_leader, standby_metadata
from gearshift.scheduler.api.standby import STANDBY_SERVES, refusal
from gearshift.v1 import scheduler_pb2


def _methods() -> set[str]:
    return {
        f"/{service.full_name}/{method.name}"
        for service in scheduler_pb2.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }


def test_the_standby_serves_only_rpcs_that_exist_and_no_write() -> None:
    assert STANDBY_SERVES.issubset(_methods())  # a renamed read would be refused: fail here
    writes = {"SubmitJob", "CancelJob", "ScaleJob", "RegisterWorker", "Heartbeat", "RenewLease"}
    writes |= {"TaskFinished", "HeartbeatBatch"}
    assert not {m.rpartition("/")[2] for m in STANDBY_SERVES} & writes


def test_a_standby_names_the_leader_and_only_a_standby_does() -> None:
    assert standby_leader(standby_metadata("10.0.0.1:50051")) == "10.0.0.1:50051"
    assert standby_leader(refusal_trailers("")) == ""  # a standby that knows no leader
    assert standby_leader((("gearshift-leader", "10.0.0.1:50051"),)) is None
    assert standby_leader(None) is None
    assert "the leader serves at 10.0.0.1:50051" in refusal("/x.S/SubmitJob", "10.0.0.1:50051")
    assert refusal("/x.S/SubmitJob", "").startswith("SubmitJob: this scheduler is a standby")
