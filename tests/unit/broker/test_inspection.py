"""The operators' views of the core (broker/inspection.py) and their actions: purge a queue,
delete an offline session; driven on the core alone with a memory store."""

from __future__ import annotations

from typing import Any

from kittiwake.broker import inspection
from kittiwake.broker.message import Message
from kittiwake.broker.queue_destinations import QueueDestinations
from kittiwake.broker.sessions import session_queue_name


def test_sessions_and_subscriptions_as_operators_see_them(harness: Any) -> None:
    online, _consumer, _ = harness.connect("online", expiry=60)
    harness.subscribe(online, "a/#", qos=1)
    harness.subscribe(online, "$share/g/b", qos=2)
    offline, _c, _ = harness.connect("offline", expiry=30)
    harness.subscribe(offline, "c", qos=1)
    harness.broker.disconnect(offline, publish_will=False)
    harness.publish("c", b"waiting", qos=1)
    harness.clock.advance(10)

    views = {view.client_id: view for view in inspection.sessions(harness.broker)}
    assert views["online"].connected and views["online"].expires_in is None
    assert views["online"].subscriptions == 2
    assert not views["offline"].connected
    assert views["offline"].queued == 1
    assert views["offline"].expires_in == 20
    subscriptions = inspection.subscriptions(harness.broker)
    assert [
        (s.client_id, s.topic_filter, s.shared_group, s.max_qos, s.durable, s.connected)
        for s in subscriptions
    ] == [
        ("offline", "c", None, 1, True, False),
        ("online", "a/#", None, 1, True, True),
        ("online", "b", "g", 2, True, True),
    ]


def test_queues_list_destinations_groups_and_sessions(harness: Any) -> None:
    destinations = QueueDestinations(harness.broker)
    destinations.send("orders", Message(topic="", payload=b"12345", qos=2, persistent=True))
    session, _consumer, _ = harness.connect("c1")
    harness.subscribe(session, "$share/workers/jobs", qos=1)
    views = inspection.queues(harness.broker, destinations)
    assert [(v.name, v.kind) for v in views][:1] == [("orders", "queue")]
    orders = views[0]
    assert (orders.depth, orders.bytes, orders.consumers, orders.durable) == (1, 5, 0, True)
    assert {v.kind for v in views} == {"queue", "shared", "session"}
    assert session_queue_name("c1") in {v.name for v in views}
    without = inspection.queues(harness.broker, destinations, session_queues=False)
    assert "session" not in {v.kind for v in without}


def test_retained_messages_with_their_expiry(harness: Any) -> None:
    harness.publish("r/1", b"abc", qos=1, retain=True)
    harness.publish("r/2", b"x", qos=0, retain=True, expiry_in=60)
    harness.clock.advance(15)
    assert [(v.topic, v.bytes, v.qos, v.persistent, v.expires_in) for v in
            inspection.retained(harness.broker)] == [
        ("r/1", 3, 1, True, None),
        ("r/2", 1, 0, False, 45),
    ]


def test_purge_removes_waiting_entries_from_queue_and_store(harness: Any) -> None:
    destinations = QueueDestinations(harness.broker)
    for n in range(3):
        destinations.send("work", Message(topic="", payload=b"%d" % n, qos=2, persistent=True))
    assert len(harness.store.queued) == 3
    assert destinations.purge("work") == 3
    assert destinations.queue("work").count == 0
    assert harness.store.queued == {}
    assert destinations.purge("work") == 0
    assert destinations.purge("never-made") is None
    assert "never-made" not in destinations.router.queues  # a purge creates nothing


def test_delete_session_only_without_a_connection(harness: Any) -> None:
    session, _consumer, _ = harness.connect(
        "durable", expiry=3600, will=Message(topic="will", payload=b"bye"), will_delay=600
    )
    harness.subscribe(session, "t", qos=1)
    watcher, watching, _ = harness.connect("watcher")
    harness.subscribe(watcher, "will")
    assert harness.broker.delete_session("durable") is None  # connected
    harness.broker.disconnect(session, publish_will=True)  # the will waits for its delay
    harness.publish("t", b"kept", qos=1)
    assert "durable" in harness.store.sessions
    assert harness.broker.delete_session("durable") is True
    assert "durable" not in harness.broker.sessions
    assert "durable" not in harness.store.sessions
    assert not [key for key in harness.store.queued if key[0] == session_queue_name("durable")]
    assert harness.broker.delete_session("durable") is False
    assert watching.payloads == []  # an operator's delete is not the client's last word
