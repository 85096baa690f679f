"""The Gearshift client: the Python SDK and the `gearshift` command line.

    from gearshift.client import Client
    with Client("127.0.0.1:50051") as client:
        job = client.submit(spec)

Needs only grpcio and protobuf: never imports torch, cvxpy, SQLAlchemy or redis.
"""

from gearshift.client.sdk import Client, Job, JobEvent, JobSpec
from gearshift.common.errors import (
    ConflictError,
    DeadlineExceededError,
    GearshiftError,
    NotFoundError,
    PermissionDeniedError,
    PreconditionError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    ValidationError,
)

__all__ = [
    "Client",
    "ConflictError",
    "DeadlineExceededError",
    "GearshiftError",
    "Job",
    "JobEvent",
    "JobSpec",
    "NotFoundError",
    "PermissionDeniedError",
    "PreconditionError",
    "ResourceExhaustedError",
    "UnauthenticatedError",
    "UnavailableError",
    "ValidationError",
]
