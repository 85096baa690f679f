"""A job's own code from a ConfigMap: its keys are the files of one folder.

The folder is written to a temporary directory and packaged by the SDK as `gearshift
submit` packages a working_dir, so a job's code hashes the same whichever way it came.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gearshift.common.errors import ValidationError

CODE_LABEL = "gearshift.dev/code"
# A ConfigMap key is a file name (Kubernetes allows [-._a-zA-Z0-9]+ and no '/').
_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


def code_source(spec: Mapping[str, Any]) -> str | None:
    """The ConfigMap name `spec.code.configMap` gives (None: the code is in the image)."""
    code = spec.get("code")
    if code is None:
        return None
    if not isinstance(code, Mapping):
        raise ValidationError("spec.code", "must be a mapping with configMap")
    unknown = set(code) - {"configMap"}
    if unknown:
        raise ValidationError(f"spec.code.{sorted(unknown)[0]}", "unknown key (only configMap)")
    name = code.get("configMap")
    if not isinstance(name, str) or not name:
        raise ValidationError("spec.code.configMap", "must be the name of a ConfigMap")
    return name


def write_code(configmap: Mapping[str, Any], folder: Path) -> list[Path]:
    """Write the ConfigMap's data (text) and binaryData (base64) as files in `folder`."""
    where = f"ConfigMap {configmap.get('metadata', {}).get('name', '?')}"
    files: dict[str, bytes] = {}
    for key, value in (configmap.get("data") or {}).items():
        files[key] = str(value).encode()
    for key, value in (configmap.get("binaryData") or {}).items():
        try:
            files[key] = base64.b64decode(str(value), validate=True)
        except binascii.Error:
            raise ValidationError(f"{where}.binaryData.{key}", "is not base64") from None
    if not files:
        raise ValidationError(where, "has no data: its keys are the files of the job's code")
    written = []
    for key, content in sorted(files.items()):
        if not _KEY.match(key) or key in {".", ".."}:
            raise ValidationError(f"{where}.data.{key}", "is not a file name")
        path = folder / key
        path.write_bytes(content)
        written.append(path)
    return written
