"""JMS's message and destination factories, one set for a Session and a JMSContext of either
API (asyncio or blocking), and JMS 2.0's producer settings: they make plain objects and send
nothing to the broker."""

from __future__ import annotations

from typing import Any, Self

from kittiwake.jms.destinations import Queue, Topic
from kittiwake.jms.messages import (
    DEFAULT_PRIORITY,
    BytesMessage,
    DeliveryMode,
    MapMessage,
    Message,
    ObjectMessage,
    StreamMessage,
    TextMessage,
)


class MessageFactory:
    """Mixed into the classes that create messages; each says whether its connection
    factory allows pickled ObjectMessage bodies."""

    __slots__ = ()

    def _allows_pickle(self) -> bool:
        raise NotImplementedError

    def create_message(self) -> Message:
        return Message()

    def create_text_message(self, text: str | None = None) -> TextMessage:
        return TextMessage(text)

    def create_bytes_message(self) -> BytesMessage:
        return BytesMessage()

    def create_map_message(self) -> MapMessage:
        return MapMessage()

    def create_stream_message(self) -> StreamMessage:
        return StreamMessage()

    def create_object_message(self, value: Any = None) -> ObjectMessage:
        return ObjectMessage(value, allow_pickle=self._allows_pickle())

    def create_queue(self, name: str) -> Queue:
        return Queue(name)

    def create_topic(self, name: str) -> Topic:
        return Topic(name)


class ProducerSettings:
    """JMS 2.0's JMSProducer settings (chained setters) and the message a ``send(destination,
    body)`` makes of its body, one copy for both APIs' JMSProducer."""

    def __init__(self) -> None:
        self.delivery_mode = DeliveryMode.PERSISTENT
        self.priority = DEFAULT_PRIORITY
        self.time_to_live = 0
        self.delivery_delay = 0
        self.properties: dict[str, Any] = {}

    def set_delivery_mode(self, mode: DeliveryMode) -> Self:
        self.delivery_mode = mode
        return self

    def set_priority(self, priority: int) -> Self:
        self.priority = priority
        return self

    def set_time_to_live(self, milliseconds: int) -> Self:
        self.time_to_live = milliseconds
        return self

    def set_delivery_delay(self, milliseconds: int) -> Self:
        self.delivery_delay = milliseconds
        return self

    def set_property(self, name: str, value: Any) -> Self:
        self.properties[name] = value
        return self

    def message_of(self, body: Message | str | bytes | dict[str, Any] | None) -> Message:
        """A Message as it is, a str as a TextMessage, bytes as a BytesMessage, a dict as a
        MapMessage, None as an empty Message; with this producer's properties set."""
        message: Message
        if isinstance(body, Message):
            message = body
        elif isinstance(body, str):
            message = TextMessage(body)
        elif isinstance(body, bytes):
            message = BytesMessage(body)
        elif isinstance(body, dict):
            message = MapMessage(body)
        else:
            message = Message()
        for name, value in self.properties.items():
            message.set_object_property(name, value)
        return message
