"""A job's layer profile, measured by its rank 0 before its first step and stored in the Brain.

The scheduler asks for it (StartTaskRequest.profile_first) when it multiplexes devices and
the Brain holds no profile of the job: its next rounds then know how idle the job's plan
leaves its devices. The model is built afresh and the process's random state restored
after, so training computes exactly what it would have without the profile; a profile
that cannot be measured or stored is logged and training goes on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from gearshift.common.auth import ClientTls
from gearshift.common.channel import connect
from gearshift.common.errors import GearshiftError
from gearshift.v1 import brain_pb2, brain_pb2_grpc

log = logging.getLogger("gearshift.worker.profiling")

STORE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class FirstProfile:
    """What to measure and where to store it."""

    key: str  # gearshift.common.profiles.profile_key of the job's spec and device
    job_id: str
    model_type: str
    brain: str
    token: str | None
    tls: ClientTls | None
    global_batch: int
    max_devices: int
    device_kind: str = "cpu"


def profile_and_store(job_module: str, config: dict[str, Any], target: FirstProfile) -> bool:
    """Measure and store; True when the Brain has the profile. Never raises for a job that
    cannot be profiled or a Brain that cannot be reached: training matters more."""
    import grpc  # noqa: PLC0415
    import torch  # noqa: PLC0415

    from gearshift.worker.profiling.profile_job import measure  # noqa: PLC0415

    began = time.perf_counter()
    try:
        with torch.random.fork_rng(devices=[]):
            profile = measure(
                job_module,
                config,
                global_batch=target.global_batch,
                max_devices=target.max_devices,
                device_kind=target.device_kind,
                repeats=2,
                threads=None,
            )
    except (GearshiftError, RuntimeError, ValueError) as exc:
        print(f"layer profile not measured: {exc}", flush=True)
        return False
    request = brain_pb2.StoreLayerProfileRequest(
        key=target.key, model_type=target.model_type, profile=profile, job_id=target.job_id
    )
    try:
        with connect(target.brain, token=target.token, tls=target.tls) as channel:
            brain_pb2_grpc.BrainStub(channel).StoreLayerProfile(request, timeout=STORE_TIMEOUT_S)
    except grpc.RpcError as exc:
        print(f"layer profile not stored in the Brain: {exc.code()} {exc.details()}", flush=True)
        return False
    print(
        f"layer profile {target.key}: {len(profile.layers)} layers at devices "
        f"{','.join(map(str, profile.device_counts))}, stored in "
        f"{time.perf_counter() - began:.1f} s",
        flush=True,
    )
    return True
