"""Row encodings of core objects for the disk store: messages and sessions as JSON text.

Times are stored as wall-clock seconds so they keep their meaning across a restart; the core's
monotonic clock readings are converted at this boundary and nowhere else.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from kittiwake.broker.message import Message
from kittiwake.broker.store import SessionRecord, SubscriptionRecord


def message_properties_json(message: Message) -> str:
    """The optional parts of a message, as one JSON document (most are empty)."""
    doc: dict[str, Any] = {}
    if message.properties:
        doc["p"] = message.properties
    if message.user_properties:
        doc["u"] = message.user_properties
    if message.content_type is not None:
        doc["ct"] = message.content_type
    if message.response_topic is not None:
        doc["rt"] = message.response_topic
    if message.correlation_data is not None:
        doc["cd"] = base64.b64encode(message.correlation_data).decode()
    if message.payload_format_indicator is not None:
        doc["pf"] = message.payload_format_indicator
    return json.dumps(doc, separators=(",", ":")) if doc else ""


def apply_message_properties(message: Message, text: str) -> None:
    if not text:
        return
    doc = json.loads(text)
    message.properties = doc.get("p", {})
    message.user_properties = [tuple(pair) for pair in doc.get("u", [])]
    message.content_type = doc.get("ct")
    message.response_topic = doc.get("rt")
    if "cd" in doc:
        message.correlation_data = base64.b64decode(doc["cd"])
    message.payload_format_indicator = doc.get("pf")


def to_wall(clock_time: float | None, offset: float) -> float | None:
    return None if clock_time is None else clock_time + offset


def from_wall(wall_time: float | None, offset: float) -> float | None:
    return None if wall_time is None else wall_time - offset


def message_to_json(message: Message, offset: float) -> str:
    """A whole message in one JSON document (wills, retained copies)."""
    return json.dumps(
        {
            "t": message.topic,
            "b": base64.b64encode(message.payload).decode(),
            "q": message.qos,
            "r": message.retain,
            "s": message.persistent,
            "pr": message.priority,
            "e": to_wall(message.expiry, offset),
            "d": to_wall(message.delivery_time, offset),
            "c": to_wall(message.created, offset),
            "o": message.origin,
            "x": message_properties_json(message),
        },
        separators=(",", ":"),
    )


def message_from_json(text: str, offset: float) -> Message:
    doc = json.loads(text)
    message = Message(
        topic=doc["t"],
        payload=base64.b64decode(doc["b"]),
        qos=doc["q"],
        retain=doc["r"],
        persistent=doc["s"],
        priority=doc["pr"],
        expiry=from_wall(doc["e"], offset),
        delivery_time=from_wall(doc["d"], offset),
        created=from_wall(doc["c"], offset) or 0.0,
        origin=doc["o"],
    )
    apply_message_properties(message, doc["x"])
    return message


def session_to_json(record: SessionRecord, offset: float) -> str:
    return json.dumps(
        {
            "e": record.expiry_interval,
            "s": [
                [
                    s.topic_filter,
                    s.max_qos,
                    s.no_local,
                    s.retain_as_published,
                    s.retain_handling,
                    s.subscription_id,
                ]
                for s in record.subscriptions
            ],
            "w": None if record.will is None else message_to_json(record.will, offset),
            "wd": record.will_delay,
            "we": record.will_expiry,
            "iw": record.window,
        },
        separators=(",", ":"),
    )


def session_from_json(client_id: str, text: str, offset: float) -> SessionRecord:
    doc = json.loads(text)
    return SessionRecord(
        client_id=client_id,
        expiry_interval=doc["e"],
        subscriptions=[SubscriptionRecord(*row) for row in doc["s"]],
        will=None if doc["w"] is None else message_from_json(doc["w"], offset),
        will_delay=doc["wd"],
        will_expiry=doc["we"],
        # Absent in rows written before it existed: no connection counted as attached.
        window=doc.get("iw", 0),
    )
