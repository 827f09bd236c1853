"""Retained messages (DESIGN.md §2, MQTT 5 §3.3.1.3 and §3.8.3.1 retain handling)."""

from __future__ import annotations

from kittiwake.broker.message import Message
from kittiwake.broker.retained import RetainedMessages

# -- the RetainedMessages table on its own ---------------------------------------------------


def test_update_keeps_one_per_topic_and_returns_the_replaced() -> None:
    """One retained message per topic; the newest replaces the older and is handed back."""
    retained = RetainedMessages()
    first = Message("a/b", b"1", retain=True)
    second = Message("a/b", b"2", retain=True)
    assert retained.update(first) is None
    assert retained.update(second) is first
    assert len(retained) == 1
    assert retained.get("a/b") is second
    assert "a/b" in retained


def test_empty_payload_clears_and_is_not_retained() -> None:
    """A zero-length retained publication clears the topic and is not itself kept."""
    retained = RetainedMessages()
    kept = Message("a", b"1", retain=True)
    retained.update(kept)
    assert retained.update(Message("a", b"", retain=True)) is kept
    assert len(retained) == 0
    assert retained.get("a") is None
    # Clearing a topic that has nothing is harmless.
    assert retained.update(Message("a", b"", retain=True)) is None
    assert len(retained) == 0


def test_matching_literal_and_wildcards() -> None:
    """A filter sees the retained messages of every topic it matches, and only those."""
    retained = RetainedMessages()
    for topic in ("a/b", "a/c", "a/b/c", "x", "$SYS/up"):
        retained.update(Message(topic, topic.encode(), retain=True))
    topics = lambda f: sorted(m.topic for m in retained.matching(f, 0.0))  # noqa: E731
    assert topics("a/b") == ["a/b"]
    assert topics("a/+") == ["a/b", "a/c"]
    assert topics("a/#") == ["a/b", "a/b/c", "a/c"]
    assert topics("#") == ["a/b", "a/b/c", "a/c", "x"]
    assert topics("$SYS/#") == ["$SYS/up"]
    assert topics("nothing") == []


def test_matching_hides_expired_and_remove_expired_drops_them() -> None:
    """An expired message is invisible at once and removed (and returned) by remove_expired."""
    retained = RetainedMessages()
    short = Message("a", b"1", retain=True, expiry=10.0)
    forever = Message("b", b"2", retain=True)
    retained.update(short)
    retained.update(forever)
    assert retained.matching("a", 9.9) == [short]
    assert retained.matching("a", 10.0) == []
    assert retained.matching("#", 10.0) == [forever]
    assert retained.remove_expired(9.0) == []
    assert retained.remove_expired(10.0) == [short]
    assert len(retained) == 1 and "a" not in retained


# -- through the broker ----------------------------------------------------------------------


def test_newest_replaces_older(harness) -> None:
    """A subscriber arriving after two retained publications gets only the newest."""
    harness.publish("t", b"old", retain=True)
    harness.publish("t", b"new", retain=True)
    session, consumer, _ = harness.connect("sub")
    harness.subscribe(session, "t")
    assert consumer.payloads == [b"new"]


def test_retained_at_subscribe_has_retain_flag(harness) -> None:
    """A retained message sent because of a subscription carries RETAIN=1."""
    harness.publish("t", b"r", qos=1, retain=True)
    session, consumer, _ = harness.connect("sub")
    harness.subscribe(session, "t", qos=1)
    [got] = consumer.deliveries
    assert got.retain is True
    assert got.qos == 1


def test_live_delivery_clears_retain_flag(harness) -> None:
    """A retained publication delivered live (to an existing subscription) has RETAIN=0."""
    session, consumer, _ = harness.connect("sub")
    harness.subscribe(session, "t")
    harness.publish("t", b"r", retain=True)
    [got] = consumer.deliveries
    assert got.retain is False


def test_retain_as_published_keeps_flag_live(harness) -> None:
    """With retain_as_published the live copy keeps the publisher's RETAIN flag."""
    session, consumer, _ = harness.connect("sub")
    harness.subscribe(session, "t", retain_as_published=True)
    harness.publish("t", b"r", retain=True)
    harness.publish("t", b"plain", retain=False)
    assert [(d.payload, d.retain) for d in consumer.deliveries] == [
        (b"r", True),
        (b"plain", False),
    ]


