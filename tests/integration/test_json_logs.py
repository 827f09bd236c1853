"""log_format = "json": every line the broker writes is one JSON object, and records about a
connection carry its id."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .brokerproc import BrokerProcess
from .clients import unique


def test_every_line_is_json_and_connection_records_name_the_client(
    broker: Callable[..., BrokerProcess], paho: Callable[..., Any]
) -> None:
    process = broker(log_format="json")
    client_id = unique("json-log")
    client = paho(process.address, client_id)
    client.disconnect()
    process.stop()
    entries = [json.loads(line) for line in process.log_text().splitlines() if line.strip()]
    assert entries
    for entry in entries:
        assert {"timestamp", "level", "logger", "message"} <= entry.keys()
    assert any(entry["message"].startswith("kittiwake ") and entry["level"] == "INFO"
               for entry in entries)
    mine = [entry for entry in entries if entry.get("connection") == client_id]
    assert mine, "no record names the client's connection"
    assert all(entry["logger"].startswith("kittiwake.mqtt") for entry in mine)
