"""Sessions: clean start, session present, expiry, takeover, wills, the in-flight window,
acknowledgements, resending on reconnection, delivery ids and incoming QoS 2 (MQTT 5 §3.1, §4.3,
§4.4, §4.9)."""

from __future__ import annotations

import pytest

from kittiwake.broker.consumers import DeliveryState
from kittiwake.broker.message import Message
from kittiwake.broker.sessions import NEVER_EXPIRES, session_producer_name, session_queue_name

HOUR = 3600


def will(topic: str = "wills/c", payload: bytes = b"gone", **fields) -> Message:
    return Message(topic, payload, qos=1, persistent=True, **fields)


def watcher(h, topic_filter: str = "wills/#", qos: int = 1):
    session, consumer, _ = h.connect("watcher")
    h.subscribe(session, topic_filter, qos=qos)
    return consumer


# -- lifecycle -------------------------------------------------------------------------------


def test_new_session_is_not_present(harness) -> None:
    """A client with no session gets session present = 0 and a registered session."""
    session, _, present = harness.connect("c", clean_start=False, expiry=HOUR)
    assert present is False
    assert harness.broker.sessions["c"] is session
    assert session.consumer is not None and session.persistent


def test_persistent_session_is_stored_and_temporary_one_is_not(harness) -> None:
    """A session with an expiry interval is saved to the store; expiry 0 is not."""
    keep, _, _ = harness.connect("keep", expiry=HOUR)
    harness.subscribe(keep, "t", qos=1, subscription_id=5)
    harness.connect("temp", expiry=0)
    record = harness.store.sessions["keep"]
    assert record.expiry_interval == HOUR
    assert [(s.topic_filter, s.max_qos, s.subscription_id) for s in record.subscriptions] == [
        ("t", 1, 5)
    ]
    assert "temp" not in harness.store.sessions


def test_session_present_after_reconnect(harness) -> None:
    """Reconnecting with clean_start=0 to a live session: present = 1, subscriptions kept."""
    session, _, _ = harness.connect("c", expiry=HOUR)
    harness.subscribe(session, "t", qos=1)
    harness.broker.disconnect(session, publish_will=False)
    again, consumer, present = harness.connect("c", clean_start=False, expiry=HOUR)
    assert present is True
    assert again is session
    harness.publish("t", b"m", qos=1)
    assert consumer.payloads == [b"m"]


def test_clean_start_discards_the_old_session(harness) -> None:
    """clean_start=1 discards subscriptions, queued messages and stored state (MQTT-3.1.2-4)."""
    session, _, _ = harness.connect("c", expiry=HOUR)
    harness.subscribe(session, "t", qos=1)
    harness.broker.disconnect(session, publish_will=False)
    message = harness.publish("t", b"m", qos=1)
    assert (session_queue_name("c"), message.message_id) in harness.store.queued
    fresh, consumer, present = harness.connect("c", clean_start=True, expiry=HOUR)
    assert present is False
    assert fresh is not session
    assert fresh.subscriptions == {} and len(fresh.queue) == 0
    assert consumer.deliveries == []
    assert harness.store.queued == {}
    assert message.message_id not in harness.store.messages
    harness.publish("t", b"after", qos=1)
    assert consumer.deliveries == []


def test_expiry_zero_session_ends_at_disconnect(harness) -> None:
    """Session expiry 0: the session ends with the connection; no session is present later."""
    session, _, _ = harness.connect("c", expiry=0)
    harness.subscribe(session, "t", qos=1)
    harness.broker.disconnect(session, publish_will=False)
    assert "c" not in harness.broker.sessions
    _, _, present = harness.connect("c", clean_start=False, expiry=0)
    assert present is False


def test_session_expires_after_its_interval(harness) -> None:
    """A disconnected session lives for its expiry interval, then ends (tick after advance)."""
    session, _, _ = harness.connect("c", expiry=60)
    harness.subscribe(session, "t", qos=1)
    harness.broker.disconnect(session, publish_will=False)
    harness.publish("t", b"m", qos=1)
    harness.advance(59)
    assert harness.broker.sessions.get("c") is session
    harness.advance(1)
    assert "c" not in harness.broker.sessions
    assert "c" not in harness.store.sessions
    assert harness.store.queued == {} and harness.store.messages == {}
    _, consumer, present = harness.connect("c", clean_start=False, expiry=60)
    assert present is False
    assert consumer.deliveries == []


