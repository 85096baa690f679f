"""deploy/crds/gearshiftjobs.gearshift.dev.yaml (and the Helm chart's crds/ copy): the GearshiftJob
CustomResourceDefinition.

Its spec schema is generated from the JobSpec descriptor, in the shape of a job file
(client/spec.py: snake_case keys, `entrypoint.config` a mapping, enums by short name),
with each field's proto comment as its description, so the CRD cannot drift from the
contract. `make reference` writes both; `--check` exits 1 when either is stale
(tests/unit/test_operator_crd.py runs the same comparison).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor

from gearshift.client.operator.status import CONDITION_TYPES, PRINTER_COLUMNS
from gearshift.client.spec import _ENUMS  # the short enum names a job file takes
from gearshift.v1 import common_pb2
from tools.reference.rpcs import contracts

ROOT = Path(__file__).resolve().parent.parent
PATH = ROOT / "deploy" / "crds" / "gearshiftjobs.gearshift.dev.yaml"
# The Helm chart's copy: Helm installs crds/ before the chart's templates.
CHART_PATH = ROOT / "deploy" / "helm" / "gearshift" / "crds" / PATH.name
PATHS = (PATH, CHART_PATH)
GROUP = "gearshift.dev"
VERSION = "v1alpha1"

_INTEGERS = {
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_SINT32: "int32",
    FieldDescriptor.TYPE_UINT32: "int32",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_SINT64: "int64",
    FieldDescriptor.TYPE_UINT64: "int64",
}
_NUMBERS = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT}
# Job-file keys that name local paths: meaningless in a cluster (code comes from `code`).
_LOCAL_ONLY = {"entrypoint.path", "working_dir"}


def _description(full_name: str) -> str:
    return " ".join(contracts().comments.get(full_name, "").split())


def _enum_names(key: str, enum: EnumDescriptor) -> list[str]:
    values = [v.name for v in enum.values if v.number]
    if key in _ENUMS:
        prefix = _ENUMS[key][0]
        return [v.removeprefix(prefix).lower() for v in values]
    return values


def _scalar(key: str, field: FieldDescriptor) -> dict[str, Any]:
    if field.enum_type is not None:
        return {"type": "string", "enum": _enum_names(key, field.enum_type)}
    if field.type in _INTEGERS:
        return {"type": "integer", "format": _INTEGERS[field.type]}
    if field.type in _NUMBERS:
        return {"type": "number"}
    if field.type == FieldDescriptor.TYPE_BOOL:
        return {"type": "boolean"}
    return {"type": "string"}


def _field(key: str, field: FieldDescriptor) -> dict[str, Any]:
    message = field.message_type
    if message is not None and message.GetOptions().map_entry:
        schema: dict[str, Any] = {
            "type": "object",
            "additionalProperties": _scalar(key, message.fields_by_name["value"]),
        }
    elif message is not None:
        schema = message_schema(message, key + ".")
    else:
        schema = _scalar(key, field)
    if field.is_repeated and not (message is not None and message.GetOptions().map_entry):
        schema = {"type": "array", "items": schema}
    text = _description(field.full_name)
    return {"description": text, **schema} if text else schema


def message_schema(descriptor: Descriptor, prefix: str = "") -> dict[str, Any]:
    """A message as an OpenAPI v3 object in a job file's shape."""
    properties: dict[str, Any] = {}
    for field in descriptor.fields:
        key = prefix + field.name
        if key in _LOCAL_ONLY:
            continue
        properties[field.name] = _field(key, field)
        if key == "entrypoint.config_json":
            properties["config"] = {
                "description": "The configuration as a mapping (sent as config_json); give "
                "config or config_json, not both.",
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
            }
    oneofs = [o for o in descriptor.oneofs if not o.name.startswith("_")]
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if oneofs:  # proto3 oneofs: at most one member set (the operator says which is missing)
        schema["x-kubernetes-validations"] = [
            {
                "rule": " + ".join(f"(has(self.{f.name}) ? 1 : 0)" for f in o.fields) + " <= 1",
                "message": "give at most one of " + ", ".join(f.name for f in o.fields),
            }
            for o in oneofs
        ]
    return schema


