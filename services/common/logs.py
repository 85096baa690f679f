"""Structured logging: one JSON object per line (or readable key=value text).

Fields passed with `extra={...}` become keys of the line, so a log search can
filter on job_id, method or code without parsing prose.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

_STANDARD_ATTRS = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}

LOG_FORMATS = ("json", "text")
LOG_LEVELS = ("debug", "info", "warning", "error")


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS}


def _timestamp(record: logging.LogRecord) -> str:
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{ts}.{int(record.msecs):03d}Z"


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object: ts, level, logger, msg, then the extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update(_fields(record))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """Formats a record as `ts level logger msg key=value ...` for people at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        level = record.levelname.lower()
        text = f"{_timestamp(record)} {level:7} {record.name}: {record.getMessage()}"
        if extra:
            text = f"{text} {extra}"
        if record.exc_info:
            text = f"{text}\n{self.formatException(record.exc_info)}"
        return text


_ON_STDERR: dict[str, str] = {}  # the level and format configure_logging set for stderr


def configure_logging(level: str = "info", fmt: str = "json", stream: TextIO | None = None) -> None:
    """Route every logger to one handler on stderr (or `stream`) in the chosen format."""
    _ON_STDERR.clear()
    if stream is None:
        _ON_STDERR.update(level=level, fmt=fmt)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def stderr_logging() -> tuple[str, str] | None:
    """The level and format configure_logging routed this process's logs to stderr with
    (None: it did not): a spawned child, which shares stderr, logs the same way with it."""
    return (_ON_STDERR["level"], _ON_STDERR["fmt"]) if _ON_STDERR else None
