"""docs/reference/helm-values.md: every value of deploy/helm/gearshift, its type and meaning
from values.schema.json (the file `helm install` checks values against) and its default from
values.yaml, so the table cannot drift from either."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from tools.reference.markdown import code, page, table, text

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gearshift"


def _is_group(entry: Mapping[str, Any]) -> bool:
    """A group of values (each described: a row of its own), not one object-valued value
    such as `resources`."""
    properties = entry.get("properties", {})
    return bool(properties) and all("description" in p for p in properties.values())


def _rows(
    schema: Mapping[str, Any], defaults: Mapping[str, Any], prefix: str = ""
) -> Iterator[list[str]]:
    for key, entry in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        default = defaults.get(key)
        if _is_group(entry):
            yield from _rows(entry, default or {}, f"{path}.")
            continue
        kind = entry.get("type", "")
        kind = " or ".join(kind) if isinstance(kind, list) else kind
        if "enum" in entry:
            kind = " \\| ".join(code(str(v)) for v in entry["enum"])
        shown = json.dumps(default, separators=(", ", ": ")) if default not in ("", None) else ""
        yield [code(path), kind, code(shown) if shown else "", text(entry.get("description", ""))]


def render() -> str:
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    lines = [
        "# Helm chart values",
        "",
        "Every value of `deploy/helm/gearshift`: its type and meaning from the chart's "
        "`values.schema.json` (Helm refuses values that break it), its default from "
        "`values.yaml`. How to install: [Kubernetes](../operator/kubernetes.md).",
        "",
        *table(["value", "type", "default", "meaning"], _rows(schema, defaults)),
    ]
    return page(lines)
