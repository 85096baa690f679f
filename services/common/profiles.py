"""What the worker's profiler and the Brain agree on about layer profiles: the device
counts a profile is measured at (1, 2, 4, ...), and the key it is stored under in the
Brain, the job spec's fingerprint.

A layer profile depends on the model (the entrypoint's module, its code package and its
config) and on the device it was measured on - not on the job's name, tenant, steps or
global batch (the Brain re-derives a profile for any batch from its per-device batches).
So `gearshift profile JOB.yaml` stores under this key and `gearshift plan --burst
JOB.yaml` finds the profile again from the same file; a worker profiling a job before
its first round would compute the same key.
"""

from __future__ import annotations

import hashlib
import json

from gearshift.v1 import common_pb2

PREFIX = "spec-"


def profile_key(spec: common_pb2.JobSpec, device: str) -> str:
    """`spec-` and 32 hex digits of SHA-256 over (module, code, config, device).

    The config is compared as data (key order and spacing do not matter); device is the
    kind measured on ("cpu", "cuda").
    """
    entry = spec.entrypoint
    config = json.loads(entry.config_json or "{}")
    text = json.dumps(
        {
            "module": entry.module,
            "code_sha256": entry.code_sha256,
            "config": config,
            "device": device,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return PREFIX + hashlib.sha256(text.encode()).hexdigest()[:32]


def power_of_two_counts(limit: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to limit."""
    if limit < 1:
        raise ValueError(f"max_devices: must be >= 1, got {limit}")
    return tuple(1 << e for e in range(limit.bit_length()))
