"""The broker's message: everything MQTT and JMS need to say about one publication.

A Message is immutable once published; per-subscriber state (QoS granted, retain flag on the
wire, delivery count) lives in :class:`~kittiwake.broker.queues.QueuedMessage`, never here.
No protocol's wire form lives here either: front ends translate to and from these fields.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import IntEnum

# JMS default priority; MQTT has no priority, so every MQTT message carries this.
DEFAULT_PRIORITY = 4


class PropertyType(IntEnum):
    """The type of an application property value, as JMS declares it.

    Python has one int and one float, so the type cannot be read off a value: a JMS short and
    long that hold 7 must still come back as a short and a long. The numbers are the type tags
    of the stored encoding (see :mod:`kittiwake.store.codec`): never renumber them.
    """

    BOOLEAN = 1
    BYTE = 2
    SHORT = 3
    INT = 4
    LONG = 5
    FLOAT = 6
    DOUBLE = 7
    STRING = 8


PropertyValue = bool | int | float | str

# Inclusive ranges of the integer types.
_INTEGER_RANGES = {
    PropertyType.BYTE: (-(2**7), 2**7 - 1),
    PropertyType.SHORT: (-(2**15), 2**15 - 1),
    PropertyType.INT: (-(2**31), 2**31 - 1),
    PropertyType.LONG: (-(2**63), 2**63 - 1),
}
_FLOAT32 = struct.Struct(">f")


def natural_type(value: PropertyValue) -> PropertyType:
    """The type a value gets when none is declared: the one most senders mean."""
    if isinstance(value, bool):
        return PropertyType.BOOLEAN
    if isinstance(value, int):
        return PropertyType.INT if -(2**31) <= value < 2**31 else PropertyType.LONG
    if isinstance(value, float):
        return PropertyType.DOUBLE
    if isinstance(value, str):
        return PropertyType.STRING
    raise TypeError(f"a property value is a bool, int, float or str, not {type(value).__name__}")


def checked_value(value: PropertyValue, kind: PropertyType) -> PropertyValue:
    """``value`` as a property of type ``kind`` holds it, or TypeError/ValueError saying why not.

    A FLOAT is rounded to 32 bits here, so what is read back (from memory or disk) is exactly
    what a Java float holds.
    """
    if kind is PropertyType.BOOLEAN:
        if isinstance(value, bool):
            return value
    elif kind is PropertyType.STRING:
        if isinstance(value, str):
            return value
    elif kind is PropertyType.FLOAT or kind is PropertyType.DOUBLE:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
            if kind is PropertyType.FLOAT:
                try:
                    number = _FLOAT32.unpack(_FLOAT32.pack(number))[0]
                except OverflowError:
                    raise ValueError(f"{value!r} is out of range for a FLOAT property") from None
            return number
    elif isinstance(value, int) and not isinstance(value, bool):
        low, high = _INTEGER_RANGES[kind]
        if not low <= value <= high:
            raise ValueError(f"{value} is out of range for a {kind.name} property")
        return value
    raise TypeError(f"a {kind.name} property cannot hold {type(value).__name__} {value!r}")


class MessageProperties(Mapping[str, PropertyValue]):
    """Typed application properties: a mapping from name to value that also knows each type.

    Reading a value is a plain dict lookup (selectors read values, not types); the type is kept
    only where it differs from the value's :func:`natural_type` (a byte, short, long that fits
    in an int, or float), so the common string/int/boolean properties cost one dict entry each.
    """

    __slots__ = ("_types", "_values")

    def __init__(self, typed: Iterable[tuple[str, PropertyValue, PropertyType]] = ()) -> None:
        self._values: dict[str, PropertyValue] = {}
        # Only the names whose type is not their value's natural type.
        self._types: dict[str, PropertyType] = {}
        for name, value, kind in typed:
            self.set(name, value, kind)

    @classmethod
    def of(cls, values: Mapping[str, PropertyValue]) -> MessageProperties:
        """Properties with the natural type of each value."""
        properties = cls()
        for name, value in values.items():
            properties.set(name, value)
        return properties

    def set(self, name: str, value: PropertyValue, kind: PropertyType | None = None) -> None:
        """Set ``name`` to ``value`` of type ``kind`` (its natural type when None)."""
        natural = natural_type(value)
        if kind is None:
            kind = natural
        value = checked_value(value, kind)
        self._values[name] = value
        if kind is natural:
            self._types.pop(name, None)
        else:
            self._types[name] = kind

    def remove(self, name: str) -> None:
        del self._values[name]
        self._types.pop(name, None)

    def type_of(self, name: str) -> PropertyType:
        """The declared type of a property (KeyError when there is no such property)."""
        kind = self._types.get(name)
        return natural_type(self._values[name]) if kind is None else kind

    def typed_items(self) -> Iterator[tuple[str, PropertyValue, PropertyType]]:
        """(name, value, type) for every property, in the order they were first set."""
        types = self._types
        for name, value in self._values.items():
            kind = types.get(name)
            yield name, value, natural_type(value) if kind is None else kind

    def __getitem__(self, name: str) -> PropertyValue:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MessageProperties):
            return NotImplemented
        return self._values == other._values and self._types == other._types

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={v!r}:{t.name}" for n, v, t in self.typed_items())
        return f"MessageProperties({inner})"


@dataclass(slots=True)
class MQTT5Fields:
    """What only MQTT 5 says about a message, carried unchanged to MQTT 5 subscribers.

    Kept out of :class:`Message` so the core's own vocabulary stays small; a message without
    any of them carries None instead of this object (most messages: nothing is allocated).
    """

    payload_format_indicator: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    # Name/value string pairs in their wire order, repetitions allowed (MQTT-3.3.2-18);
    # unlike typed application properties they are never merged or reordered.
    user_properties: list[tuple[str, str]] = field(default_factory=list)


@dataclass(slots=True)
class AMQPFields:
    """What only AMQP says about a message, kept so an AMQP consumer gets it as it was sent
    after a restart or a move to a dead-letter queue (its JMS type, ids, body section).

    Opaque to the core: the AMQP front end writes and reads it. The body itself is the
    message's payload; ``body`` says how to make the body section from it again.
    """

    # The encoded sections before the body: message annotations, properties, application
    # properties (as received).
    head: bytes = b""
    # How the payload maps back to the body section (kittiwake.amqp.message_mapping.BodyKind).
    body: int = 0
    # The encoded footer, b"" for none.
    footer: bytes = b""


@dataclass(slots=True, eq=False)
class Message:
    """One publication as the core sees it, with no protocol's wire form."""

    topic: str
    payload: bytes
    # The publisher's reliability, on the MQTT scale: 0 at most once, 1 at least once,
    # 2 exactly once. JMS maps PERSISTENT to 2, NON_PERSISTENT to 1, acks disabled to 0.
    qos: int = 0
    retain: bool = False
    # Persistent messages go through the store before the publisher is acknowledged.
    persistent: bool = False
    priority: int = DEFAULT_PRIORITY
    # Absolute clock times (see kittiwake.clock); None = never expires / deliver now.
    expiry: float | None = None
    delivery_time: float | None = None
    # When the broker accepted it (clock time); message expiry is forwarded relative to it.
    created: float = 0.0
    # The wall-clock time it was sent, milliseconds since the epoch (JMSTimestamp). A front end
    # that brings the sender's sets it; else it is ``created`` read on the wall clock
    # (:func:`wall_timestamp`), taken only when something needs it (the store, a JMS
    # consumer): MQTT never does, so its publish path never pays for a second clock reading.
    timestamp: int = 0
    # The connection that published it, for noLocal; None for broker-made messages.
    origin: str | None = None
    # Typed application properties (JMS); None when there are none.
    properties: MessageProperties | None = None
    # MQTT 5's own fields, user properties included; None when there are none.
    mqtt5: MQTT5Fields | None = None
    # The broker's id for this message, also its journal sequence number: assigned when a
    # persistent message is stored, never reused; 0 = not stored.
    message_id: int = 0
    # Front ends memoize wire encodings here so a fan-out encodes once, not once per subscriber.
    encoded: dict[object, bytes] | None = None
    # Set while the commit that makes it durable is pending: stored copies are not dispatched
    # before it (persist -> acknowledge -> dispatch), whatever triggers a pump meanwhile.
    awaiting_commit: bool = False
    # AMQP's own sections around the body; None for a message that did not come from AMQP.
    amqp: AMQPFields | None = None
    # The message group it belongs to (JMSXGroupID, AMQP's group-id): a queue gives a group's
    # messages to one consumer at a time. None (nearly always) = no group.
    group_id: str | None = None

    @property
    def size(self) -> int:
        """Bytes this message costs a queue's byte budget (payload and topic dominate)."""
        return len(self.payload) + len(self.topic)

    @property
    def clears_retained(self) -> bool:
        """A zero-length MQTT publication clears its topic's retained message; an empty JMS
        message does not, and is not retained either (DESIGN.md §2). A message that came over
        AMQP carries its AMQP fields, so their presence tells the two apart."""
        return not self.payload and self.amqp is None

    def expired(self, now: float) -> bool:
        return self.expiry is not None and now >= self.expiry

    def remaining_expiry(self, now: float) -> int | None:
        """Whole seconds left before expiry, as MQTT 5 forwards it; None = no expiry."""
        if self.expiry is None:
            return None
        return max(0, int(self.expiry - now + 0.999))


def wall_timestamp(message: Message, clock_to_wall_ms: float) -> int:
    """The message's timestamp, taken from ``created`` when it has none yet, and kept.

    ``clock_to_wall_ms`` is ``clock.wall_ms() - clock.now() * 1000`` read once by the caller:
    the same offset for every message, so every copy of one message gets one timestamp.
    """
    timestamp = message.timestamp
    if not timestamp:
        timestamp = message.timestamp = round(message.created * 1000 + clock_to_wall_ms)
    return timestamp