def test_zero_length_clears_and_is_still_delivered_live(harness) -> None:
    """An empty retained publish clears the topic but still reaches current subscribers."""
    harness.publish("t", b"r", retain=True)
    session, consumer, _ = harness.connect("live")
    harness.subscribe(session, "t")
    consumer.clear()
    harness.publish("t", b"", retain=True)
    assert consumer.payloads == [b""]
    assert len(harness.broker.retained) == 0
    late, late_consumer, _ = harness.connect("late")
    harness.subscribe(late, "t")
    assert late_consumer.deliveries == []


def test_subscription_qos_caps_retained_delivery(harness) -> None:
    """Retained messages obey the delivery rule: QoS 2 retained to a QoS 1 subscription is 1."""
    harness.publish("t", b"r", qos=2, retain=True)
    session, consumer, _ = harness.connect("sub")
    harness.subscribe(session, "t", qos=1)
    [got] = consumer.deliveries
    assert (got.qos, got.entry.persistent) == (1, True)


def test_wildcard_subscription_gets_every_matching_retained(harness) -> None:
    """A wildcard subscription receives the retained message of each matching topic."""
    for topic in ("home/a", "home/b", "office/a"):
        harness.publish(topic, topic.encode(), retain=True)
    session, consumer, _ = harness.connect("sub")
    harness.subscribe(session, "home/+")
    assert sorted(consumer.payloads) == [b"home/a", b"home/b"]
    assert all(d.retain for d in consumer.deliveries)


def test_retain_handling_0_sends_on_every_subscribe(harness) -> None:
    """Retain handling 0: retained messages are sent at each subscribe, new or replacing."""
    harness.publish("t", b"r", retain=True)
    session, consumer, _ = harness.connect("sub")
    assert harness.subscribe(session, "t", retain_handling=0).new is True
    assert harness.subscribe(session, "t", retain_handling=0).new is False
    assert consumer.payloads == [b"r", b"r"]


def test_retain_handling_1_sends_only_for_a_new_subscription(harness) -> None:
    """Retain handling 1: sent only if the subscription did not exist already."""
    harness.publish("t", b"r", retain=True)
    session, consumer, _ = harness.connect("sub")
    harness.subscribe(session, "t", retain_handling=1)
    harness.subscribe(session, "t", retain_handling=1)
    assert consumer.payloads == [b"r"]


def test_retain_handling_2_never_sends(harness) -> None:
    """Retain handling 2: retained messages are never sent at subscribe time."""
    harness.publish("t", b"r", retain=True)
    session, consumer, _ = harness.connect("sub")
    harness.subscribe(session, "t", retain_handling=2)
    assert consumer.deliveries == []
    harness.publish("t", b"live", retain=True)
    assert consumer.payloads == [b"live"]


def test_shared_subscription_gets_no_retained(harness) -> None:
    """Shared subscriptions never receive retained messages at subscribe time (MQTT-4.8.2)."""
    harness.publish("t", b"r", retain=True)
    session, consumer, _ = harness.connect("sub")
    harness.subscribe(session, "$share/g/t", qos=1)
    assert consumer.deliveries == []


def test_no_local_does_not_filter_retained(harness) -> None:
    """DESIGN.md §2: noLocal does not filter retained messages sent at subscribe time."""
    session, consumer, _ = harness.connect("me")
    harness.publish("t", b"mine", retain=True, origin="me")
    harness.subscribe(session, "t", no_local=True)
    assert consumer.payloads == [b"mine"]


def test_expired_retained_is_not_sent_and_tick_removes_it(harness) -> None:
    """A retained message with an expiry is not sent once expired and tick removes it."""
    harness.publish("t", b"r", retain=True, expiry_in=10)
    harness.clock.advance(10)
    session, consumer, _ = harness.connect("sub")
    harness.subscribe(session, "t")
    assert consumer.deliveries == []
    assert "t" in harness.broker.retained  # still there until the timers run
    harness.broker.tick()
    assert "t" not in harness.broker.retained


def test_retained_before_expiry_is_sent(harness) -> None:
    """Until its expiry a retained message is delivered and kept across ticks."""
    harness.publish("t", b"r", retain=True, expiry_in=10)
    harness.advance(9)
    assert "t" in harness.broker.retained
    session, consumer, _ = harness.connect("sub")
    harness.subscribe(session, "t")
    assert consumer.payloads == [b"r"]


def test_persistent_retained_goes_to_the_store(harness) -> None:
    """A persistent retained message is stored; a nonpersistent one is not."""
    persistent = harness.publish("p", b"1", qos=1, retain=True)
    harness.publish("np", b"2", qos=0, retain=True)
    assert harness.store.recover().retained == {"p": persistent}


