"""docs/reference/rpcs.md: every service, RPC, message, field, enum and value of the v1
contracts, with its comment from the .proto file (protoc's source info).

An element without a comment shows "(no comment)" and is counted (`undocumented`);
tests/unit/test_contracts.py keeps that count at zero.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache

from google.protobuf import descriptor_pb2

from gearshift.common.channel import idempotent_methods
from tools.gen_protos import descriptor_set
from tools.reference.markdown import anchor, code, page, table, text

PACKAGE = "gearshift.v1"
# Field numbers of descriptor.proto: the paths in SourceCodeInfo.
_FILE_MESSAGE, _FILE_ENUM, _FILE_SERVICE, _FILE_EXTENSION = 4, 5, 6, 7
_MESSAGE_FIELD, _MESSAGE_NESTED, _MESSAGE_ENUM = 2, 3, 4
_ENUM_VALUE, _SERVICE_METHOD = 2, 2
_SCALARS = {
    value: name.removeprefix("TYPE_").lower()
    for name, value in descriptor_pb2.FieldDescriptorProto.Type.items()
}
NO_COMMENT = "*(no comment)*"

FieldProto = descriptor_pb2.FieldDescriptorProto
Path = tuple[int, ...]


@dataclass
class Contracts:
    """The contracts' files and each element's comment, by full name (gearshift.v1.X.y)."""

    files: list[descriptor_pb2.FileDescriptorProto]
    comments: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    messages: dict[str, descriptor_pb2.DescriptorProto] = field(default_factory=dict)
    enums: dict[str, descriptor_pb2.EnumDescriptorProto] = field(default_factory=dict)


@cache
def contracts() -> Contracts:
    """Parse the .proto files once (protoc with --include_source_info)."""
    files = sorted((f for f in descriptor_set().file if f.package == PACKAGE), key=lambda f: f.name)
    found = Contracts(files)
    for file in files:
        by_path: dict[Path, str] = {}
        for loc in file.source_code_info.location:
            comment = (loc.leading_comments or loc.trailing_comments).strip()
            if comment:
                by_path[tuple(loc.path)] = comment

        def note(name: str, path: Path, by_path: dict[Path, str] = by_path) -> None:
            if path in by_path:
                found.comments[name] = by_path[path]
            else:
                found.missing.append(name)

        def message(msg: descriptor_pb2.DescriptorProto, path: Path, prefix: str) -> None:
            name = f"{prefix}.{msg.name}"
            if msg.options.map_entry:
                found.messages[name] = msg
                return
            found.messages[name] = msg
            note(name, path)
            for i, f in enumerate(msg.field):
                note(f"{name}.{f.name}", (*path, _MESSAGE_FIELD, i))
            for i, nested in enumerate(msg.nested_type):
                message(nested, (*path, _MESSAGE_NESTED, i), name)
            for i, enum in enumerate(msg.enum_type):
                enum_type(enum, (*path, _MESSAGE_ENUM, i), name)

        def enum_type(enum: descriptor_pb2.EnumDescriptorProto, path: Path, prefix: str) -> None:
            name = f"{prefix}.{enum.name}"
            found.enums[name] = enum
            note(name, path)
            for i, value in enumerate(enum.value):
                note(f"{name}.{value.name}", (*path, _ENUM_VALUE, i))

        for i, msg in enumerate(file.message_type):
            message(msg, (_FILE_MESSAGE, i), PACKAGE)
        for i, enum in enumerate(file.enum_type):
            enum_type(enum, (_FILE_ENUM, i), PACKAGE)
        for i, service in enumerate(file.service):
            note(f"{PACKAGE}.{service.name}", (_FILE_SERVICE, i))
            for j, method in enumerate(service.method):
                path = (_FILE_SERVICE, i, _SERVICE_METHOD, j)
                note(f"{PACKAGE}.{service.name}.{method.name}", path)
        for i, ext in enumerate(file.extension):
            note(f"{PACKAGE}.{ext.name}", (_FILE_EXTENSION, i))
    return found


def undocumented() -> list[str]:
    """Full names of the elements that have no comment."""
    return list(contracts().missing)


def short(type_name: str) -> str:
    """ ".gearshift.v1.JobEvent.Kind" -> "JobEvent.Kind" (other packages keep their name)."""
    return type_name.lstrip(".").removeprefix(PACKAGE + ".")


def type_link(type_name: str, page_path: str = "") -> str:
    """A message or enum named as a link to its section (of rpcs.md when page_path says so)."""
    name = short(type_name)
    if type_name.lstrip(".").startswith(PACKAGE + "."):
        return f"[{name}]({page_path}#{anchor(name)})"
    return code(name)


def field_type(f: FieldProto, page_path: str = "") -> str:
    """The field's type as written in the .proto: `repeated`, `map<K, V>`, `optional`."""
    if f.type in (FieldProto.TYPE_MESSAGE, FieldProto.TYPE_ENUM):
        entry = contracts().messages.get(f.type_name.lstrip("."))
        if entry is not None and entry.options.map_entry:
            key, value = entry.field
            return f"map<{field_type(key, page_path)}, {field_type(value, page_path)}>".replace(
                "<", "&lt;"
            )
        base = type_link(f.type_name, page_path)
    else:
        base = _SCALARS[f.type]
    if f.label == FieldProto.LABEL_REPEATED:
        return f"repeated {base}"
    if f.proto3_optional:
        return f"optional {base}"
    return base