def test_reconnect_stops_the_expiry_timer(harness) -> None:
    """A session reconnected before its expiry does not expire while connected."""
    session, _, _ = harness.connect("c", expiry=60)
    harness.broker.disconnect(session, publish_will=False)
    harness.advance(30)
    harness.connect("c", clean_start=False, expiry=60)
    harness.advance(1000)
    assert harness.broker.sessions.get("c") is session


def test_never_expiring_session(harness) -> None:
    """Expiry 0xFFFFFFFF: the session never expires."""
    session, _, _ = harness.connect("c", expiry=NEVER_EXPIRES)
    harness.broker.disconnect(session, publish_will=False)
    harness.advance(10 * 365 * 24 * HOUR)
    assert harness.broker.sessions.get("c") is session


def test_set_session_expiry_to_zero_forgets_stored_state(harness) -> None:
    """A v5 DISCONNECT lowering expiry to 0 deletes the stored session; it then ends."""
    session, _, _ = harness.connect("c", expiry=HOUR)
    assert "c" in harness.store.sessions
    harness.broker.set_session_expiry(session, 0)
    assert "c" not in harness.store.sessions
    harness.broker.disconnect(session, publish_will=False)
    assert "c" not in harness.broker.sessions


def test_clients_connected_counter(harness) -> None:
    """stats.clients_connected follows connections, including takeovers."""
    a, _, _ = harness.connect("a", expiry=HOUR)
    harness.connect("b")
    harness.connect("a", clean_start=False, expiry=HOUR)  # takeover
    assert harness.broker.stats.clients_connected == 2
    harness.broker.disconnect(a, publish_will=False)
    harness.broker.disconnect(a, publish_will=False)  # a second disconnect is a no-op
    assert harness.broker.stats.clients_connected == 1


def test_assigned_client_ids_are_unique(harness) -> None:
    """assign_client_id never hands out an id already in use."""
    first = harness.broker.assign_client_id()
    harness.connect(first)
    second = harness.broker.assign_client_id()
    assert first != second
    assert second not in harness.broker.sessions


# -- takeover --------------------------------------------------------------------------------


def test_takeover_keeps_the_session(harness) -> None:
    """A second connection with the same id takes the session over: the old consumer is told,
    the session (subscriptions, in-flight messages) is kept with clean_start=0 (MQTT-3.1.4-3)."""
    session, old, _ = harness.connect("c", expiry=HOUR)
    harness.subscribe(session, "t", qos=1)
    harness.publish("t", b"unacked", qos=1)
    [sent] = old.deliveries
    again, new, present = harness.connect("c", clean_start=False, expiry=HOUR)
    assert old.taken_over_calls == 1
    assert present is True and again is session
    assert session.link is new
    [resent] = new.deliveries
    assert (resent.delivery_id, resent.payload) == (sent.delivery_id, b"unacked")
    assert resent.resend is True
    harness.publish("t", b"next", qos=1)
    assert old.payloads == [b"unacked"]
    assert new.payloads == [b"unacked", b"next"]


def test_takeover_with_clean_start_starts_afresh(harness) -> None:
    """Takeover with clean_start=1: the old consumer is told and the session is new."""
    session, old, _ = harness.connect("c", expiry=HOUR)
    harness.subscribe(session, "t", qos=1)
    fresh, _, present = harness.connect("c", clean_start=True, expiry=HOUR)
    assert old.taken_over_calls == 1
    assert present is False and fresh is not session and fresh.subscriptions == {}


def test_takeover_of_expiry_zero_session(harness) -> None:
    """Takeover of a session with expiry 0: it ended with the old connection, so the new one
    gets a new, registered session with session present = 0."""
    session, old, _ = harness.connect("c", expiry=0)
    harness.subscribe(session, "t")
    fresh, consumer, present = harness.connect("c", clean_start=False, expiry=0)
    assert old.taken_over_calls == 1
    assert present is False
    assert harness.broker.sessions.get("c") is fresh
    assert fresh.subscriptions == {}
    harness.subscribe(fresh, "t")
    harness.publish("t", b"m")
    assert consumer.payloads == [b"m"]


def test_takeover_publishes_undelayed_will(harness) -> None:
    """The taken-over connection closed without DISCONNECT: its will (no delay) is published."""
    watch = watcher(harness)
    harness.connect("c", expiry=HOUR, will=will())
    harness.connect("c", clean_start=False, expiry=HOUR)
    assert watch.payloads == [b"gone"]


