"""Routing: who gets a publication, at which QoS, how many copies, and what waits offline."""

from __future__ import annotations

from collections import Counter

from kittiwake.broker.broker import SubscribeRefusal
from kittiwake.broker.sessions import session_queue_name
from kittiwake.broker.sys_topics import publish_sys, sys_values

# -- matching --------------------------------------------------------------------------------


def test_wildcard_subscriptions_match(harness) -> None:
    """'+' matches one level, '#' the parent and any number of levels; others do not match."""
    plus, plus_c, _ = harness.connect("plus")
    hash_, hash_c, _ = harness.connect("hash")
    harness.subscribe(plus, "a/+/c")
    harness.subscribe(hash_, "a/#")
    for topic in ("a/b/c", "a/x/c", "a/b", "a", "a/b/c/d", "b/b/c"):
        harness.publish(topic, topic.encode())
    assert plus_c.payloads == [b"a/b/c", b"a/x/c"]
    assert hash_c.payloads == [b"a/b/c", b"a/x/c", b"a/b", b"a", b"a/b/c/d"]


def test_delivery_carries_topic_and_message(harness) -> None:
    """The subscriber sees the publication's topic and payload unchanged."""
    session, consumer, _ = harness.connect("s")
    harness.subscribe(session, "#")
    message = harness.publish("x/y", b"\x00\x01")
    [got] = consumer.deliveries
    assert got.entry.message is message
    assert (got.topic, got.payload) == ("x/y", b"\x00\x01")


def test_overlapping_subscriptions_give_one_copy_at_highest_qos(harness) -> None:
    """Overlapping subscriptions of one session: one copy, at the highest granted QoS."""
    session, consumer, _ = harness.connect("s")
    harness.subscribe(session, "a/#", qos=0)
    harness.subscribe(session, "a/+", qos=2)
    harness.subscribe(session, "a/b", qos=1)
    harness.publish("a/b", b"m", qos=2)
    [got] = consumer.deliveries
    assert got.qos == 2


def test_overlapping_subscriptions_carry_every_subscription_id(harness) -> None:
    """The single copy carries the identifiers of all matching subscriptions (MQTT-3.3.4-3)."""
    session, consumer, _ = harness.connect("s")
    harness.subscribe(session, "a/#", qos=1, subscription_id=7)
    harness.subscribe(session, "a/+", qos=1, subscription_id=9)
    harness.subscribe(session, "a/b", qos=1)  # no identifier
    harness.subscribe(session, "z/#", qos=1, subscription_id=11)  # does not match
    harness.publish("a/b", b"m", qos=1)
    [got] = consumer.deliveries
    assert sorted(got.entry.subscription_ids) == [7, 9]


def test_subscribing_again_changes_what_later_copies_carry(harness) -> None:
    """A subscription replaced with other options (MQTT-3.8.4-3) routes with the new ones,
    even on a topic whose route was worked out before."""
    session, consumer, _ = harness.connect("s")
    harness.subscribe(session, "a/b", qos=0)
    harness.publish("a/b", b"first", qos=1)
    harness.subscribe(session, "a/b", qos=1, subscription_id=5)
    harness.publish("a/b", b"second", qos=1)
    first, second = consumer.deliveries
    assert (first.qos, first.entry.subscription_ids) == (0, ())
    assert (second.qos, second.entry.subscription_ids) == (1, (5,))


def test_each_session_gets_its_own_copy(harness) -> None:
    """Every matching session gets exactly one copy."""
    consumers = []
    for name in ("a", "b", "c"):
        session, consumer, _ = harness.connect(name)
        harness.subscribe(session, "t/#", qos=1)
        harness.subscribe(session, "t/+", qos=1)
        consumers.append(consumer)
    harness.publish("t/1", b"m", qos=1)
    assert [c.payloads for c in consumers] == [[b"m"]] * 3


def test_unsubscribe_stops_delivery(harness) -> None:
    """After unsubscribing, the session no longer receives the filter's messages."""
    session, consumer, _ = harness.connect("s")
    harness.subscribe(session, "t")
    assert harness.broker.unsubscribe(session, "t")[0] is True
    assert harness.broker.unsubscribe(session, "t")[0] is False
    harness.publish("t", b"m")
    assert consumer.deliveries == []