def spec_schema() -> dict[str, Any]:
    """The GearshiftJob's spec: a JobSpec in a job file's shape, plus where its code is."""
    schema = message_schema(common_pb2.JobSpec.DESCRIPTOR)
    schema["description"] = (
        "The job, as a job file writes it (docs/reference/jobspec.md), plus `code`."
    )
    schema["properties"]["code"] = {
        "description": "Where the job's own code is. Unset: entrypoint.module is importable "
        "in the worker image.",
        "type": "object",
        "properties": {
            "configMap": {
                "description": "A ConfigMap in the job's namespace, labelled "
                "gearshift.dev/code=true, whose keys are the files of the code folder.",
                "type": "string",
            }
        },
    }
    return schema


def status_schema() -> dict[str, Any]:
    """What the operator writes (gearshift.client.operator.status.job_status)."""
    string = {"type": "string"}
    integer = {"type": "integer", "format": "int64"}
    return {
        "type": "object",
        "description": "The job as the scheduler reports it, mirrored by the operator.",
        "properties": {
            "jobId": {**string, "description": "The scheduler's job id."},
            "state": {
                **string,
                "description": "queued, running, rescaling, succeeded, failed or cancelled.",
            },
            "step": {**integer, "description": "Global steps done."},
            "totalSteps": {**integer, "description": "Global steps in total."},
            "progress": {**string, "description": "step/totalSteps, as `gearshift jobs`."},
            "devicesByType": {
                "type": "object",
                "description": "Devices of the current placement by accelerator type.",
                "additionalProperties": {"type": "integer", "format": "int32"},
            },
            "devices": {**string, "description": "The same in words, e.g. v100x2 t4x1."},
            "estsPerDevice": {**string, "description": "ESTs on each device, in rank order."},
            "samplesPerSecond": {**string, "description": "Latest throughput."},
            "queuePosition": {
                "type": "integer",
                "format": "int32",
                "description": "A waiting job's place in the round's queue (0: not waiting).",
            },
            "reason": {**string, "description": "The round's reason code (JobReason.code)."},
            "reasonMessage": {**string, "description": "The reason in words."},
            "message": {**string, "description": "Why the job is in its state (Job.message)."},
            "digest": {**string, "description": "SHA-256 of the final state, once succeeded."},
            "lastSequence": {
                **integer,
                "description": "The last scheduler event mirrored as a Kubernetes Event.",
            },
            "codeSha256": {**string, "description": "The uploaded code package, if any."},
            "conditions": {
                "type": "array",
                "description": "Types: " + ", ".join(CONDITION_TYPES) + ".",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
                "items": {
                    "type": "object",
                    "required": ["type", "status"],
                    "properties": {
                        "type": string,
                        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                        "reason": string,
                        "message": string,
                        "lastTransitionTime": {"type": "string", "format": "date-time"},
                    },
                },
            },
        },
    }


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"gearshiftjobs.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": "GearshiftJob",
                "listKind": "GearshiftJobList",
                "plural": "gearshiftjobs",
                "singular": "gearshiftjob",
                "shortNames": ["gsjob"],
                "categories": ["gearshift"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": name, "type": kind, "jsonPath": path}
                        for name, kind, path in PRINTER_COLUMNS
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A Gearshift training job, submitted to the "
                            "scheduler by the operator (docs/operator/kubernetes-operator.md).",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": status_schema(),
                            },
                        }
                    },
                }
            ],
        },
    }


def render() -> str:
    header = (
        "# Generated by tools/crd.py from the JobSpec descriptor (make reference). Do not edit.\n"
    )
    return header + yaml.safe_dump(crd(), sort_keys=False, width=100)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.crd", description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args()
    fresh = render()
    stale = [p for p in PATHS if not p.exists() or p.read_text() != fresh]
    if stale and args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} is stale: run `make reference`", file=sys.stderr)
        return 1
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fresh)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
