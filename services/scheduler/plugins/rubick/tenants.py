"""Tenants' quotas (Rubick section 5): devices per accelerator type that a tenant's
guaranteed jobs may hold, read from a YAML file the scheduler reloads on SIGHUP.

    # tenants.yaml
    tenants:
      a:
        quota: {v100: 4, cpu: 2}   # devices per type its guaranteed jobs may hold
      b: {}                        # no quota: its jobs are all best-effort

A tenant not in the file has no quota. A file that does not parse is refused with an
error naming the field, and (on a reload) the quotas already loaded stay.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gearshift.common.errors import ValidationError
from gearshift.common.validation import check_accelerator_type, check_name


@dataclass(frozen=True)
class Quotas:
    """Devices per type each tenant's guaranteed jobs may hold (absent: none)."""

    by_tenant: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def of(self, tenant: str) -> Mapping[str, int]:
        return self.by_tenant.get(tenant, {})


def parse_quotas(text: str, source: str = "tenants file") -> Quotas:
    """The quotas in `text`; ValidationError naming the field (e.g. `tenants.a.quota.v100`)."""
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValidationError(source, f"not YAML: {exc}") from None
    if data is None:
        data = {"tenants": {}}
    if not isinstance(data, dict) or set(data) != {"tenants"}:
        raise ValidationError(source, "must be a mapping with one key, `tenants`")
    tenants = data["tenants"] or {}
    if not isinstance(tenants, dict):
        raise ValidationError("tenants", "must map tenant names to {quota: {TYPE: DEVICES}}")
    out: dict[str, dict[str, int]] = {}
    for name, given in tenants.items():
        where = f"tenants.{name}"
        check_name(str(name), where, max_length=64)
        body = given or {}
        if not isinstance(body, dict) or not set(body) <= {"quota"}:
            raise ValidationError(where, "may hold only `quota`")
        quota = body.get("quota") or {}
        if not isinstance(quota, dict):
            raise ValidationError(f"{where}.quota", "must map accelerator types to device counts")
        devices: dict[str, int] = {}
        for kind, count in quota.items():
            check_accelerator_type(str(kind), f"{where}.quota")
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValidationError(f"{where}.quota.{kind}", f"must be an integer >= 0: {count}")
            if count:
                devices[str(kind)] = count
        out[str(name)] = devices
    return Quotas(out)


def load_quotas(path: Path) -> Quotas:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValidationError("tenants file", f"cannot read {path}: {exc.strerror}") from None
    return parse_quotas(text, str(path))


class TenantsFile:
    """The quotas of a tenants file; `reload()` swaps in the file's new content, or raises
    ValidationError and keeps the old."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._quotas = load_quotas(path)

    @property
    def quotas(self) -> Quotas:
        with self._lock:
            return self._quotas

    def reload(self) -> Quotas:
        quotas = load_quotas(self.path)
        with self._lock:
            self._quotas = quotas
        return quotas