def test_invalid_filter_is_refused(harness) -> None:
    """A malformed filter is refused with INVALID_FILTER and adds nothing."""
    session, _, _ = harness.connect("s")
    for bad in ("a/#/b", "a+", "", "$share/g", "$share//t"):
        assert harness.try_subscribe(session, bad) is SubscribeRefusal.INVALID_FILTER, bad
    assert session.subscriptions == {}


def test_subscription_quota(make_harness) -> None:
    """Past max_subscriptions_per_session a new filter is refused; replacing one is not."""
    h = make_harness(limits={"max_subscriptions_per_session": 2})
    session, _, _ = h.connect("s")
    h.subscribe(session, "a")
    h.subscribe(session, "b")
    assert h.try_subscribe(session, "c") is SubscribeRefusal.QUOTA_EXCEEDED
    assert h.try_subscribe(session, "a", qos=1) is not SubscribeRefusal.QUOTA_EXCEEDED


def test_too_many_levels_is_refused(make_harness) -> None:
    """A filter deeper than limits.max_topic_levels is refused."""
    h = make_harness(limits={"max_topic_levels": 3})
    session, _, _ = h.connect("s")
    assert h.try_subscribe(session, "a/b/c/d") is SubscribeRefusal.INVALID_FILTER
    assert h.try_subscribe(session, "a/b/c") is not SubscribeRefusal.INVALID_FILTER


# -- no local --------------------------------------------------------------------------------


def test_no_local_skips_own_publications(harness) -> None:
    """no_local: a session does not get what its own client published; others' it does."""
    me, my_consumer, _ = harness.connect("me")
    other, other_consumer, _ = harness.connect("other")
    harness.subscribe(me, "t", no_local=True)
    harness.subscribe(other, "t")
    harness.publish("t", b"mine", origin="me")
    harness.publish("t", b"theirs", origin="other")
    assert my_consumer.payloads == [b"theirs"]
    assert other_consumer.payloads == [b"mine", b"theirs"]


def test_no_local_is_per_subscription(harness) -> None:
    """An overlapping subscription without no_local still delivers the session's own message."""
    me, consumer, _ = harness.connect("me")
    harness.subscribe(me, "t", no_local=True, subscription_id=1)
    harness.subscribe(me, "#", subscription_id=2)
    harness.publish("t", b"mine", origin="me")
    [got] = consumer.deliveries
    assert got.entry.subscription_ids == (2,)


def test_broker_made_messages_pass_no_local(harness) -> None:
    """A message with no origin (broker-made) is never filtered by no_local."""
    me, consumer, _ = harness.connect("me")
    harness.subscribe(me, "t", no_local=True)
    harness.publish("t", b"broker", origin=None)
    assert consumer.payloads == [b"broker"]


# -- shared subscriptions --------------------------------------------------------------------


def test_shared_group_round_robin(harness) -> None:
    """A shared group spreads messages over its members; each message reaches exactly one."""
    consumers = []
    for name in ("m1", "m2", "m3"):
        session, consumer, _ = harness.connect(name)
        harness.subscribe(session, "$share/g/jobs/#", qos=1)
        consumers.append(consumer)
    payloads = [str(i).encode() for i in range(9)]
    for p in payloads:
        harness.publish("jobs/x", p, qos=1)
    got = [c.payloads for c in consumers]
    assert [len(g) for g in got] == [3, 3, 3]
    assert sorted(p for g in got for p in g) == sorted(payloads)


def test_two_groups_and_a_plain_subscriber_each_get_a_copy(harness) -> None:
    """Each shared group gets one copy, independently of other groups and plain subscribers."""
    counts: Counter[str] = Counter()
    consumers = {}
    for name, full_filter in [
        ("g1a", "$share/g1/t"), ("g1b", "$share/g1/t"),
        ("g2a", "$share/g2/t"), ("plain", "t"),
    ]:
        session, consumer, _ = harness.connect(name)
        harness.subscribe(session, full_filter)
        consumers[name] = consumer
    for _ in range(4):
        harness.publish("t", b"m")
    for name, consumer in consumers.items():
        counts[name] = len(consumer.deliveries)
    assert counts["g1a"] + counts["g1b"] == 4
    assert counts["g1a"] == counts["g1b"] == 2
    assert counts["g2a"] == 4
    assert counts["plain"] == 4


