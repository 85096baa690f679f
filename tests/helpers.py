"""Helpers shared by the tests: bounded waits, daemon calls."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], timeout: float, message: str, interval: float = 0.05
) -> T:
    """Poll predicate until it returns something truthy; fail with `message` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s: {message}")
        time.sleep(interval)
