"""How the broker's log records are written: readable lines, or one JSON object per line
(``log_format = "json"``) for log collectors. Formats records; never decides what is logged.

A record about one connection carries its id in ``extra={"connection": ...}`` (see
:func:`connection_log`); the JSON form has it as the ``connection`` field.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# The attributes every LogRecord has: anything else on a record came from ``extra``.
_STANDARD_ATTRIBUTES = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__
) | {"message", "asctime", "taskName"}


class JSONFormatter(logging.Formatter):
    """One JSON object per record, on one line: timestamp (UTC, ISO 8601 with milliseconds),
    level, logger, message, the connection id where there is one, any other ``extra`` fields,
    and the traceback of an exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ).replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRIBUTES and not key.startswith("_"):
                entry[key] = value if isinstance(value, (str, int, float, bool)) else str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False)


class ConnectionLog(logging.LoggerAdapter[logging.Logger]):
    """A logger whose records carry one connection's id (made when a record is logged, so an
    idle connection holds none)."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def connection_log(logger: logging.Logger, connection: str) -> ConnectionLog:
    return ConnectionLog(logger, {"connection": connection})


def configure_logging(level: str, log_format: Literal["text", "json"]) -> None:
    """The root logger's one handler (stderr), in the configured format."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