def test_nonpersistent_replacing_persistent_clears_the_store(harness) -> None:
    """A nonpersistent retained message replacing a persistent one clears the stored copy."""
    harness.publish("t", b"1", qos=1, retain=True)
    assert "t" in harness.store.retained
    harness.publish("t", b"2", qos=0, retain=True)
    assert "t" not in harness.store.retained
    assert harness.broker.retained.get("t").payload == b"2"


def test_persistent_replacing_persistent_updates_the_store(harness) -> None:
    """The stored retained copy follows the newest persistent publication."""
    harness.publish("t", b"1", qos=1, retain=True)
    newer = harness.publish("t", b"2", qos=2, retain=True)
    assert harness.store.retained == {"t": newer}


def test_zero_length_clears_the_stored_copy(harness) -> None:
    """An empty retained publish clears the stored retained message too."""
    harness.publish("t", b"1", qos=1, retain=True)
    harness.publish("t", b"", qos=1, retain=True)
    assert harness.store.retained == {}
    assert len(harness.broker.retained) == 0


def test_expiry_clears_the_stored_copy(harness) -> None:
    """When a persistent retained message expires, tick removes the stored copy as well."""
    harness.publish("t", b"1", qos=1, retain=True, expiry_in=5)
    assert "t" in harness.store.retained
    harness.advance(5)
    assert harness.store.retained == {}
    assert len(harness.broker.retained) == 0


def test_retained_at_subscribe_carries_the_subscription_id(harness) -> None:
    """A retained message sent because of a subscription carries that subscription's id."""
    harness.publish("t", b"r", retain=True)
    session, consumer, _ = harness.connect("sub")
    harness.subscribe(session, "t", subscription_id=42)
    [got] = consumer.deliveries
    assert got.entry.subscription_ids == (42,)


def test_nonpersistent_retained_is_not_stored(harness) -> None:
    """A nonpersistent retained message (QoS 0) never reaches the store (DESIGN.md §2)."""
    harness.publish("t", b"r", qos=0, retain=True)
    assert harness.store.retained == {}
    assert harness.broker.retained.get("t").payload == b"r"


def test_an_empty_jms_message_neither_clears_nor_is_retained() -> None:
    """DESIGN.md §2: only MQTT's zero-length retained publish clears."""
    from kittiwake.broker.message import AMQPFields

    retained = RetainedMessages()
    kept = Message(topic="t", payload=b"on", qos=1, retain=True)
    retained.update(kept)
    empty_jms = Message(topic="t", payload=b"", qos=1, retain=True, amqp=AMQPFields())
    assert retained.update(empty_jms) is None
    assert retained.get("t") is kept
    assert retained.update(Message(topic="t", payload=b"", qos=1, retain=True)) is kept
    assert retained.get("t") is None


# -- the cursor: retained messages sent as the window opens -----------------------------------


def test_a_cursor_walks_only_matching_topics_and_tolerates_changes_meanwhile() -> None:
    """The tree is walked lazily: topics removed before the cursor reaches them are skipped,
    and a topic retained after the cursor started is left out (its subscriber got it live)."""
    retained = RetainedMessages()
    for topic in ("a/1", "a/2", "a/3", "b/1", "$SYS/x"):
        retained.update(Message(topic, topic.encode(), retain=True))
    cursor = retained.cursor("#")
    first = next(cursor)
    assert first.topic == "a/1"
    retained.update(Message("a/2", b"", retain=True))  # cleared before it is reached
    retained.update(Message("a/4", b"new", retain=True))  # set after the cursor started
    retained.update(Message("a/3", b"replaced", retain=True))  # replaced: went out live
    assert [m.topic for m in cursor] == ["b/1"]
    assert sorted(m.topic for m in retained.cursor("+/+")) == ["a/1", "a/3", "a/4", "b/1"]
    assert sorted(m.topic for m in retained.cursor("a/#")) == ["a/1", "a/3", "a/4"]


def test_removing_a_topic_prunes_its_empty_levels() -> None:
    retained = RetainedMessages()
    retained.update(Message("x/y/z", b"1", retain=True))
    retained.update(Message("x", b"2", retain=True))
    retained.update(Message("x/y/z", b"", retain=True))
    assert list(retained.cursor("x/#")) == [retained.get("x")]
    assert retained._root.children["x"].children == {}