def comment(name: str) -> str:
    found = contracts().comments.get(name)
    return text(found) if found else NO_COMMENT


def _idempotent() -> set[tuple[str, str]]:
    return set(idempotent_methods())


def _message_lines(name: str, msg: descriptor_pb2.DescriptorProto) -> Iterator[str]:
    yield f"### {short(name)}"
    yield ""
    yield comment(name)
    yield ""
    if not msg.field:
        yield "No fields."
        yield ""
        return
    rows = []
    for f in msg.field:
        kind = field_type(f)
        if f.HasField("oneof_index") and not f.proto3_optional:
            kind += f" (oneof {code(msg.oneof_decl[f.oneof_index].name)})"
        rows.append([code(f.name), str(f.number), kind, comment(f"{name}.{f.name}")])
    yield from table(["field", "number", "type", "comment"], rows)
    yield ""


def _enum_lines(name: str, enum: descriptor_pb2.EnumDescriptorProto) -> Iterator[str]:
    yield f"### {short(name)}"
    yield ""
    yield comment(name)
    yield ""
    yield from table(
        ["value", "number", "comment"],
        ([code(v.name), str(v.number), comment(f"{name}.{v.name}")] for v in enum.value),
    )
    yield ""


def render() -> str:
    """The page: per .proto file, its services, messages, enums and options."""
    found = contracts()
    idempotent = _idempotent()
    lines = [
        "# RPCs and messages",
        "",
        "Generated by `make reference` from protos/gearshift/v1/\\*.proto and their comments "
        "(tools/reference/rpcs.py); do not edit. Package `gearshift.v1`. "
        "An idempotent RPC is one a client may retry (the channel's retry policy reads the "
        "`idempotent` option).",
        "",
        f"Elements without a comment: {len(found.missing)}.",
        "",
    ]
    for file in found.files:
        lines += [f"## {file.name.rsplit('/', 1)[-1]}", ""]
        for service in file.service:
            full = f"{PACKAGE}.{service.name}"
            lines += [f"### {service.name}", "", comment(full), ""]
            rows = []
            for m in service.method:
                request = ("stream " if m.client_streaming else "") + type_link(m.input_type)
                reply = ("stream " if m.server_streaming else "") + type_link(m.output_type)
                rows.append(
                    [
                        code(m.name),
                        request,
                        reply,
                        "yes" if (full, m.name) in idempotent else "",
                        comment(f"{full}.{m.name}"),
                    ]
                )
            lines += table(["RPC", "request", "reply", "idempotent", "comment"], rows)
            lines.append("")
        prefix = PACKAGE + "."
        for name, msg in found.messages.items():
            in_file = any(
                name == f"{prefix}{m.name}" or name.startswith(f"{prefix}{m.name}.")
                for m in file.message_type
            )
            if in_file and not msg.options.map_entry:
                lines += _message_lines(name, msg)
        for name, enum in found.enums.items():
            top = name.removeprefix(prefix).split(".")[0]
            in_file = any(top == m.name for m in file.message_type) or any(
                top == e.name for e in file.enum_type
            )
            if in_file:
                lines += _enum_lines(name, enum)
        for ext in file.extension:
            lines += [
                f"### {ext.name}",
                "",
                f"Option {code(f'({PACKAGE}.{ext.name})')} on {code(short(ext.extendee))}, "
                f"{field_type(ext)} (number {ext.number}): {comment(f'{PACKAGE}.{ext.name}')}",
                "",
            ]
    return page(lines)