def test_takeover_cancels_delayed_will(harness) -> None:
    """A new connection before the will delay passes means the will is never sent
    (MQTT-3.1.3-9)."""
    watch = watcher(harness)
    harness.connect("c", expiry=HOUR, will=will(), will_delay=30)
    harness.connect("c", clean_start=False, expiry=HOUR)
    harness.advance(100)
    assert watch.deliveries == []


# -- wills -----------------------------------------------------------------------------------


def test_will_published_on_abnormal_disconnect(harness) -> None:
    """A connection lost without DISCONNECT publishes the will at once (no delay)."""
    watch = watcher(harness)
    session, _, _ = harness.connect("c", will=will())
    harness.broker.disconnect(session, publish_will=True)
    [got] = watch.deliveries
    assert (got.topic, got.payload, got.qos) == ("wills/c", b"gone", 1)


def test_will_not_published_on_normal_disconnect(harness) -> None:
    """DISCONNECT with reason 0 (publish_will=False) deletes the will (MQTT-3.1.2-10)."""
    watch = watcher(harness)
    session, _, _ = harness.connect("c", expiry=60, will=will(), will_delay=10)
    harness.broker.disconnect(session, publish_will=False)
    harness.advance(100)  # past the delay and past the session's end
    assert watch.deliveries == []


def test_will_delay(harness) -> None:
    """A will with a delay is published once the delay has passed (tick after advance)."""
    watch = watcher(harness)
    session, _, _ = harness.connect("c", expiry=HOUR, will=will(), will_delay=30)
    harness.broker.disconnect(session, publish_will=True)
    harness.advance(29)
    assert watch.deliveries == []
    harness.advance(1)
    assert watch.payloads == [b"gone"]
    harness.advance(100)
    assert watch.payloads == [b"gone"]  # once only
    assert harness.broker.sessions.get("c") is session  # the session outlives the will


def test_will_delay_cancelled_by_reconnect(harness) -> None:
    """Reconnecting (clean_start=0) before the delay passes cancels the will (MQTT-3.1.3-9)."""
    watch = watcher(harness)
    session, _, _ = harness.connect("c", expiry=HOUR, will=will(), will_delay=30)
    harness.broker.disconnect(session, publish_will=True)
    harness.advance(10)
    harness.connect("c", clean_start=False, expiry=HOUR)
    harness.advance(100)
    assert watch.deliveries == []


def test_will_then_expiry_fire_in_turn_and_a_reconnect_rearms_both(harness) -> None:
    """Two timers of one offline session fire at their own times; after a reconnect and a new
    disconnect only the new times count (the old ones must not fire early)."""
    watch = watcher(harness)
    session, _, _ = harness.connect("c", expiry=20, will=will(), will_delay=10)
    harness.broker.disconnect(session, publish_will=True)
    harness.advance(5)
    session, _, _ = harness.connect("c", clean_start=False, expiry=20, will=will(), will_delay=10)
    harness.broker.disconnect(session, publish_will=True)
    harness.advance(9)  # 14 s after the first disconnect: its will time (10) has passed
    assert watch.deliveries == []
    harness.advance(1)
    assert watch.payloads == [b"gone"]
    harness.advance(9)
    assert harness.broker.sessions.get("c") is session  # expires 20 s after the second one
    harness.advance(1)
    assert "c" not in harness.broker.sessions


def test_will_published_at_session_end_when_expiry_is_shorter_than_delay(harness) -> None:
    """The will goes out when the delay passes or the session ends, whichever is first."""
    watch = watcher(harness)
    session, _, _ = harness.connect("c", expiry=5, will=will(), will_delay=60)
    harness.broker.disconnect(session, publish_will=True)
    harness.advance(4)
    assert watch.deliveries == []
    harness.advance(1)
    assert watch.payloads == [b"gone"]
    assert "c" not in harness.broker.sessions
    harness.advance(100)
    assert watch.payloads == [b"gone"]


def test_will_delay_with_expiry_zero_session_is_immediate(harness) -> None:
    """With session expiry 0 the session ends at disconnect, so a delayed will goes at once."""
    watch = watcher(harness)
    session, _, _ = harness.connect("c", expiry=0, will=will(), will_delay=60)
    harness.broker.disconnect(session, publish_will=True)
    assert watch.payloads == [b"gone"]


