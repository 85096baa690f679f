"""JobSpec from YAML or a plain dict, and back.

The YAML mirrors the JobSpec message with two conveniences: `entrypoint.config`
is a mapping (sent as JSON), and enums take short names (`determinism: D1`,
`dataset.mode: dynamic`, `service_class: guaranteed`). Every problem is a
ValidationError naming the field, raised before anything is sent.

    name: digits-cnn
    entrypoint:
      module: gearshift.examples.digits_cnn
      config: {lr: 0.05}
    num_ests: 4
    global_batch_size: 64
    total_steps: 300
    dataset: {name: digits, size: 1797, shard_size: 32, seed: 1}
    elastic: {min_devices: 1, max_devices: 4}
    accelerator_types: [v100, t4]
    plan_dimensions: {gradient_checkpointing: true}   # what the scheduler may change

Your own code: `entrypoint: {path: ./train.py}` (one file; the module is its name) or
`working_dir: .` with `entrypoint: {module: train}` (a folder, packaged whole but for
what its .gitignore says). Paths are relative to the YAML file. The client packages
and uploads the code (once per content) and sets `entrypoint.code_sha256`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format

from gearshift.common.errors import ValidationError
from gearshift.common.facts import DETERMINISM_PREFIX
from gearshift.common.jobspec import validate_job_spec
from gearshift.v1 import common_pb2

# The keys of a job file that are no JobSpec field (docs/reference/jobspec.md lists them).
FILE_KEYS: dict[str, str] = {
    "working_dir": "a folder of your own code, packaged whole but for what its .gitignore "
    "excludes; the entrypoint's module is found in it. Relative to the job file; not with "
    "entrypoint.path",
    "entrypoint.path": "one .py file of your own code (entrypoint.module: its name), or a "
    "folder (entrypoint.module required). Relative to the job file",
    "entrypoint.config": "a mapping, passed to the job's build(config); sent as "
    "entrypoint.config_json",
}

# Short enum names accepted in YAML -> the proto enum's prefix.
_ENUMS: dict[str, tuple[str, Any]] = {
    "determinism": (DETERMINISM_PREFIX, common_pb2.DeterminismLevel),
    "service_class": ("SERVICE_CLASS_", common_pb2.ServiceClass),
    "dataset.mode": ("DATA_MODE_", common_pb2.DataMode),
}


def _enum_name(path: str, value: Any) -> Any:
    prefix, enum = _ENUMS[path]
    if not isinstance(value, str):
        return value
    name = value.upper().replace("-", "_")
    if not name.startswith(prefix):
        name = prefix + name
    names: list[str] = list(enum.keys())  # an EnumTypeWrapper, not a dict
    if name not in names:
        short = [k.removeprefix(prefix).lower() for k in names if not k.endswith("UNSPECIFIED")]
        raise ValidationError(f"spec.{path}", f"{value!r} is not one of {', '.join(short)}")
    return name


def _normalize(data: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(data)
    entry = out.get("entrypoint")
    if isinstance(entry, Mapping) and "config" in entry:
        entry = dict(entry)
        config = entry.pop("config")
        if not isinstance(config, Mapping):
            raise ValidationError("spec.entrypoint.config", "must be a mapping")
        try:
            entry["config_json"] = json.dumps(config, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:  # a YAML date, NaN, a non-string key...
            raise ValidationError(
                "spec.entrypoint.config", f"must be plain JSON data: {exc}"
            ) from None
        out["entrypoint"] = entry
    for path in _ENUMS:
        head, _, tail = path.partition(".")
        if tail:
            inner = out.get(head)
            if isinstance(inner, Mapping) and tail in inner:
                out[head] = {**inner, tail: _enum_name(path, inner[tail])}
        elif head in out:
            out[head] = _enum_name(path, out[head])
    return out


@dataclass(frozen=True)
class JobFile:
    """A job file: its spec and, for a job of the user's own code, what to package."""

    spec: common_pb2.JobSpec
    code: Path | None = None  # a file or folder


