"""The contracts: generated code is fresh, every element is documented, enums start UNSPECIFIED."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from gearshift.common.channel import idempotent_methods
from tools.gen_protos import PROTO_DIR, descriptor_set, generate, generated_files

# Field numbers in descriptor.proto, used to address elements in SourceCodeInfo paths.
MESSAGE, ENUM, SERVICE = 4, 5, 6
FIELD, NESTED, VALUE, METHOD = 2, 3, 2, 2


def _stale_files(generated_root: Path) -> list[str]:
    fresh = {p.name: p.read_bytes() for p in generate(generated_root)}
    committed = {p.name: p.read_bytes() for p in generated_files(PROTO_DIR)}
    names = set(fresh) | set(committed)
    return sorted(n for n in names if fresh.get(n) != committed.get(n))


def test_committed_generated_code_is_fresh(tmp_path: Path) -> None:
    stale = _stale_files(tmp_path)
    assert not stale, f"run `make protos`: stale generated files {stale}"


def test_staleness_check_catches_an_edited_proto(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    protos = tmp_path / "protos"
    shutil.copytree(PROTO_DIR.parent.parent, protos)
    edited = protos / "gearshift" / "v1" / "worker.proto"
    edited.write_text(
        edited.read_text().replace(
            "string task_id = 1;", "string task_id = 1;\n  int32 extra = 99;", 1
        )
    )
    import tools.gen_protos as gen

    monkeypatch.setattr(gen, "PROTO_ROOT", protos)
    monkeypatch.setattr(gen, "PROTO_DIR", protos / "gearshift" / "v1")
    fresh = {p.name: p.read_bytes() for p in gen.generate(tmp_path / "out")}
    committed = {p.name: p.read_bytes() for p in generated_files(PROTO_DIR)}
    assert fresh["worker_pb2.py"] != committed["worker_pb2.py"]


def _undocumented(file: descriptor_pb2.FileDescriptorProto) -> list[str]:
    comments = {
        tuple(loc.path): loc.leading_comments.strip() for loc in file.source_code_info.location
    }
    missing: list[str] = []

    def need(path: tuple[int, ...], name: str) -> None:
        if not comments.get(path):
            missing.append(f"{file.name}: {name}")

    def message(msg: descriptor_pb2.DescriptorProto, path: tuple[int, ...], prefix: str) -> None:
        if msg.options.map_entry:
            return
        need(path, prefix + msg.name)
        for j, field in enumerate(msg.field):
            need((*path, FIELD, j), f"{prefix}{msg.name}.{field.name}")
        for k, nested in enumerate(msg.nested_type):
            message(nested, (*path, NESTED, k), f"{prefix}{msg.name}.")

    for i, msg in enumerate(file.message_type):
        message(msg, (MESSAGE, i), "")
    for i, enum in enumerate(file.enum_type):
        need((ENUM, i), enum.name)
        for j, value in enumerate(enum.value):
            need((ENUM, i, VALUE, j), f"{enum.name}.{value.name}")
    for i, service in enumerate(file.service):
        need((SERVICE, i), service.name)
        for j, method in enumerate(service.method):
            need((SERVICE, i, METHOD, j), f"{service.name}.{method.name}")
    return missing


def test_every_message_field_enum_and_rpc_is_documented() -> None:
    missing = [
        m
        for f in descriptor_set().file
        if f.name.startswith("gearshift/")
        for m in _undocumented(f)
    ]
    assert not missing, "undocumented:\n" + "\n".join(missing)


def test_every_enum_starts_with_unspecified_zero() -> None:
    for file in descriptor_set().file:
        if not file.name.startswith("gearshift/"):
            continue
        enums = list(file.enum_type) + [e for m in file.message_type for e in m.enum_type]
        for enum in enums:
            first = enum.value[0]
            assert first.number == 0 and first.name.endswith("_UNSPECIFIED"), enum.name


def test_contracts_cover_the_designed_rpc_surface() -> None:
    services = {
        s.name: {m.name for m in s.method} for f in descriptor_set().file for s in f.service
    }
    assert {
        "SubmitJob",
        "GetJob",
        "ListJobs",
        "CancelJob",
        "WatchJob",
        "GetClusterState",
    } <= services["JobService"]
    assert {"RegisterWorker", "Heartbeat", "RenewLease", "TaskFinished"} <= services[
        "WorkerRegistry"
    ]
    assert {
        "ReportSamples",
        "GetJobHistory",
        "EstimateThroughput",
        "PlanResources",
        "PlanEsts",
        "StoreLayerProfile",
        "GetLayerProfile",
        "PlanBurstParallel",
    } <= services["Brain"]
    assert {
        "CreateDataset",
        "AcquireShard",
        "AckShard",
        "CheckpointDataset",
        "RestoreDataset",
    } <= services["ShardManager"]
    assert {"StartTask", "StopTask", "GetTaskStatus"} <= services["WorkerAgent"]


def test_job_spec_carries_what_a_job_needs() -> None:
    from gearshift.v1 import common_pb2

    fields = set(common_pb2.JobSpec.DESCRIPTOR.fields_by_name)
    assert {
        "name",
        "tenant",
        "entrypoint",
        "num_ests",
        "global_batch_size",
        "total_steps",
        "epochs",
        "dataset",
        "determinism",
        "elastic",
        "accelerator_types",
        "priority_weight",
        "slo",
        "service_class",
    } <= fields


def test_idempotent_option_drives_retries() -> None:
    methods = dict.fromkeys(idempotent_methods())
    assert ("gearshift.v1.JobService", "GetJob") in methods
    assert ("gearshift.v1.JobService", "SubmitJob") in methods  # safe thanks to its key
    assert ("gearshift.v1.ShardManager", "AcquireShard") not in methods
    assert ("gearshift.v1.JobService", "WatchJob") not in methods
