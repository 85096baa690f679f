"""docs/reference/jobspec.md: every JobSpec field as a job file's key, with its type, its
default and its comment.

Defaults and required keys are found by running the code rather than restated: a key is
required when a valid spec without it fails `validate_job_spec` naming it; an unset key's
default is what `with_defaults` fills in, compared over two different specs so that a
default that follows another key says which.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from gearshift.client.spec import FILE_KEYS, spec_to_dict
from gearshift.common.errors import ValidationError
from gearshift.common.jobspec import validate_job_spec, with_defaults
from gearshift.v1 import common_pb2
from tools.reference import rpcs
from tools.reference.markdown import code, page, table, text

# Two valid specs as unlike as they can be: a default that differs between them follows
# another key. A PS job's own keys are probed on a PS job.
_PROBES = (
    common_pb2.JobSpec(
        name="digits",
        entrypoint=common_pb2.Entrypoint(module="train"),
        num_ests=4,
        global_batch_size=64,
        total_steps=300,
        dataset=common_pb2.DatasetSpec(size=1797, shard_size=32),
    ),
    common_pb2.JobSpec(
        name="other",
        entrypoint=common_pb2.Entrypoint(module="pkg.model"),
        num_ests=2,
        global_batch_size=8,
        total_steps=50,
        dataset=common_pb2.DatasetSpec(size=500, shard_size=5),
    ),
)
_PS_PROBE = common_pb2.JobSpec(
    name="clicks", total_steps=100, parameter_server=common_pb2.ParameterServerSpec()
)
_INTEGERS = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_SINT64,
}
_NUMBERS = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT}


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated


def leaves(descriptor: Descriptor, prefix: str = "") -> Iterator[tuple[str, FieldDescriptor]]:
    """(dotted key, field) of every field a job file can set, depth first in field order."""
    for field in descriptor.fields:
        key = prefix + field.name
        yield key, field
        if field.message_type is not None and not _is_map(field) and not _repeated(field):
            yield from leaves(field.message_type, key + ".")


def _get(message: Message, key: str) -> Any:
    head, _, rest = key.partition(".")
    value = getattr(message, head)
    return _get(value, rest) if rest else value


def _holder(message: Message, key: str) -> tuple[Message, str]:
    head, _, rest = key.partition(".")
    return _holder(getattr(message, head), rest) if rest else (message, head)


def _is_set(message: Message, key: str, field: FieldDescriptor) -> bool:
    holder, name = _holder(message, key)
    if field.message_type is not None and not _repeated(field):
        return holder.HasField(name)
    return bool(getattr(holder, name))


def _required(key: str) -> bool:
    probe = common_pb2.JobSpec()
    probe.CopyFrom(_PROBES[0])
    holder, name = _holder(probe, key)
    holder.ClearField(name)
    try:
        validate_job_spec(probe)
    except ValidationError as exc:
        return exc.field == f"spec.{key}"
    return False


def yaml_value(key: str, field: FieldDescriptor, value: Any) -> str:
    """A value as a job file writes it (an enum by the short name spec_to_dict gives)."""
    if field.enum_type is not None:
        spec = common_pb2.JobSpec()
        holder, name = _holder(spec, key)
        setattr(holder, name, value)
        data: Any = spec_to_dict(spec)
        for part in key.split("."):
            data = data[part]
        return code(str(data))
    if field.message_type is not None and not _repeated(field):
        return "unset" if not value.ListFields() else code(str(value))
    if _repeated(field):
        return "empty" if not value else code(str(list(value)))
    if isinstance(value, bool):
        return code(str(value).lower())
    if value == "":
        return "empty"
    return code(str(value))


def _default(key: str, field: FieldDescriptor) -> str:
    if key.startswith("parameter_server."):
        return yaml_value(key, field, _get(with_defaults(_PS_PROBE), key))
    oneof = field.containing_oneof
    if oneof is not None:
        prefix = key[: len(key) - len(field.name)]
        members = [(prefix + f.name, f) for f in oneof.fields]
        if any(_is_set(_PROBES[0], k, f) and _required(k) for k, f in members):
            return "required: one of " + ", ".join(code(k) for k, _ in members)
    if field.message_type is not None and not _is_map(field) and not _repeated(field):
        if _is_set(_PROBES[0], key, field):
            return "required" if _required(key) else "unset"
        filled = any(_is_set(with_defaults(p), key, field) for p in _PROBES)
        return "see its keys" if filled else "unset"
    if _is_set(_PROBES[0], key, field):
        if _required(key):
            return "required"
        return yaml_value(key, field, field.default_value)
    values = [_get(with_defaults(p), key) for p in _PROBES]
    if values[0] == values[1]:
        return yaml_value(key, field, values[0])
    for other, other_field in leaves(common_pb2.JobSpec.DESCRIPTOR):
        if other_field.message_type is None and [_get(p, other) for p in _PROBES] == values:
            return f"the value of {code(other)}"
    return "derived (see the comment)"


def _file_data(message: Message, prefix: str = "") -> dict[str, Any]:
    """A message as a job file's mapping (MessageToDict writes 64-bit integers as strings)."""
    out: dict[str, Any] = {}
    for field, value in message.ListFields():
        key = prefix + field.name
        if field.message_type is not None and not _is_map(field) and not _repeated(field):
            out[field.name] = _file_data(value, key + ".")
        elif field.enum_type is not None:
            out[field.name] = yaml_value(key, field, value).strip("`")
        elif _is_map(field):
            out[field.name] = dict(value)
        elif _repeated(field):
            out[field.name] = list(value)
        else:
            out[field.name] = value
    return out


