"""Shared subscriptions on the delivery model: one queue per group, members pulling by the
credit they share with their session, what a member leaves unacknowledged going back to the
group (QoS 1) or staying with it (QoS 2, MQTT-4.8.2-4/5), and the group's queue surviving a
restart."""

from __future__ import annotations

HOUR = 3600


def test_members_pull_by_the_credit_they_share_with_their_session(harness) -> None:
    """A member's Receive Maximum covers its own queue and the group's: with its window full
    of its own messages, the group's go to the other member."""
    full, full_c, _ = harness.connect("full", window=2)
    free, free_c, _ = harness.connect("free", window=10)
    harness.subscribe(full, "own", qos=1)
    harness.subscribe(full, "$share/g/jobs", qos=1)
    harness.subscribe(free, "$share/g/jobs", qos=1)
    harness.publish("own", b"mine-1", qos=1)
    harness.publish("own", b"mine-2", qos=1)
    for i in range(4):
        harness.publish("jobs", b"job-%d" % i, qos=1)
    assert full_c.payloads == [b"mine-1", b"mine-2"]
    assert free_c.payloads == [b"job-%d" % i for i in range(4)]


def test_a_message_waits_in_the_group_until_a_member_has_credit(harness) -> None:
    member, consumer, _ = harness.connect("m", window=1)
    harness.subscribe(member, "$share/g/t", qos=1)
    harness.publish("t", b"1", qos=1)
    harness.publish("t", b"2", qos=1)
    assert consumer.payloads == [b"1"]
    group = harness.broker.shared_groups[("g", "t")]
    assert group.queue.count == 1 and len(member.queue) == 0
    assert harness.ack(member, consumer, consumer.deliveries[0].delivery_id)
    assert consumer.payloads == [b"1", b"2"]


def test_unacknowledged_qos1_goes_back_to_the_group_when_a_member_disconnects(harness) -> None:
    leaving, leaving_c, _ = harness.connect("leaving", expiry=HOUR)
    harness.subscribe(leaving, "$share/g/t", qos=1)
    harness.publish("t", b"a", qos=1)
    harness.publish("t", b"b", qos=1)
    assert leaving_c.payloads == [b"a", b"b"]
    staying, staying_c, _ = harness.connect("staying")
    harness.subscribe(staying, "$share/g/t", qos=1)
    assert staying_c.deliveries == []
    harness.broker.disconnect(leaving, publish_will=False)
    assert [(d.payload, d.resend) for d in staying_c.deliveries] == [(b"a", True), (b"b", True)]
    assert [d.entry.delivery_count for d in staying_c.deliveries] == [1, 1]
    for d in list(staying_c.deliveries):
        assert harness.ack(staying, staying_c, d.delivery_id)
    # The leaving member's stored copies are gone with the group's acknowledgement.
    assert harness.store.queued == {}


def test_qos2_stays_with_the_member_it_was_sent_to(harness) -> None:
    """Completed with that member on reconnect (MQTT-4.8.2-4); never given to another member,
    even when the member's session ends (MQTT-4.8.2-5)."""
    chosen, chosen_c, _ = harness.connect("chosen", expiry=HOUR)
    harness.subscribe(chosen, "$share/g/t", qos=2)
    harness.publish("t", b"once", qos=2)
    [sent] = chosen_c.deliveries
    other, other_c, _ = harness.connect("other")
    harness.subscribe(other, "$share/g/t", qos=2)
    harness.broker.disconnect(chosen, publish_will=False)
    assert other_c.deliveries == []
    _, again, present = harness.connect("chosen", clean_start=False, expiry=HOUR)
    assert present
    [resent] = again.deliveries
    assert (resent.delivery_id, resent.payload, resent.resend) == (sent.delivery_id, b"once", True)
    harness.connect("chosen", clean_start=True)  # the session ends with it unacknowledged
    assert other_c.deliveries == []


def test_each_member_gets_its_own_level_and_subscription_id(harness) -> None:
    """A group entry is made at the highest granted QoS; each member is sent its own copy:
    capped by its granted QoS (MQTT-4.8.2-3), with its own subscription identifier."""
    low, low_c, _ = harness.connect("low")
    high, high_c, _ = harness.connect("high")
    harness.subscribe(low, "$share/g/t", qos=0, subscription_id=7)
    harness.subscribe(high, "$share/g/t", qos=2, subscription_id=9)
    harness.publish("t", b"1", qos=2)
    harness.publish("t", b"2", qos=2)
    [to_low] = low_c.deliveries
    [to_high] = high_c.deliveries
    assert (to_low.qos, to_low.entry.subscription_ids) == (0, (7,))
    assert (to_high.qos, to_high.entry.subscription_ids) == (2, (9,))
    group = harness.broker.shared_groups[("g", "t")]
    assert group.queue.in_flight == 0, "QoS 0 is done once sent; QoS 2 became the member's"


def test_the_group_queue_survives_a_restart(harness) -> None:
    """Messages for a group whose members are all offline wait in the group's queue, stored,
    and reach a member after a restart; one a member had not acknowledged comes back counted."""
    member, consumer, _ = harness.connect("m", expiry=HOUR, window=1)
    harness.subscribe(member, "$share/g/t", qos=1)
    harness.publish("t", b"sent", qos=1)
    harness.publish("t", b"queued", qos=1)
    assert consumer.payloads == [b"sent"]
    harness.broker.disconnect(member, publish_will=False)
    restarted = harness.restart()
    member, consumer, present = restarted.connect("m", clean_start=False, expiry=HOUR, window=10)
    assert present
    assert [(d.payload, d.resend) for d in consumer.deliveries] == [
        (b"sent", True), (b"queued", False)
    ]
    for d in list(consumer.deliveries):
        assert restarted.ack(member, consumer, d.delivery_id)
    assert restarted.store.queued == {}


def test_the_last_member_leaving_drops_the_group_and_its_stored_entries(harness) -> None:
    member, _, _ = harness.connect("m", expiry=HOUR)
    harness.subscribe(member, "$share/g/t", qos=1)
    harness.broker.disconnect(member, publish_will=False)
    harness.publish("t", b"waiting", qos=1)
    assert len(harness.store.queued) == 1
    harness.connect("m", clean_start=True)
    assert harness.broker.shared_groups == {}
    assert harness.store.queued == {}