def test_will_with_expiry_interval(harness) -> None:
    """The will's message expiry counts from its publication; once past, it is not delivered
    to a session that was offline, and a retained will disappears."""
    offline, _, _ = harness.connect("offline", expiry=HOUR)
    harness.subscribe(offline, "wills/#", qos=1)
    harness.broker.disconnect(offline, publish_will=False)
    session, _, _ = harness.connect(
        "c", expiry=HOUR, will=will(retain=True), will_delay=10, will_expiry=30
    )
    harness.broker.disconnect(session, publish_will=True)
    harness.advance(10)
    published = harness.broker.retained.get("wills/c")
    assert published is not None
    assert published.expiry == harness.clock.now() + 30
    harness.advance(29)
    assert "wills/c" in harness.broker.retained
    harness.advance(1)
    assert "wills/c" not in harness.broker.retained
    _, consumer, _ = harness.connect("offline", clean_start=False, expiry=HOUR)
    assert consumer.deliveries == []


def test_reconnect_replaces_the_will(harness) -> None:
    """The will of the newest connection is the one that counts."""
    watch = watcher(harness)
    session, _, _ = harness.connect("c", expiry=HOUR, will=will(payload=b"first"), will_delay=5)
    harness.broker.disconnect(session, publish_will=True)
    harness.connect("c", clean_start=False, expiry=HOUR, will=will(payload=b"second"))
    harness.broker.disconnect(session, publish_will=True)
    assert watch.payloads == [b"second"]


# -- the in-flight window and acknowledgements -----------------------------------------------


def test_inflight_window_is_respected(harness) -> None:
    """No more than session.window QoS>0 deliveries are unacknowledged at once; the rest wait."""
    session, consumer, _ = harness.connect("c", window=2)
    harness.subscribe(session, "t", qos=1)
    for i in range(5):
        harness.publish("t", bytes([48 + i]), qos=1)
    assert consumer.payloads == [b"0", b"1"]
    assert len(session.inflight) == 2 and len(session.queue) == 3


def test_acknowledge_releases_the_window_and_pumps(harness) -> None:
    """PUBACK frees a slot in the window and the next queued message goes out at once."""
    session, consumer, _ = harness.connect("c", window=2)
    harness.subscribe(session, "t", qos=1)
    for i in range(4):
        harness.publish("t", bytes([48 + i]), qos=1)
    first = consumer.deliveries[0].delivery_id
    assert harness.ack(session, consumer, first) is True
    assert consumer.payloads == [b"0", b"1", b"2"]
    assert harness.ack(session, consumer, first) is False  # already acknowledged
    while session.inflight:
        harness.broker.acknowledge(session, next(iter(session.inflight.values())))
    assert consumer.payloads == [b"0", b"1", b"2", b"3"]
    assert session.inflight == {} and len(session.queue) == 0


def test_qos0_ignores_the_window(harness) -> None:
    """QoS 0 deliveries never wait for the window (they are not in flight)."""
    session, consumer, _ = harness.connect("c", window=1)
    harness.subscribe(session, "q1", qos=1)
    harness.subscribe(session, "q0", qos=0)
    harness.publish("q1", b"a", qos=1)
    harness.publish("q1", b"b", qos=1)
    harness.publish("q0", b"z", qos=0)
    assert consumer.payloads == [b"a", b"z"]


def test_window_is_capped_by_max_inflight(make_harness) -> None:
    """The window is the lower of the client's Receive Maximum and limits.max_inflight, >= 1."""
    h = make_harness(limits={"max_inflight": 3})
    assert h.connect("a", window=10)[0].window == 3
    assert h.connect("b", window=2)[0].window == 2
    assert h.connect("c", window=0)[0].window == 1


def test_acknowledge_releases_the_stored_reference(harness) -> None:
    """Once a persistent session acknowledges a persistent message, the store forgets it."""
    session, consumer, _ = harness.connect("c", expiry=HOUR)
    harness.subscribe(session, "t", qos=1)
    message = harness.publish("t", b"m", qos=1)
    record = harness.store.queued[(session_queue_name("c"), message.message_id)]
    [got] = consumer.deliveries
    assert (record.state, record.delivery_id) == ("sent", got.delivery_id)
    harness.ack(session, consumer, got.delivery_id)
    assert harness.store.queued == {} and harness.store.messages == {}


