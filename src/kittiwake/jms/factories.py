"""JMS's message and destination factories, one set for a Session and a JMSContext of either
API (asyncio or blocking): they make plain objects and send nothing to the broker."""

from __future__ import annotations

from typing import Any

from kittiwake.jms.destinations import Queue, Topic
from kittiwake.jms.messages import (
    BytesMessage,
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