def yaml_type(key: str, field: FieldDescriptor) -> str:
    """The YAML a key takes: scalar kinds, an enum's names, lists and mappings."""
    if field.message_type is not None and _is_map(field):
        key_field, value_field = field.message_type.fields
        return f"mapping of {yaml_type(key, key_field)} to {yaml_type(key, value_field)}"
    if field.enum_type is not None:
        values = [v.number for v in field.enum_type.values if v.number]
        return "one of " + ", ".join(yaml_value(key, field, v) for v in values)
    if field.message_type is not None:
        kind = "mapping"
    elif field.type in _INTEGERS:
        kind = "integer"
    elif field.type in _NUMBERS:
        kind = "number"
    elif field.type == FieldDescriptor.TYPE_BOOL:
        kind = "boolean"
    else:
        kind = "string"
    return f"list of {kind}" if _repeated(field) else kind


def render() -> str:
    spec = common_pb2.JobSpec.DESCRIPTOR
    for probe in (*_PROBES, _PS_PROBE):
        validate_job_spec(probe)  # the examples below are valid, or this page is not made
    rows = []
    for key, field in leaves(spec):
        kind = yaml_type(key, field)
        if field.containing_oneof is not None:
            kind += f" (one of the {code(field.containing_oneof.name)} keys)"
        comment = rpcs.comment(field.full_name)
        rows.append([code(key), kind, _default(key, field), comment])
    example = yaml.safe_dump(_file_data(_PROBES[0]), sort_keys=False).rstrip("\n")
    lines = [
        "# Job spec",
        "",
        "Generated by `make reference` from the JobSpec message, its validation and its "
        "defaults (tools/reference/jobspec.py); do not edit. A job file "
        "(`gearshift submit job.yaml`) is the JobSpec message in YAML: every key below, "
        "nested keys as mappings (`dataset: {size: 1797}` sets `dataset.size`). Enum values "
        "take their short names (case does not matter). The message's own reference: "
        "[JobSpec](rpcs.md#jobspec).",
        "",
        "A small valid job file:",
        "",
        "```yaml",
        example,
        "```",
        "",
        "## Keys",
        "",
        "Default: what the scheduler uses when the key is left out; *required*: a spec "
        "without it is refused, naming the key. The `parameter_server` keys are a "
        "parameter-server job's, with that job's defaults.",
        "",
        *table(["key", "type", "default", "comment"], rows),
        "",
        "## Keys only a job file has",
        "",
        "Read by the client (gearshift.client.spec), which packages and uploads your code "
        "and sets `entrypoint.code_sha256`; they are not sent.",
        "",
        *table(["key", "meaning"], ([code(k), text(v)] for k, v in sorted(FILE_KEYS.items()))),
    ]
    return page(lines)