def test_qos2_received_then_acknowledge(harness) -> None:
    """QoS 2 outbound: PUBREC (received) keeps the slot until PUBCOMP (acknowledge)."""
    session, consumer, _ = harness.connect("c", expiry=HOUR, window=1)
    harness.subscribe(session, "t", qos=2)
    message = harness.publish("t", b"a", qos=2)
    harness.publish("t", b"b", qos=2)
    [got] = consumer.deliveries
    assert harness.received(session, consumer, got.delivery_id) is True
    assert consumer.delivery(got.delivery_id).state is DeliveryState.RECEIVED
    assert harness.store.queued[(session_queue_name("c"), message.message_id)].state == "received"
    assert consumer.payloads == [b"a"]  # PUBREC does not free the window
    assert harness.received(session, consumer, 999) is False
    assert harness.ack(session, consumer, got.delivery_id) is True
    assert consumer.payloads == [b"a", b"b"]
    assert (session_queue_name("c"), message.message_id) not in harness.store.queued


def test_start_delivery_resends_inflight(harness) -> None:
    """On reconnection, unacknowledged deliveries are resent under the same id with
    resend=True (DUP), QoS 2 deliveries past PUBREC get their PUBREL again, then the queue
    follows (MQTT-4.4.0-1)."""
    session, first, _ = harness.connect("c", expiry=HOUR, window=2)
    harness.subscribe(session, "t", qos=2)
    for p in (b"sent", b"recvd", b"queued"):
        harness.publish("t", p, qos=2)
    sent, recvd = first.deliveries
    harness.received(session, first, recvd.delivery_id)
    harness.broker.disconnect(session, publish_will=False)
    _, consumer, present = harness.connect(
        "c", clean_start=False, expiry=HOUR, window=2, start=False
    )
    assert present and consumer.deliveries == []  # nothing before start_delivery (CONNACK)
    harness.broker.start_delivery(session)
    assert consumer.releases == [recvd.delivery_id]
    [again] = consumer.deliveries
    assert (again.delivery_id, again.payload, again.resend) == (sent.delivery_id, b"sent", True)
    harness.ack(session, consumer, recvd.delivery_id)
    assert [(d.payload, d.resend) for d in consumer.deliveries] == [
        (b"sent", True), (b"queued", False),
    ]


def test_start_delivery_without_consumer_is_harmless(harness) -> None:
    """start_delivery on a detached session does nothing."""
    session, _, _ = harness.connect("c", expiry=HOUR)
    harness.broker.disconnect(session, publish_will=False)
    harness.broker.start_delivery(session)


# -- delivery ids ----------------------------------------------------------------------------


def test_core_delivery_ids_are_plain_ints_never_reused_while_in_flight(harness) -> None:
    """Over more than 65535 deliveries, with one stuck in flight throughout, the core's
    delivery ids keep counting (they are not 16-bit packet ids: the front end maps those)."""
    session, consumer, _ = harness.connect("c", window=3)
    harness.subscribe(session, "t", qos=1)
    harness.publish("t", b"stuck", qos=1)
    stuck = consumer.deliveries[0].delivery
    assert stuck is not None
    seen = {stuck.id}
    for _ in range(0xFFFF + 10):
        harness.publish("t", b"m", qos=1)
        d = consumer.deliveries.pop()
        assert d.delivery is not None and d.delivery.id not in seen
        seen.add(d.delivery.id)
        assert harness.broker.acknowledge(session, d.delivery)
    assert max(seen) > 0xFFFF
    assert list(session.inflight.values()) == [stuck]


# -- incoming QoS 2 --------------------------------------------------------------------------


def test_incoming_qos2_begin_and_release(harness) -> None:
    """An incoming QoS 2 id is accepted once; a resend before PUBREL is refused (not routed
    twice); after PUBREL the id may be used again (MQTT-4.3.3-10)."""
    session, _, _ = harness.connect("c")
    assert harness.broker.begin_exactly_once(session, 7) is True
    assert harness.broker.begin_exactly_once(session, 7) is False
    assert harness.broker.begin_exactly_once(session, 8) is True
    assert harness.broker.end_exactly_once(session, 7)[0] is True
    assert harness.broker.end_exactly_once(session, 7)[0] is False
    assert session.exactly_once_keys == {8}
    assert harness.broker.begin_exactly_once(session, 7) is True


def test_incoming_qos2_state_is_stored_for_persistent_sessions(harness) -> None:
    """A persistent session's incoming QoS 2 ids survive in the store until released."""
    session, _, _ = harness.connect("c", expiry=HOUR)
    harness.broker.begin_exactly_once(session, 7)
    producer = session_producer_name("c")
    assert harness.store.duplicates == {producer: {7}}
    harness.broker.end_exactly_once(session, 7)
    assert harness.store.duplicates == {producer: set()}
    temp, _, _ = harness.connect("t", expiry=0)
    harness.broker.begin_exactly_once(temp, 1)
    assert session_producer_name("t") not in harness.store.duplicates


