"""Temporary destinations as dynamic nodes: named by the broker, consumable only by their
connection, deleted with the link that made them or with the connection; sending to a deleted
one fails with amqp:not-found."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from proton import Data, Message
from proton.reactor import LinkOption
from proton.utils import BlockingConnection, LinkDetached

Connect = Callable[..., BlockingConnection]


class TemporaryTopic(LinkOption):
    """A dynamic source with the temporary-topic capability (what Qpid JMS asks for)."""

    def apply(self, link) -> None:  # type: ignore[no-untyped-def]
        capabilities = link.source.capabilities
        capabilities.put_array(False, Data.SYMBOL)
        capabilities.enter()
        capabilities.put_symbol("temporary-topic")
        capabilities.exit()


def test_request_reply_over_a_temporary_queue(amqp: Connect) -> None:
    requester = amqp()
    replies = requester.create_receiver(None, dynamic=True, credit=1)
    address = replies.link.remote_source.address
    assert address and address.startswith("$temp/queue/")
    # Another connection (the responder) may send to it...
    responder = amqp()
    responder.create_sender(address).send(Message(body="reply", correlation_id="c-1"))
    message = replies.receive(timeout=5)
    replies.accept()
    assert (message.body, message.correlation_id) == ("reply", "c-1")
    # ...but not consume from it.
    with pytest.raises(LinkDetached, match="another connection"):
        responder.create_receiver(address)


def test_deleted_with_its_connection(amqp: Connect) -> None:
    owner = amqp()
    address = owner.create_receiver(None, dynamic=True).link.remote_source.address
    owner.close()
    with pytest.raises(LinkDetached, match="not-found"):
        amqp().create_sender(address)


def test_deleted_with_its_link(amqp: Connect) -> None:
    owner = amqp()
    receiver = owner.create_receiver(None, dynamic=True, name="temp")
    address = receiver.link.remote_source.address
    receiver.close()
    with pytest.raises(LinkDetached, match="not-found"):
        owner.create_sender(address, name="late")


def test_temporary_topic(amqp: Connect) -> None:
    owner = amqp()
    receiver = owner.create_receiver(None, dynamic=True, credit=5, options=TemporaryTopic())
    address = receiver.link.remote_source.address
    assert address.startswith("$temp/topic/")
    amqp().create_sender(f"topic://{address}").send(Message(body="news"))
    assert receiver.receive(timeout=5).body == "news"
    receiver.accept()
