"""Domain errors map to status codes and back, keeping the message that names the field.

(error_from_rpc reads a failed call's code and details into error_from_status; the
integration tests exercise it on real failed calls.)"""

from __future__ import annotations

import grpc
import pytest

from gearshift.common import errors


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.ValidationError("spec.num_ests", "must be >= 1"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.NotFoundError("job", "job-1"), grpc.StatusCode.NOT_FOUND),
        (errors.ConflictError("dataset 'd' exists"), grpc.StatusCode.ALREADY_EXISTS),
        (errors.PreconditionError("job ended"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.UnavailableError("database down"), grpc.StatusCode.UNAVAILABLE),
    ],
)
def test_round_trip_through_a_status(error: errors.GearshiftError, code: grpc.StatusCode) -> None:
    assert error.code == code
    back = errors.error_from_status(error.code, error.message)
    assert type(back) is type(error)
    assert back.message == error.message


def test_validation_error_keeps_the_field() -> None:
    error = errors.ValidationError("spec.dataset.size", "must be > 0 (got 0)")
    assert str(error) == "spec.dataset.size: must be > 0 (got 0)"
    back = errors.error_from_status(grpc.StatusCode.INVALID_ARGUMENT, str(error))
    assert isinstance(back, errors.ValidationError)
    assert back.field == "spec.dataset.size"


def test_not_found_names_the_object() -> None:
    assert str(errors.NotFoundError("job", "job-9")) == "job 'job-9' not found"


def test_unknown_code_gives_the_base_error() -> None:
    back = errors.error_from_status(grpc.StatusCode.DATA_LOSS, "gone")
    assert type(back) is errors.GearshiftError
    assert back.message == "gone"
