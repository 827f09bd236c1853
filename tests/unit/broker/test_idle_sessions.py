"""An idle session holds no queue and no consumer (issue 17: 10,000 idle connections in a few
KB each): they are made by its first subscription or delivery, with everything its connection
asked for until then, and nothing else in an idle connection's life makes them."""

from __future__ import annotations

from kittiwake.broker import inspection
from kittiwake.broker.message import Message
from kittiwake.broker.queues import QueueRules
from kittiwake.broker.sessions import Session, session_queue_name

HOUR = 3600


def assert_idle(session: Session) -> None:
    assert session.made_queue is None
    assert session.made_consumer is None


def test_idle_life_makes_no_queue(harness) -> None:
    """Connect, timers, inspection, a takeover with a will, a disconnect and a resumption:
    no queue, no consumer."""
    will = Message("wills/c", b"gone", qos=1, persistent=True)
    session, _, _ = harness.connect("c", expiry=HOUR, will=will, will_delay=5)
    assert_idle(session)
    harness.advance(30)  # ticks: timers, flow control, unattended queues
    views = inspection.sessions(harness.broker)
    assert [(v.client_id, v.queued, v.in_flight) for v in views] == [("c", 0, 0)]
    (queue_view,) = inspection.queues(harness.broker)
    assert (queue_view.name, queue_view.depth, queue_view.consumers, queue_view.durable) == (
        session_queue_name("c"),
        0,
        1,
        True,
    )
    again, _, present = harness.connect("c", clean_start=False, expiry=HOUR)  # takeover
    assert present is True and again is session
    harness.broker.disconnect(again, publish_will=True)
    (queue_view,) = inspection.queues(harness.broker)
    assert queue_view.consumers == 0
    harness.advance(10)
    resumed, _, present = harness.connect("c", clean_start=False, expiry=HOUR)
    assert present is True and resumed is session
    assert_idle(session)
    assert session.window == 100
    harness.broker.set_session_expiry(session, 0)
    harness.broker.disconnect(session, publish_will=False)
    assert "c" not in harness.broker.sessions
    assert_idle(session)


def test_first_subscription_makes_the_queue_as_the_connection_asked(harness) -> None:
    """The queue made by a later subscription is durable for a persistent session, its
    consumer has the connection's window and its receiver, and messages flow."""
    session, consumer, _ = harness.connect("c", expiry=HOUR, window=2)
    assert_idle(session)
    harness.subscribe(session, "t", qos=1)
    queue = session.made_queue
    assert queue is not None and session.made_consumer is not None
    assert queue.durable is True
    assert session.window == 2
    for n in range(3):
        harness.publish("t", b"m%d" % n, qos=1)
    assert consumer.payloads == [b"m0", b"m1"]  # the window of 2
    assert harness.ack(session, consumer, consumer.deliveries[0].delivery_id)
    assert consumer.payloads == [b"m0", b"m1", b"m2"]
    # Stored, as a persistent session's: the two not yet acknowledged.
    assert [key[0] for key in harness.store.queued] == [session_queue_name("c")] * 2


def test_queue_made_before_delivery_starts_gets_no_receiver_until_then(harness) -> None:
    """Nothing goes out before the connection is accepted, also from a queue made meanwhile."""
    session, consumer, _ = harness.connect("c", start=False)
    harness.subscribe(session, "t", qos=1)
    harness.publish("t", b"early", qos=1)
    assert consumer.payloads == []
    harness.broker.start_delivery(session)
    assert consumer.payloads == [b"early"]


def test_queue_rules_asked_at_connect_apply_when_the_queue_is_made(harness) -> None:
    rules = QueueRules(ordering="priority", dead_letters=True)
    session, consumer, _ = harness.connect("c", queue_rules=rules, window=1)
    assert_idle(session)
    harness.subscribe(session, "t", qos=1)
    queue = session.made_queue
    assert queue is not None
    assert queue.ordering == "priority"
    assert queue.on_removed == harness.broker._entry_given_up
    harness.publish("t", b"first", qos=1)
    harness.publish("t", b"low", qos=1, priority=1)
    harness.publish("t", b"high", qos=1, priority=9)
    assert harness.ack(session, consumer, consumer.deliveries[0].delivery_id)
    assert consumer.payloads == [b"first", b"high"]


def test_restart_makes_queues_only_for_stored_entries(harness) -> None:
    """Recovery makes the queue of a session with stored entries (delivered on resumption)
    and not that of one with none; the latter's first subscription makes it."""
    busy, _, _ = harness.connect("busy", expiry=HOUR)
    harness.subscribe(busy, "t", qos=1)
    harness.broker.disconnect(busy, publish_will=False)
    harness.publish("t", b"kept", qos=1)
    idle, _, _ = harness.connect("idle", expiry=HOUR)
    harness.broker.disconnect(idle, publish_will=False)
    restarted = harness.restart()
    assert_idle(restarted.broker.sessions["idle"])
    recovered = restarted.broker.sessions["busy"]
    assert recovered.made_queue is not None and recovered.made_queue.count == 1
    _, consumer, present = restarted.connect("busy", clean_start=False, expiry=HOUR)
    assert present is True
    assert consumer.payloads == [b"kept"]
    idle_again, idle_consumer, _ = restarted.connect("idle", clean_start=False, expiry=HOUR)
    assert_idle(idle_again)
    restarted.subscribe(idle_again, "u", qos=1)
    restarted.publish("u", b"now", qos=1)
    assert idle_consumer.payloads == [b"now"]


def test_shared_subscription_membership_makes_the_queue(harness) -> None:
    """A member shares its session's credit, which lives on the session's consumer."""
    session, consumer, _ = harness.connect("c", window=1)
    harness.subscribe(session, "$share/g/t", qos=1)
    assert session.made_consumer is not None
    harness.publish("t", b"a", qos=1)
    harness.publish("t", b"b", qos=1)
    assert consumer.payloads == [b"a"]
    assert harness.ack(session, consumer, consumer.deliveries[0].delivery_id)
    assert consumer.payloads == [b"a", b"b"]