def test_shared_group_prefers_members_with_room(harness) -> None:
    """A member whose in-flight window is full is skipped while another member has room."""
    busy, busy_c, _ = harness.connect("busy", window=1)
    idle, idle_c, _ = harness.connect("idle", window=10)
    harness.subscribe(busy, "$share/g/t", qos=1)
    harness.subscribe(idle, "$share/g/t", qos=1)
    for i in range(5):
        harness.publish("t", bytes([i]), qos=1)
    assert len(busy_c.deliveries) == 1
    assert len(idle_c.deliveries) == 4
    assert len(busy.queue) == 0


def test_shared_group_prefers_connected_members(harness) -> None:
    """An offline member is skipped while a connected member exists."""
    away, _, _ = harness.connect("away", expiry=100)
    here, here_c, _ = harness.connect("here")
    harness.subscribe(away, "$share/g/t", qos=1)
    harness.subscribe(here, "$share/g/t", qos=1)
    harness.broker.disconnect(away, publish_will=False)
    for i in range(4):
        harness.publish("t", bytes([i]), qos=1)
    assert len(here_c.deliveries) == 4
    assert len(away.queue) == 0


def test_shared_group_unsubscribe_last_member_removes_group(harness) -> None:
    """When the last member leaves, the group is gone and nothing is routed to it."""
    session, consumer, _ = harness.connect("s")
    harness.subscribe(session, "$share/g/t")
    assert harness.broker.unsubscribe(session, "$share/g/t")[0]
    assert harness.broker.shared_groups == {}
    harness.publish("t", b"m")
    assert consumer.deliveries == []


# -- offline sessions and queues -------------------------------------------------------------


def offline_subscriber(h, *, qos: int = 1, client_id: str = "sub", expiry: int = 3600):
    session, _, _ = h.connect(client_id, expiry=expiry)
    h.subscribe(session, "t", qos=qos)
    h.broker.disconnect(session, publish_will=False)
    return session


def test_qos0_not_queued_for_offline_session(harness) -> None:
    """QoS 0 is at most once: an offline session does not keep it."""
    session = offline_subscriber(harness, qos=0)
    harness.publish("t", b"m", qos=1)
    harness.publish("t", b"m0", qos=0)
    assert len(session.queue) == 0
    _, consumer, present = harness.connect("sub", clean_start=False, expiry=3600)
    assert present
    assert consumer.deliveries == []


def test_qos1_queued_for_offline_persistent_session(harness) -> None:
    """QoS 1 waits in an offline persistent session, stored, and arrives on reconnection."""
    session = offline_subscriber(harness, qos=1)
    message = harness.publish("t", b"m", qos=1)
    assert len(session.queue) == 1
    assert message.message_id != 0
    assert (session_queue_name("sub"), message.message_id) in harness.store.queued
    _, consumer, present = harness.connect("sub", clean_start=False, expiry=3600)
    assert present
    [got] = consumer.deliveries
    assert (got.payload, got.qos, got.resend) == (b"m", 1, False)


def test_nonpersistent_qos1_is_queued_but_not_stored(harness) -> None:
    """A nonpersistent QoS 1 message (JMS NON_PERSISTENT) waits in memory, never in the store."""
    session = offline_subscriber(harness, qos=1)
    harness.publish("t", b"m", qos=1, persistent=False)
    assert len(session.queue) == 1
    assert harness.store.queued == {} and harness.store.messages == {}


def test_queued_in_arrival_order(harness) -> None:
    """Messages waiting for an offline session arrive in publication order."""
    offline_subscriber(harness)
    for i in range(5):
        harness.publish("t", bytes([48 + i]), qos=1)
    _, consumer, _ = harness.connect("sub", clean_start=False, expiry=3600)
    assert consumer.payloads == [b"0", b"1", b"2", b"3", b"4"]


def test_queue_bound_reject_new(make_harness) -> None:
    """reject_new: once the session queue is full, newer messages are dropped and not stored."""
    h = make_harness(limits={"max_queued_messages": 2, "queue_full_policy": "reject_new"})
    session = offline_subscriber(h)
    m1, m2, m3 = (h.publish("t", p, qos=1) for p in (b"1", b"2", b"3"))
    assert len(session.queue) == 2
    queue = session_queue_name("sub")
    assert set(h.store.queued) == {(queue, m1.message_id), (queue, m2.message_id)}
    assert m3.message_id not in h.store.messages
    assert h.broker.stats.messages_dropped == 1
    _, consumer, _ = h.connect("sub", clean_start=False, expiry=3600)
    assert consumer.payloads == [b"1", b"2"]


