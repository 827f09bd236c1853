"""Routing from destinations to queues: topics and queues are separate namespaces, bindings
filter (topic filter, noLocal, selector) and each queue gets one copy of a message."""

from __future__ import annotations

from collections.abc import Sequence

from kittiwake.broker.destinations import Destination
from kittiwake.broker.message import Message, MessageProperties
from kittiwake.broker.queues import Queue, QueuedMessage
from kittiwake.broker.routing import Binding, Router


def router() -> Router:
    return Router(lambda name: Queue(name, max_messages=10, max_bytes=10_000))


def test_topics_and_queues_are_separate_namespaces() -> None:
    r = router()
    subscriber = r.queue("subscriber")
    r.bind(Binding("orders", subscriber))
    to_topic = r.route(Destination.topic("orders"), Message("orders", b"t"))
    to_queue = r.route(Destination.queue("orders"), Message("orders", b"q"))
    assert [q.name for q, _ in to_topic] == ["subscriber"]
    assert [q.name for q, _ in to_queue] == ["orders"]
    assert Destination.topic("orders") != Destination.queue("orders")
    assert str(Destination.queue("orders")) == "queue://orders"


def test_a_queue_is_created_on_first_use_and_kept() -> None:
    r = router()
    first = r.queue("q")
    assert r.queue("q") is first
    assert r.delete_queue("q") is first and "q" not in r.queues


def test_bindings_filter_by_topic_no_local_and_selector() -> None:
    r = router()
    mine, everyone, red = r.queue("mine"), r.queue("everyone"), r.queue("red")
    r.bind(Binding("a/+", mine, no_local=True, owner="me"))
    r.bind(Binding("a/#", everyone))
    def is_red(message: Message) -> bool:
        return message.properties is not None and message.properties.get("colour") == "red"

    r.bind(Binding("a/b", red, selector=is_red))
    own = Message("a/b", b"", origin="me", properties=MessageProperties.of({"colour": "red"}))
    other = Message("a/b", b"", origin="you", properties=MessageProperties.of({"colour": "blue"}))
    assert {q.name for q, _ in r.route(Destination.topic("a/b"), own)} == {"everyone", "red"}
    assert {q.name for q, _ in r.route(Destination.topic("a/b"), other)} == {"mine", "everyone"}


def test_a_queue_bound_twice_gets_one_copy_from_its_copy_rule() -> None:
    """Generic routing gives a queue one copy; how several bindings combine is the caller's
    rule (MQTT's lives with MQTT)."""
    r = router()
    q = r.queue("q")
    r.bind(Binding("a/#", q, max_qos=0))
    r.bind(Binding("a/b", q, max_qos=2))
    message = Message("a/b", b"", qos=2, persistent=True)
    ((queue, copy),) = r.route(Destination.topic("a/b"), message)
    assert queue is q and (copy.qos, copy.persistent) == (0, False)

    def highest(m: Message, bindings: Sequence[Binding]) -> QueuedMessage:
        return QueuedMessage.of(m, max(b.max_qos for b in bindings))

    ((_, copy),) = r.route(Destination.topic("a/b"), message, highest)
    assert (copy.qos, copy.persistent) == (2, True)


def test_unbind_stops_routing() -> None:
    r = router()
    q = r.queue("q")
    binding = Binding("x", q)
    r.bind(binding)
    assert r.unbind(binding)
    assert r.route(Destination.topic("x"), Message("x", b"")) == []