def test_retained_messages_are_sent_as_the_window_opens_not_queued_all_at_once(
    make_harness,
) -> None:
    """More retained messages than the queue limit: each goes out as an acknowledgement frees
    the window; none waits in the queue (so no queue limit can cut them), and the first goes
    out at once."""
    harness = make_harness(limits={"max_queued_messages": 10})
    for n in range(50):
        harness.publish(f"r/{n}", b"%d" % n, qos=1, retain=True)
    session, consumer, _ = harness.connect("sub", window=3)
    harness.subscribe(session, "r/#", qos=1)
    assert len(consumer.deliveries) == 3
    assert session.queue.count == 0
    acked = 0
    while acked < len(consumer.deliveries):
        harness.ack(session, consumer, consumer.deliveries[acked].delivery_id)
        acked += 1
        assert len(session.inflight) <= 3
    assert sorted(consumer.payloads) == sorted(b"%d" % n for n in range(50))
    assert session.queue.counters.rejected == 0
    assert not harness.broker.retained_cursors


def test_retained_qos0_messages_go_out_a_batch_per_loop_turn(harness) -> None:
    """Without a window to pace them, retained QoS 0 messages all arrive, a batch per pump."""
    for n in range(600):
        harness.publish(f"q/{n}", b"%d" % n, retain=True)
    session, consumer, _ = harness.connect("sub")
    harness.subscribe(session, "q/#")
    assert len(consumer.deliveries) == 600
    assert not harness.broker.retained_cursors


def test_unsubscribing_stops_the_retained_messages_not_yet_sent(harness) -> None:
    for n in range(20):
        harness.publish(f"u/{n}", b"%d" % n, qos=1, retain=True)
    session, consumer, _ = harness.connect("sub", window=2)
    harness.subscribe(session, "u/#", qos=1)
    harness.broker.unsubscribe(session, "u/#")
    for delivered in list(consumer.deliveries):
        harness.ack(session, consumer, delivered.delivery_id)
    assert len(consumer.deliveries) == 2
    assert not harness.broker.retained_cursors


def test_a_cursor_copes_with_topics_of_thousands_of_levels() -> None:
    """Found by the fuzzer: the walk once recursed per level and overflowed the stack."""
    retained = RetainedMessages()
    deep = "/".join(["x"] * 5000)
    retained.update(Message(deep, b"deep", retain=True))
    retained.update(Message("x", b"shallow", retain=True))
    assert sorted(m.payload for m in retained.cursor("#")) == [b"deep", b"shallow"]
    assert [m.payload for m in retained.cursor("x/+/#")] == [b"deep"]
    retained.update(Message(deep, b"", retain=True))
    assert [m.payload for m in retained.cursor("#")] == [b"shallow"]


# -- limits.max_retained_payload ----------------------------------------------------------------


def test_a_retained_payload_over_the_limit_is_delivered_but_not_retained(
    make_harness, caplog
) -> None:
    """Over max_retained_payload: the live subscriber still gets it, the topic keeps its older
    retained message (memory and store), the refusal is counted and logged with topic and
    publisher; a payload of exactly the limit is retained."""
    import logging

    harness = make_harness(limits={"max_retained_payload": 4})
    older = harness.publish("t", b"1234", qos=1, retain=True)
    session, consumer, _ = harness.connect("live")
    harness.subscribe(session, "t")
    consumer.clear()
    with caplog.at_level(logging.INFO, "kittiwake.broker.publishing"):
        harness.publish("t", b"12345", qos=1, retain=True, origin="big-publisher")
    assert consumer.payloads == [b"12345"]
    assert harness.broker.retained.get("t") is older
    assert harness.store.retained == {"t": older}
    assert harness.broker.stats.retained_refused == 1
    [line] = [r.getMessage() for r in caplog.records]
    assert "'t'" in line and "big-publisher" in line and "5 bytes" in line
    late, late_consumer, _ = harness.connect("late")
    harness.subscribe(late, "t")
    assert late_consumer.payloads == [b"1234"]


def test_the_retained_limit_never_blocks_clearing_or_unretained_messages(make_harness) -> None:
    """The limit is about what is kept: a large message without RETAIN is not counted, and an
    empty retained publication still clears the topic."""
    harness = make_harness(limits={"max_retained_payload": 4})
    harness.publish("t", b"1", retain=True)
    harness.publish("t", b"x" * 100)
    assert harness.broker.stats.retained_refused == 0
    harness.publish("t", b"", retain=True)
    assert len(harness.broker.retained) == 0
    assert harness.broker.retained_too_large(Message("t", b"x" * 100)) is False