def test_queue_bound_discard_oldest_releases_store_reference(make_harness) -> None:
    """discard_oldest: the oldest message makes room and its stored reference is released."""
    h = make_harness(limits={"max_queued_messages": 2, "queue_full_policy": "discard_oldest"})
    session = offline_subscriber(h)
    m1, m2, m3 = (h.publish("t", p, qos=1) for p in (b"1", b"2", b"3"))
    assert len(session.queue) == 2
    queue = session_queue_name("sub")
    assert set(h.store.queued) == {(queue, m2.message_id), (queue, m3.message_id)}
    assert m1.message_id not in h.store.messages  # last reference gone
    assert h.broker.stats.messages_dropped == 1
    _, consumer, _ = h.connect("sub", clean_start=False, expiry=3600)
    assert consumer.payloads == [b"2", b"3"]


def test_discarded_message_kept_for_other_sessions(make_harness) -> None:
    """Discarding from one session's queue keeps the message stored for another session."""
    h = make_harness(limits={"max_queued_messages": 1, "queue_full_policy": "discard_oldest"})
    offline_subscriber(h, client_id="small")
    big = h.connect("big", expiry=3600)[0]
    h.subscribe(big, "t", qos=1)
    h.broker.disconnect(big, publish_will=False)
    big.queue.max_messages = 10
    m1 = h.publish("t", b"1", qos=1)
    h.publish("t", b"2", qos=1)
    assert (session_queue_name("small"), m1.message_id) not in h.store.queued
    assert (session_queue_name("big"), m1.message_id) in h.store.queued
    assert m1.message_id in h.store.messages


def test_queue_byte_bound(make_harness) -> None:
    """The session queue's byte budget bounds it too (payload + topic bytes)."""
    h = make_harness(limits={"max_queued_bytes": 25})
    session = offline_subscriber(h)
    h.publish("t", b"x" * 11, qos=1)  # 12 bytes
    h.publish("t", b"x" * 11, qos=1)  # 24 bytes
    h.publish("t", b"x", qos=1)  # would be 26
    assert len(session.queue) == 2
    assert h.broker.stats.messages_dropped == 1


def test_expired_queued_message_is_not_delivered_and_its_reference_released(harness) -> None:
    """A queued message whose expiry passed while offline is dropped at reconnection, and the
    store forgets it (Store.release: 'acknowledged, expired or discarded')."""
    session = offline_subscriber(harness)
    doomed = harness.publish("t", b"doomed", qos=1, expiry_in=10)
    kept = harness.publish("t", b"kept", qos=1, expiry_in=100)
    harness.advance(20)
    _, consumer, _ = harness.connect("sub", clean_start=False, expiry=3600)
    assert consumer.payloads == [b"kept"]
    assert harness.broker.stats.messages_dropped == 1
    assert (session_queue_name("sub"), doomed.message_id) not in harness.store.queued
    assert doomed.message_id not in harness.store.messages
    assert (session_queue_name("sub"), kept.message_id) in harness.store.queued
    assert session.queue.counters.expired == 1  # the queue keeps its own count too


def test_qos_downgrade_for_queued_copy(harness) -> None:
    """A QoS 0 subscription turns a persistent QoS 2 publication into a live-only QoS 0 copy."""
    session, consumer, _ = harness.connect("s", expiry=3600)
    harness.subscribe(session, "t", qos=0)
    harness.publish("t", b"m", qos=2)
    [got] = consumer.deliveries
    assert (got.qos, got.entry.persistent, got.delivery_id) == (0, False, 0)
    assert harness.store.queued == {}


# -- $SYS ------------------------------------------------------------------------------------


def test_publish_sys_publishes_retained_sys_messages(harness) -> None:
    """publish_sys retains one message per $SYS figure, as text, without counting them."""
    values = sys_values(harness.broker)  # the snapshot publish_sys is about to take
    publish_sys(harness.broker)
    assert all(topic.startswith("$SYS/") for topic in values)
    for topic, value in values.items():
        retained = harness.broker.retained.get(topic)
        assert retained is not None and retained.payload == value.encode(), topic
        assert retained.persistent is False
    assert harness.broker.stats.messages_received == 0
    assert harness.store.retained == {}