def test_incoming_qos2_state_kept_across_reconnect_and_dropped_by_clean_start(harness) -> None:
    """The exactly-once state belongs to the session: kept on resume, gone with clean start."""
    session, _, _ = harness.connect("c", expiry=HOUR)
    harness.broker.begin_exactly_once(session, 7)
    harness.broker.disconnect(session, publish_will=False)
    resumed, _, _ = harness.connect("c", clean_start=False, expiry=HOUR)
    assert harness.broker.begin_exactly_once(resumed, 7) is False
    harness.broker.disconnect(resumed, publish_will=False)
    fresh, _, _ = harness.connect("c", clean_start=True, expiry=HOUR)
    assert harness.broker.begin_exactly_once(fresh, 7) is True


# -- restart (a new Broker over the same store) ----------------------------------------------


@pytest.fixture
def restarted(harness):
    """Build state in one broker, then hand back a second broker recovered from its store."""
    session, consumer, _ = harness.connect("c", expiry=HOUR, window=1)
    harness.subscribe(session, "t", qos=2, subscription_id=3)
    harness.publish("t", b"inflight", qos=2)
    harness.publish("t", b"queued", qos=1)
    harness.publish("t", b"volatile", qos=1, persistent=False)
    harness.publish("r/p", b"kept", qos=1, retain=True)
    harness.publish("r/np", b"lost", qos=0, retain=True)
    harness.broker.begin_exactly_once(session, 42)
    return harness.restart(), consumer.deliveries[0].delivery_id


def test_restart_keeps_persistent_state(restarted) -> None:
    """Persistent messages survive a restart until acknowledged; the session, its
    subscriptions and incoming QoS 2 ids come back; nonpersistent messages do not."""
    h, inflight_id = restarted
    session, consumer, present = h.connect("c", clean_start=False, expiry=HOUR, window=1)
    assert present
    assert set(session.subscriptions) == {"t"}
    assert h.broker.begin_exactly_once(session, 42) is False
    [again] = consumer.deliveries
    assert (again.delivery_id, again.payload, again.resend) == (inflight_id, b"inflight", True)
    h.ack(session, consumer, inflight_id)
    assert consumer.payloads == [b"inflight", b"queued"]
    h.ack(session, consumer, consumer.deliveries[-1].delivery_id)
    assert consumer.payloads == [b"inflight", b"queued"]  # b"volatile" was not persistent
    assert h.store.queued == {}


def test_restart_keeps_only_persistent_retained(restarted) -> None:
    """A persistent retained message survives a restart; a nonpersistent one does not."""
    h, _ = restarted
    assert "r/p" in h.broker.retained
    assert "r/np" not in h.broker.retained


def test_subscriptions_and_memberships_are_each_sessions_own(harness) -> None:
    """A session's subscriptions and shared-group memberships are made by its first one (an
    idle session holds a read-only empty view): another session's never show in it, and
    they go again with unsubscribing and the session's end."""
    h = harness
    busy, consumer, _ = h.connect("busy")
    idle, _, _ = h.connect("idle")
    h.subscribe(busy, "a/b", qos=1)
    h.subscribe(busy, "$share/g/c", qos=1)
    assert set(busy.subscriptions) == {"a/b", "$share/g/c"}
    assert set(busy.members) == {"$share/g/c"}
    assert idle.subscriptions == {} and idle.members == {}
    with pytest.raises(TypeError):
        idle.subscriptions["x"] = busy.subscriptions["a/b"]  # type: ignore[index]
    h.publish("a/b", b"1", qos=1)
    h.publish("c", b"2", qos=1)
    assert sorted(consumer.payloads) == [b"1", b"2"]
    assert h.broker.unsubscribe(busy, "$share/g/c")[0] is True
    assert h.broker.unsubscribe(busy, "$share/g/c")[0] is False
    assert h.broker.unsubscribe(idle, "a/b")[0] is False
    assert set(busy.subscriptions) == {"a/b"} and busy.members == {}
    h.broker.disconnect(busy, publish_will=False)
    fresh, _, present = h.connect("busy")
    assert present is False and fresh.subscriptions == {}
