"""Small checks that every servicer uses on request fields, so errors read the same everywhere.

Each check raises ValidationError naming the field by its dotted path.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Iterable
from typing import Any

from gearshift.common.errors import ValidationError
from gearshift.common.facts import ACCELERATOR_TYPE_RULE, is_accelerator_type

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
DEFAULT_TAIL_LINES = 100  # log lines per rank a log request gets first (tail_lines 0)
MAX_TAIL_LINES = 10_000


def require(condition: bool, field: str, problem: str) -> None:
    """Raise ValidationError(field, problem) unless condition holds."""
    if not condition:
        raise ValidationError(field, problem)


def check_name(value: str, field: str, *, max_length: int = 128, required: bool = True) -> None:
    """An identifier: letters, digits and . _ : - , starting with a letter or digit."""
    if not value:
        require(not required, field, "is required")
        return
    require(len(value) <= max_length, field, f"must be at most {max_length} characters")
    require(
        _NAME.match(value) is not None,
        field,
        f"{value!r} may hold only letters, digits, '.', '_', ':' and '-'",
    )


def check_accelerator_type(value: str, field: str) -> None:
    """An accelerator type label, checked alike by the scheduler, the Brain and job specs."""
    require(is_accelerator_type(value), field, f"{value!r} {ACCELERATOR_TYPE_RULE}")


def check_positive(value: float, field: str) -> None:
    require(math.isfinite(value) and value > 0, field, f"must be > 0 (got {value})")


def check_non_negative(value: float, field: str) -> None:
    require(math.isfinite(value) and value >= 0, field, f"must be >= 0 (got {value})")


def check_generation(value: int, field: str = "generation") -> None:
    """A placement generation (shard-holder fences): > 0 fences the holder's older placements
    out, 0 is unfenced. Checked alike by the worker daemon and the shard manager."""
    require(value >= 0, field, f"must be >= 0 (0: unfenced) (got {value})")


def check_enum(value: int, valid: Iterable[int], field: str, *, allow_unspecified: bool) -> None:
    """A proto3 enum field holds a known value (proto3 accepts unknown ones on the wire)."""
    allowed = set(valid)
    if not allow_unspecified:
        allowed.discard(0)
    require(value in allowed, field, f"unknown or unset value {value}")


def tail_lines(rank: int, requested: int) -> int:
    """The lines of history a log request (StreamJobLogs, StreamTaskLogs) asks for."""
    require(rank >= -1, "rank", "must be a process rank, or -1 for every rank")
    require(0 <= requested <= MAX_TAIL_LINES, "tail_lines", f"must be 0..{MAX_TAIL_LINES}")
    return requested or DEFAULT_TAIL_LINES


def page_size(requested: int, field: str = "page.page_size") -> int:
    """The page size to use: 0 means the default; otherwise 1..MAX_PAGE_SIZE."""
    if requested == 0:
        return DEFAULT_PAGE_SIZE
    require(1 <= requested <= MAX_PAGE_SIZE, field, f"must be between 1 and {MAX_PAGE_SIZE}")
    return requested


def encode_page_token(position: dict[str, Any]) -> str:
    """An opaque token for the next page (the server's cursor, base64 JSON)."""
    return base64.urlsafe_b64encode(json.dumps(position, sort_keys=True).encode()).decode()


def decode_page_token(token: str, field: str = "page.page_token") -> dict[str, Any]:
    """The cursor inside a token from encode_page_token; {} for an empty token."""
    if not token:
        return {}
    try:
        value = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise ValidationError(field, "is not a token returned by this server") from None
    require(isinstance(value, dict), field, "is not a token returned by this server")
    return dict(value)
