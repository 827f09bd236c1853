"""The JSON log format: one object per line with the fields log collectors index."""

from __future__ import annotations

import json
import logging

from kittiwake.logs import JSONFormatter, connection_log


def formatted(logger_name: str, emit: callable) -> dict:  # type: ignore[valid-type]
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger(logger_name)
    handler = Keep()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        emit(logger)
    finally:
        logger.removeHandler(handler)
    (record,) = records
    line = JSONFormatter().format(record)
    assert "\n" not in line
    return json.loads(line)


def test_a_record_is_one_json_object_with_the_standard_fields() -> None:
    entry = formatted("kittiwake.test.plain", lambda log: log.warning("queue %s full", "q1"))
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "kittiwake.test.plain"
    assert entry["message"] == "queue q1 full"
    assert entry["timestamp"].endswith("Z") and "T" in entry["timestamp"]
    assert "connection" not in entry


def test_a_connection_record_carries_the_connection_id() -> None:
    entry = formatted(
        "kittiwake.test.connection",
        lambda log: connection_log(log, "sensor-7").info("client %s: keepalive", "sensor-7"),
    )
    assert entry["connection"] == "sensor-7"
    assert entry["message"] == "client sensor-7: keepalive"


def test_an_exception_keeps_its_traceback_in_the_object() -> None:
    def emit(log: logging.Logger) -> None:
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")

    entry = formatted("kittiwake.test.exception", emit)
    assert entry["message"] == "failed"
    assert "ValueError: boom" in entry["exception"]