def test_hash_subscriber_does_not_get_sys(harness) -> None:
    """A '#' subscriber gets neither retained nor live $SYS messages."""
    publish_sys(harness.broker)
    session, consumer, _ = harness.connect("s")
    harness.subscribe(session, "#")
    harness.subscribe(session, "+/broker/#")
    harness.clock.advance(5)
    publish_sys(harness.broker)  # uptime changed: republished live
    assert consumer.deliveries == []


def test_sys_subscriber_gets_sys(harness) -> None:
    """A '$SYS/#' subscriber gets the retained figures at subscribe time and changes live."""
    publish_sys(harness.broker)
    session, consumer, _ = harness.connect("s")
    harness.subscribe(session, "$SYS/#")
    topics = {d.topic for d in consumer.deliveries}
    assert topics == set(sys_values(harness.broker))
    assert all(d.retain for d in consumer.deliveries)
    consumer.clear()
    harness.clock.advance(5)
    publish_sys(harness.broker)
    assert "$SYS/broker/uptime" in {d.topic for d in consumer.deliveries}
    assert all(not d.retain for d in consumer.deliveries)


def test_publish_sys_skips_unchanged_figures(harness) -> None:
    """Only figures that changed since the last publication are published again."""
    publish_sys(harness.broker)
    session, consumer, _ = harness.connect("s")
    harness.subscribe(session, "$SYS/broker/version")
    consumer.clear()
    publish_sys(harness.broker)
    assert consumer.deliveries == []


# -- delivery time ---------------------------------------------------------------------------


def test_delayed_message_delivered_when_its_time_comes(harness) -> None:
    """A message with a delivery time reaches a connected subscriber only once the clock
    passes it, driven by tick alone (DESIGN.md §4: delays run on the one clock)."""
    session, consumer, _ = harness.connect("s")
    harness.subscribe(session, "t", qos=1)
    now = harness.clock.now()
    harness.publish("t", b"later", qos=1, delivery_time=now + 10)
    harness.publish("t", b"now", qos=1)
    assert consumer.payloads == [b"now"]
    harness.advance(9)
    assert consumer.payloads == [b"now"]
    harness.advance(1)
    assert consumer.payloads == [b"now", b"later"]
    harness.advance(10)
    assert consumer.payloads == [b"now", b"later"]


def test_delayed_message_for_offline_session(harness) -> None:
    """A delayed message queued while offline waits for both the reconnection and its time."""
    offline_subscriber(harness)
    harness.publish("t", b"later", qos=1, delivery_time=harness.clock.now() + 10)
    _, consumer, _ = harness.connect("sub", clean_start=False, expiry=3600)
    assert consumer.deliveries == []
    harness.advance(10)
    assert consumer.payloads == [b"later"]


def test_delayed_qos0_copy_waits_for_its_delivery_time(harness) -> None:
    """Delivery delay holds for every subscription kind (issue 11): a copy delivered at
    QoS 0 (a QoS 0 subscription, an acknowledgement-free JMS consumer) waits for its time
    too, and then goes out at QoS 0; a copy without a delivery time still goes at once."""
    session, consumer, _ = harness.connect("s")
    harness.subscribe(session, "t", qos=0)
    now = harness.clock.now()
    harness.publish("t", b"later-1", qos=1, delivery_time=now + 10)
    harness.publish("t", b"later-0", qos=0, delivery_time=now + 10)
    harness.publish("t", b"now", qos=0)
    assert consumer.payloads == [b"now"]
    harness.advance(9)
    assert consumer.payloads == [b"now"]
    harness.advance(1)
    assert consumer.payloads == [b"now", b"later-1", b"later-0"]
    assert [d.qos for d in consumer.deliveries] == [0, 0, 0]
    assert len(session.queue) == 0
    harness.advance(10)
    assert len(consumer.deliveries) == 3


def test_delayed_qos0_copy_goes_nowhere_for_an_offline_session(harness) -> None:
    """At most once: a session not connected when the delayed QoS 0 copy arrives keeps
    nothing, as for any QoS 0 copy."""
    session = offline_subscriber(harness, qos=0)
    harness.publish("t", b"later", qos=1, delivery_time=harness.clock.now() + 10)
    assert len(session.queue) == 0