def test_a_live_copy_waits_behind_the_retained_messages_not_yet_sent(harness) -> None:
    """Retained messages go as if queued when the subscription was made: a live copy arriving
    while the cursor waits for the window goes after them, so no topic's newer message
    overtakes its older retained one (MQTT's ordered topics)."""
    harness.publish("a/1", b"old1", qos=1, retain=True)
    harness.publish("a/2", b"old2", qos=1, retain=True)
    session, consumer, _ = harness.connect("sub", window=1)
    harness.subscribe(session, "a/+", qos=1)
    harness.publish("a/2", b"new", qos=1)
    harness.publish("a/1", b"new1", qos=1)
    acked = 0
    while acked < len(consumer.deliveries):
        harness.ack(session, consumer, consumer.deliveries[acked].delivery_id)
        acked += 1
    assert consumer.payloads == [b"old1", b"old2", b"new", b"new1"]
    assert [d.retain for d in consumer.deliveries] == [True, True, False, False]
    assert not harness.broker.retained_cursors


def test_what_was_queued_before_the_subscription_goes_before_its_retained_messages(
    harness,
) -> None:
    harness.publish("r/1", b"retained", qos=1, retain=True)
    session, consumer, _ = harness.connect("sub", window=1)
    harness.subscribe(session, "q", qos=1)
    harness.publish("q", b"first", qos=1)  # in flight: the window is full
    harness.publish("q", b"queued", qos=1)
    harness.subscribe(session, "r/#", qos=1)
    acked = 0
    while acked < len(consumer.deliveries):
        harness.ack(session, consumer, consumer.deliveries[acked].delivery_id)
        acked += 1
    assert consumer.payloads == [b"first", b"queued", b"retained"]
    assert not harness.broker.retained_cursors


def _ack_all(harness, session, consumer) -> None:
    acked = 0
    while acked < len(consumer.deliveries):
        harness.ack(session, consumer, consumer.deliveries[acked].delivery_id)
        acked += 1


def test_a_live_copy_arriving_while_an_older_backlog_drains_waits_for_its_retained_one(
    harness,
) -> None:
    """MQTT 4.6 (ordered topics): a publisher's messages on a topic reach a subscriber in
    the order they were received, so a topic's retained message, older than the live one,
    goes first, also while what the session queued before the subscription still drains."""
    harness.publish("r/1", b"retained", qos=1, retain=True, origin="device")
    session, consumer, _ = harness.connect("sub", window=1)
    harness.subscribe(session, "q", qos=1)
    harness.publish("q", b"first", qos=1)  # in flight: the window is full
    harness.publish("q", b"queued", qos=1)  # a backlog older than the subscription
    harness.subscribe(session, "r/#", qos=1)
    harness.publish("r/1", b"live", qos=1, origin="device")
    _ack_all(harness, session, consumer)
    assert consumer.payloads == [b"first", b"queued", b"retained", b"live"]
    assert [d.retain for d in consumer.deliveries] == [False, False, True, False]
    assert not harness.broker.retained_cursors


def test_a_live_qos0_copy_does_not_overtake_its_topics_retained_qos0_message(harness) -> None:
    harness.publish("z/1", b"retained1", retain=True, origin="device")
    harness.publish("z/2", b"retained2", retain=True, origin="device")
    session, consumer, _ = harness.connect("sub", window=1)
    harness.subscribe(session, "q", qos=1)
    harness.publish("q", b"first", qos=1)  # the window is full: the cursor waits
    harness.subscribe(session, "z/#")
    harness.publish("z/2", b"live2", origin="device")
    _ack_all(harness, session, consumer)
    assert consumer.payloads == [b"first", b"retained2", b"live2", b"retained1"]
    assert not harness.broker.retained_cursors


def test_a_live_copy_that_replaced_the_retained_message_is_the_only_one_sent(harness) -> None:
    harness.publish("z/1", b"old", retain=True)
    session, consumer, _ = harness.connect("sub", window=1)
    harness.subscribe(session, "q", qos=1)
    harness.publish("q", b"first", qos=1)
    harness.subscribe(session, "z/#")
    harness.publish("z/1", b"new", retain=True)
    _ack_all(harness, session, consumer)
    assert consumer.payloads == [b"first", b"new"]


def test_no_direct_qos0_route_to_a_session_whose_retained_messages_are_pending(harness) -> None:
    """The MQTT front end's QoS 0 fast path writes to a plan's ``direct`` sessions without
    the core's enqueue: a session still owed retained messages is left out of it (its
    copies take the full path, which sends the topic's retained message first), and put back
    once they are sent."""
    harness.publish("z/1", b"retained", retain=True)
    session, consumer, _ = harness.connect("sub", window=1)
    harness.subscribe(session, "q", qos=1)
    harness.publish("q", b"first", qos=1)
    harness.subscribe(session, "z/#")
    assert harness.broker.routes.plan("z/1").direct is None
    _ack_all(harness, session, consumer)
    assert not harness.broker.retained_cursors
    assert harness.broker.routes.plan("z/1").direct == (session,)