def _code_location(data: Mapping[str, Any], base: Path) -> tuple[dict[str, Any], Path | None]:
    """Take `working_dir` and `entrypoint.path` out of the data: where the code is."""
    out = dict(data)
    working_dir = out.pop("working_dir", None)
    entry = out.get("entrypoint")
    path = None
    if isinstance(entry, Mapping) and "path" in entry:
        entry = dict(entry)
        path = entry.pop("path")
        out["entrypoint"] = entry
    if working_dir is not None and path is not None:
        raise ValidationError("spec.working_dir", "give working_dir or entrypoint.path, not both")
    for field, value in (("spec.working_dir", working_dir), ("spec.entrypoint.path", path)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ValidationError(field, "must be a path (relative to the job file)")
    if working_dir is not None:
        folder = (base / working_dir).resolve()
        if not folder.is_dir():
            raise ValidationError("spec.working_dir", f"{folder} is not a folder")
        return out, folder
    if path is None:
        return out, None
    code = (base / path).resolve()
    entry = out["entrypoint"]
    if code.is_file():
        if code.suffix != ".py":
            raise ValidationError("spec.entrypoint.path", f"{code} is not a .py file")
        entry.setdefault("module", code.stem)
    elif code.is_dir():
        if "module" not in entry:
            raise ValidationError(
                "spec.entrypoint.module", "is required when entrypoint.path is a folder"
            )
    else:
        raise ValidationError("spec.entrypoint.path", f"{code} does not exist")
    return out, code


def job_from_dict(data: Any, base: Path) -> JobFile:
    """A validated job from a mapping whose paths are relative to `base`."""
    if not isinstance(data, Mapping):
        raise ValidationError("spec", f"must be a mapping of fields, got {type(data).__name__}")
    rest, code = _code_location(data, base)
    return JobFile(spec_from_dict(rest), code)


def spec_from_dict(data: Any) -> common_pb2.JobSpec:
    """A validated JobSpec from a mapping; ValidationError names the first bad field."""
    if not isinstance(data, Mapping):
        raise ValidationError("spec", f"must be a mapping of fields, got {type(data).__name__}")
    spec = common_pb2.JobSpec()
    try:
        json_format.ParseDict(_normalize(data), spec)
    except json_format.ParseError as exc:
        raise ValidationError("spec", str(exc)) from None
    validate_job_spec(spec)
    return spec


def load_spec(path: str | Path) -> common_pb2.JobSpec:
    """A job YAML file's spec (see load_job for one that ships its own code)."""
    job = load_job(path)
    if job.code is not None:
        raise ValidationError(str(path), "ships its own code: load it with load_job")
    return job.spec


def load_job(path: str | Path) -> JobFile:
    """Read a job YAML file; ValidationError names the file and line of a syntax error."""
    source = Path(path)
    try:
        text = source.read_text()
    except OSError as exc:
        raise ValidationError(str(source), f"cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ValidationError(str(source), f"malformed YAML: {where}{problem}") from None
    return job_from_dict(data, source.resolve().parent)


def spec_to_dict(spec: common_pb2.JobSpec) -> dict[str, Any]:
    """The spec as plain data in the YAML's shape (for `--json` output and round trips)."""
    data = json_format.MessageToDict(spec, preserving_proto_field_name=True)
    entry = data.get("entrypoint", {})
    if "config_json" in entry:
        entry["config"] = json.loads(entry.pop("config_json") or "{}")
    for path, (prefix, _enum) in _ENUMS.items():
        head, _, tail = path.partition(".")
        holder = data.get(head) if tail else data
        key = tail or head
        if isinstance(holder, dict) and isinstance(holder.get(key), str):
            holder[key] = holder[key].removeprefix(prefix).lower()
            if key == "determinism":
                holder[key] = holder[key].upper()
    return data
