"""Row encodings of core objects for the disk store: messages and sessions as JSON text.

Times are stored as wall-clock seconds so they keep their meaning across a restart; the core's
monotonic clock readings are converted at this boundary and nowhere else.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from kittiwake.broker.message import Message, MessageProperties, MQTT5Fields, PropertyType
from kittiwake.broker.store import SessionRecord, SubscriptionRecord


def message_properties_json(message: Message) -> str:
    """The optional parts of a message, as one JSON document (most are empty)."""
    doc: dict[str, Any] = {}
    if message.properties:
        doc["p"] = [[n, v, int(t)] for n, v, t in message.properties.typed_items()]
    fields = message.mqtt5
    if fields is not None:
        if fields.user_properties:
            doc["u"] = fields.user_properties
        if fields.content_type is not None:
            doc["ct"] = fields.content_type
        if fields.response_topic is not None:
            doc["rt"] = fields.response_topic
        if fields.correlation_data is not None:
            doc["cd"] = base64.b64encode(fields.correlation_data).decode()
        if fields.payload_format_indicator is not None:
            doc["pf"] = fields.payload_format_indicator
    return json.dumps(doc, separators=(",", ":")) if doc else ""


def apply_message_properties(message: Message, text: str) -> None:
    if not text:
        return
    doc = json.loads(text)
    if "p" in doc:
        message.properties = MessageProperties(
            (n, v, PropertyType(t)) for n, v, t in doc["p"]
        )
    if doc.keys() - {"p"}:
        message.mqtt5 = MQTT5Fields(
            doc.get("pf"),
            doc.get("ct"),
            doc.get("rt"),
            base64.b64decode(doc["cd"]) if "cd" in doc else None,
            [(name, value) for name, value in doc.get("u", [])],
        )


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
    )