def test_delayed_message_to_a_shared_group_waits_for_its_time(harness) -> None:
    """MQTT shared groups are a subscription kind too: their queue is pumped when a delayed
    entry comes due, at QoS 0 and at QoS 1."""
    zero, consumer0, _ = harness.connect("zero")
    harness.subscribe(zero, "$share/g0/t", qos=0)
    one, consumer1, _ = harness.connect("one")
    harness.subscribe(one, "$share/g1/t", qos=1)
    harness.publish("t", b"later", qos=1, delivery_time=harness.clock.now() + 10)
    assert consumer0.deliveries == [] and consumer1.deliveries == []
    harness.advance(9)
    assert consumer0.deliveries == [] and consumer1.deliveries == []
    harness.advance(1)
    assert [(d.payload, d.qos) for d in consumer0.deliveries] == [(b"later", 0)]
    assert [(d.payload, d.qos) for d in consumer1.deliveries] == [(b"later", 1)]


def test_route_plans_of_very_long_topics_are_answered_but_not_cached(harness) -> None:
    session, _, _ = harness.connect("sub")
    harness.subscribe(session, "#", 0)
    long_topic = "x/" + "y" * 5000
    assert harness.broker.route_plan(long_topic).direct == (session,)
    assert harness.broker.routes.cached_topics() == []
    assert harness.broker.route_plan("short").direct == (session,)
    assert harness.broker.routes.cached_topics() == ["short"]


def test_a_route_plan_is_forwardable_as_is_only_when_every_match_is_plain(harness) -> None:
    """The QoS 0 fast path's condition is the core's: no shared group, no noLocal, no
    subscription identifier among the matches, and only connected sessions."""
    plain, _, _ = harness.connect("plain")
    harness.subscribe(plain, "a/#", 1)
    away, _, _ = harness.connect("away", expiry=3600)
    harness.subscribe(away, "a/b", 0)
    harness.broker.disconnect(away, publish_will=False)
    assert harness.broker.route_plan("a/b").direct == (plain,)
    with_id, _, _ = harness.connect("with-id")
    harness.subscribe(with_id, "a/b", 0, subscription_id=4)
    assert harness.broker.route_plan("a/b").direct is None
    assert harness.broker.route_plan("a/c").direct == (plain,)
    harness.subscribe(plain, "$share/g/a/c", 0)
    assert harness.broker.route_plan("a/c").direct is None


def test_topics_that_match_one_subscription_alone_share_its_plan(harness) -> None:
    """A fleet's devices each publish on their own topic: a topic never published before that
    matches one plain subscription gets that subscription's plan, until the subscription or
    its session's connection changes (another device connecting changes nothing for it)."""
    fleet, _, _ = harness.connect("fleet", clean_start=False, expiry=60)
    harness.subscribe(fleet, "s/+/v", 0)
    first = harness.broker.route_plan("s/1/v")
    assert first.direct == (fleet,)
    assert harness.broker.route_plan("s/2/v") is first
    other, _, _ = harness.connect("other")
    assert harness.broker.route_plan("s/3/v") is first
    harness.broker.disconnect(fleet, publish_will=False)
    gone = harness.broker.route_plan("s/3/v")
    assert gone is not first  # its own connection changed: worked out afresh
    assert gone.direct == ()
    fleet, _, _ = harness.connect("fleet", clean_start=False, expiry=60)
    again = harness.broker.route_plan("s/3/v")
    assert again.direct == (fleet,)
    harness.subscribe(other, "s/3/+", 0)
    assert set(harness.broker.route_plan("s/3/v").direct or ()) == {fleet, other}
    assert harness.broker.route_plan("s/4/v").direct == (fleet,)
    harness.broker.disconnect(other, publish_will=False)
    assert harness.broker.route_plan("s/3/v").direct == (fleet,)


def test_a_reader_with_denied_topics_gets_a_plan_per_topic(make_harness) -> None:
    """A plan shared across topics would skip the per-topic read check."""
    harness = make_harness(auth={"subscribe_deny": ["s/secret/#"]})
    reader, consumer, _ = harness.connect("reader")
    harness.subscribe(reader, "s/+/v", 0)
    assert harness.broker.route_plan("s/open/v").direct == (reader,)
    assert harness.broker.route_plan("s/secret/v").direct == ()
    harness.publish("s/secret/v", b"no")
    harness.publish("s/open/v", b"yes")
    harness.publish("s/secret/v", b"no")
    assert consumer.payloads == [b"yes"]
