"""The GearshiftJob CRD (generated from the JobSpec descriptor) and the operator's plain
functions: status from a Job, conditions, events, code from a ConfigMap."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

from gearshift.client.operator.code import code_source, write_code
from gearshift.client.operator.status import (
    CONDITION_TYPES,
    condition,
    event_record,
    job_conditions,
    job_status,
    merge_conditions,
)
from gearshift.client.spec import spec_from_dict
from gearshift.common.errors import ValidationError
from gearshift.v1 import common_pb2, scheduler_pb2
from tools import crd
from tools.reference.jobspec import leaves

JOB = {
    "name": "digits",
    "entrypoint": {"module": "train", "config": {"lr": 0.05}},
    "num_ests": 4,
    "global_batch_size": 64,
    "total_steps": 300,
    "dataset": {"name": "digits", "size": 1797, "shard_size": 32, "mode": "deterministic"},
    "determinism": "d1",
    "service_class": "guaranteed",
    "elastic": {"min_devices": 1, "max_devices": 4},
    "labels": {"team": "a"},
    "code": {"configMap": "train-code"},
}


def _schema(part: str) -> dict[str, Any]:
    version = crd.crd()["spec"]["versions"][0]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"][part]
    return schema


def test_the_crd_file_is_current() -> None:
    for path in crd.PATHS:  # deploy/crds/ and the Helm chart's crds/
        assert path.read_text() == crd.render(), f"{path}: run `make reference`"


def test_every_job_spec_field_is_in_the_schema() -> None:
    spec = _schema("spec")
    for key, _field in leaves(common_pb2.JobSpec.DESCRIPTOR):
        node = spec
        for part in key.split("."):
            node = node.get("items", node)["properties"][part]
        assert node.get("description"), f"{key} has no description"


def test_a_job_file_validates_against_the_schema_and_the_spec() -> None:
    jsonschema.validate(JOB, _schema("spec"))
    parsed = spec_from_dict({k: v for k, v in JOB.items() if k != "code"})
    assert parsed.service_class == common_pb2.SERVICE_CLASS_GUARANTEED


@pytest.mark.parametrize(
    ("change", "word"),
    [
        ({"num_ests": "four"}, "integer"),
        ({"service_class": "gold"}, "gold"),
        ({"labels": {"team": 1}}, "string"),
    ],
)
def test_the_schema_refuses_a_bad_type(change: dict[str, Any], word: str) -> None:
    with pytest.raises(jsonschema.ValidationError, match=word):
        jsonschema.validate({**JOB, **change}, _schema("spec"))


def test_oneof_length_is_a_cel_rule_and_columns_read_status() -> None:
    rules = _schema("spec")["x-kubernetes-validations"]
    assert rules[0]["message"] == "give at most one of total_steps, epochs"
    version = yaml.safe_load(crd.PATH.read_text())["spec"]["versions"][0]
    status = _schema("status")["properties"]
    for column in version["additionalPrinterColumns"]:
        head, _, key = column["jsonPath"].lstrip(".").partition(".")
        assert head == "metadata" or key in status, column


def _job() -> scheduler_pb2.Job:
    job = scheduler_pb2.Job(
        job_id="job-1",
        state=common_pb2.JOB_STATE_RUNNING,
        queue_position=0,
        progress=common_pb2.JobProgress(step=3, total_steps=10, samples_per_second=12.34),
    )
    for rank, kind in enumerate(["v100", "t4", "v100"]):
        job.placement.processes.add(rank=rank, accelerator_type=kind, est_ids=[rank])
    return job


def test_status_reads_like_gearshift_jobs() -> None:
    status = job_status(_job())
    assert status["state"] == "running"
    assert status["progress"] == "3/10"
    assert status["devicesByType"] == {"t4": 1, "v100": 2}
    assert status["devices"] == "t4x1 v100x2"
    assert status["estsPerDevice"] == "1,1,1"
    assert status["samplesPerSecond"] == "12.3"
    waiting = scheduler_pb2.Job(
        job_id="job-2",
        state=common_pb2.JOB_STATE_QUEUED,
        queue_position=3,
        reason=scheduler_pb2.JobReason(code="no_free_device", message="no free v100"),
    )
    status = job_status(waiting)
    assert (status["queuePosition"], status["reason"], status["devices"]) == (
        3,
        "no_free_device",
        "-",
    )
    running = {c["type"]: c for c in job_conditions(waiting)}["Running"]
    assert (running["status"], running["message"]) == ("False", "no free v100")


def test_a_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    first = merge_conditions([], [condition("Running", False, "Queued")], "t0")
    held = merge_conditions(first, [condition("Running", False, "Queued", "still")], "t1")
    assert held[0]["lastTransitionTime"] == "t0"
    changed = merge_conditions(
        held, [condition("Running", True, "Running"), condition("Valid", True, "Valid")], "t2"
    )
    assert [c["type"] for c in changed] == ["Valid", "Running"]
    assert changed[1]["lastTransitionTime"] == "t2"
    assert set(CONDITION_TYPES) >= {c["type"] for c in changed}


def test_events_become_kubernetes_events() -> None:
    failed = scheduler_pb2.JobEvent(
        sequence=7, type=scheduler_pb2.JOB_EVENT_TYPE_FAILED, message="OOM"
    )
    assert event_record(failed) == ("Warning", "Failed", "[7] OOM")
    fresh = scheduler_pb2.JobEvent(sequence=2, type=scheduler_pb2.JOB_EVENT_TYPE_STARTED_FRESH)
    kind, reason, _ = event_record(fresh)
    assert (kind, reason) == ("Normal", "StartedFresh")


def test_code_from_a_configmap(tmp_path: Path) -> None:
    assert code_source({}) is None
    assert code_source({"code": {"configMap": "c"}}) == "c"
    with pytest.raises(ValidationError, match=r"spec\.code\.image"):
        code_source({"code": {"image": "x"}})
    configmap = {
        "metadata": {"name": "c"},
        "data": {"train.py": "x = 1\n"},
        "binaryData": {"weights.bin": base64.b64encode(b"\x00\x01").decode()},
    }
    written = write_code(configmap, tmp_path)
    assert [p.name for p in written] == ["train.py", "weights.bin"]
    assert (tmp_path / "weights.bin").read_bytes() == b"\x00\x01"
    with pytest.raises(ValidationError, match="has no data"):
        write_code({"metadata": {"name": "c"}}, tmp_path)
    with pytest.raises(ValidationError, match="not base64"):
        write_code({"metadata": {"name": "c"}, "binaryData": {"a": "%%"}}, tmp_path)
