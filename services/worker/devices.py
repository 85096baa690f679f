"""The devices a worker daemon offers: `--devices TYPE:COUNT[:MEMORY][,...]`.

On a machine without accelerators each device is a CPU slot carrying the
configured type label (`v100:2` on a laptop offers two slots the scheduler
treats as V100s), which is how heterogeneous clusters are exercised on CPU.
Devices are numbered across groups in the order given: `v100:1,t4:2` has
device 0 (v100), 1 and 2 (t4), as the scheduler numbers them.
"""

from __future__ import annotations

import re

from gearshift.common.errors import ValidationError
from gearshift.common.facts import is_accelerator_type
from gearshift.v1 import common_pb2

FLAG = "--devices"
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_UNITS |= {"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}
_UNITS |= {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_memory(text: str) -> int:
    """Bytes of `16GiB`, `16G`, `512MiB` or a plain byte count; ValueError otherwise."""
    match = _MEMORY.match(text.strip())
    if match is None or (match.group(2) is not None and match.group(2).lower() not in _UNITS):
        raise ValueError(f"{text!r} is not a memory size (e.g. 16GiB, 512MiB, 1000000)")
    unit = (match.group(2) or "").lower()
    return int(float(match.group(1)) * _UNITS[unit])


def parse_devices(text: str) -> list[common_pb2.DeviceGroup]:
    """`v100:2,t4:1:16GiB` -> device groups; ValidationError naming --devices otherwise."""
    groups: list[common_pb2.DeviceGroup] = []
    seen: set[str] = set()
    for item in (part.strip() for part in text.split(",")):
        parts = item.split(":")
        if len(parts) not in (2, 3) or not parts[1].isdigit():
            raise ValidationError(FLAG, f"{item!r} is not TYPE:COUNT or TYPE:COUNT:MEMORY")
        kind, count = parts[0].lower(), int(parts[1])
        if not is_accelerator_type(kind):
            raise ValidationError(FLAG, f"{parts[0]!r} must be letters, digits, '_' or '-'")
        if kind in seen:
            raise ValidationError(FLAG, f"{kind!r} is listed twice")
        if count < 1:
            raise ValidationError(FLAG, f"{item!r}: the count must be >= 1")
        memory = 0
        if len(parts) == 3:
            try:
                memory = parse_memory(parts[2])
            except ValueError as exc:
                raise ValidationError(FLAG, str(exc)) from None
        seen.add(kind)
        groups.append(
            common_pb2.DeviceGroup(accelerator_type=kind, count=count, memory_bytes=memory)
        )
    return groups


def device_types(groups: list[common_pb2.DeviceGroup]) -> list[str]:
    """The type of each device index (groups in order)."""
    return [g.accelerator_type for g in groups for _ in range(g.count)]
