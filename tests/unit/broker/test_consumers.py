"""The delivery model without a protocol: consumers pull from a queue by credit, every attempt is
a Delivery settled as accepted, released, modified or rejected, and a queue gives up on an entry
after its maximum delivery count. Time comes from a ManualClock, never from sleeping."""

from __future__ import annotations

import pytest

from kittiwake.broker.consumers import Consumer, Delivery, DeliveryState, Settlement
from kittiwake.broker.message import Message
from kittiwake.broker.queues import EntryState, Queue, QueuedMessage, Removal
from kittiwake.clock import ManualClock


class RecordingReceiver:
    """A front end that only remembers what it was given."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.settled: list[QueuedMessage] = []

    def deliver(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)

    def deliver_settled(self, entry: QueuedMessage) -> None:
        self.settled.append(entry)

    @property
    def payloads(self) -> list[bytes]:
        return [d.entry.message.payload for d in self.deliveries]

    def take(self) -> list[Delivery]:
        taken, self.deliveries = self.deliveries, []
        return taken


class Removals:
    """An ``on_removed`` owner that records what left the queue, and why."""

    def __init__(self) -> None:
        self.seen: list[tuple[bytes, Removal, int]] = []

    def __call__(self, queue: Queue, entry: QueuedMessage, reason: Removal) -> None:
        self.seen.append((entry.message.payload, reason, entry.delivery_count))


def entry(payload: bytes, **fields: object) -> QueuedMessage:
    return QueuedMessage.of(Message("t", payload, qos=1, **fields), 1)  # type: ignore[arg-type]


def make_queue(**settings: object) -> tuple[Queue, Removals]:
    removals = Removals()
    settings.setdefault("max_messages", 1000)
    settings.setdefault("max_bytes", 1_000_000)
    queue = Queue("q", on_removed=removals, **settings)  # type: ignore[arg-type]
    return queue, removals


def consumer(window: int, name: str = "") -> tuple[Consumer, RecordingReceiver]:
    receiver = RecordingReceiver()
    return Consumer(receiver, window=window, name=name), receiver


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


# -- competing consumers by credit -----------------------------------------------------------


def test_consumers_take_turns_while_they_have_credit(clock: ManualClock) -> None:
    """Two consumers with room share the queue in turn; each stops at its window."""
    queue, _ = make_queue()
    a, ra = consumer(2, "a")
    b, rb = consumer(2, "b")
    queue.attach(a)
    queue.attach(b)
    for i in range(6):
        queue.push(entry(b"%d" % i))
    assert queue.dispatch(clock.now()) == 4
    assert ra.payloads == [b"0", b"2"]
    assert rb.payloads == [b"1", b"3"]
    assert (a.credit.available, b.credit.available) == (0, 0)
    assert (queue.count, queue.in_flight) == (2, 4)


def test_a_consumer_that_stops_settling_gets_nothing_more_while_another_has_credit(
    clock: ManualClock,
) -> None:
    """A message waits in the queue until a consumer can take it: the stuck consumer's window
    is full, so everything new goes to the one that keeps settling."""
    queue, _ = make_queue()
    stuck, stuck_rx = consumer(1, "stuck")
    busy, busy_rx = consumer(1, "busy")
    queue.attach(stuck)
    queue.attach(busy)
    for i in range(5):
        queue.push(entry(b"%d" % i))
        queue.dispatch(clock.now())
        for delivery in busy_rx.deliveries:
            queue.settle(delivery, Settlement.ACCEPTED)
    assert stuck_rx.payloads == [b"0"]
    assert busy_rx.payloads == [b"1", b"2", b"3", b"4"]
    assert queue.count == 0


def test_entries_wait_for_credit_then_flow_when_it_comes_back(clock: ManualClock) -> None:
    """No credit, no delivery: the entry waits; settling gives the window's credit back."""
    queue, _ = make_queue()
    only, rx = consumer(1)
    queue.attach(only)
    queue.push(entry(b"1"))
    queue.push(entry(b"2"))
    queue.dispatch(clock.now())
    assert rx.payloads == [b"1"]
    assert queue.dispatch(clock.now()) == 0
    (first,) = rx.take()
    assert queue.settle(first, Settlement.ACCEPTED)
    assert queue.dispatch(clock.now()) == 1
    assert rx.payloads == [b"2"]


def test_link_credit_is_spent_and_only_topped_up_by_the_front_end(clock: ManualClock) -> None:
    """AMQP-style credit: settling does not give it back; add_credit does."""
    queue, _ = make_queue()
    receiver = RecordingReceiver()
    link = Consumer(receiver, credit=1)
    queue.attach(link)
    for i in range(3):
        queue.push(entry(b"%d" % i))
    queue.dispatch(clock.now())
    queue.settle(receiver.take()[0], Settlement.ACCEPTED)
    assert queue.dispatch(clock.now()) == 0
    link.add_credit(2)
    assert queue.dispatch(clock.now()) == 2
    assert receiver.payloads == [b"1", b"2"]


def test_a_consumer_without_a_receiver_takes_nothing(clock: ManualClock) -> None:
    """An MQTT session between connections: attached, with credit, but nobody to send to."""
    queue, _ = make_queue()
    offline = Consumer(None, window=10)
    queue.attach(offline)
    queue.push(entry(b"1"))
    assert queue.dispatch(clock.now()) == 0
    receiver = RecordingReceiver()
    offline.receiver = receiver
    assert queue.dispatch(clock.now()) == 1
    assert receiver.payloads == [b"1"]


def test_delivery_ids_are_plain_ints_unique_in_the_queue(clock: ManualClock) -> None:
    """Core delivery ids are not 16-bit packet ids: they keep counting past 65535."""
    queue, _ = make_queue(max_messages=70_000, max_bytes=10_000_000)
    only, rx = consumer(1)
    queue.attach(only)
    ids = []
    for _ in range(65_537):
        queue.push(entry(b""))
        queue.dispatch(clock.now())
        (delivery,) = rx.take()
        ids.append(delivery.id)
        queue.settle(delivery, Settlement.ACCEPTED)
    assert len(set(ids)) == len(ids)
    assert max(ids) > 0xFFFF


def test_offer_sends_at_most_once_without_credit_or_queueing() -> None:
    """An at-most-once entry spends no credit and is never queued; without a receiver it is
    gone."""
    queue, _ = make_queue()
    full, rx = consumer(0)
    queue.attach(full)
    assert queue.offer(entry(b"q0"))
    assert [e.message.payload for e in rx.settled] == [b"q0"]
    assert queue.count == 0 and full.unsettled == {}
    full.receiver = None
    assert not queue.offer(entry(b"lost"))


def test_offer_takes_turns_among_consumers() -> None:
    queue, _ = make_queue()
    a, ra = consumer(1)
    b, rb = consumer(1)
    queue.attach(a)
    queue.attach(b)
    for i in range(4):
        queue.offer(entry(b"%d" % i))
    assert [e.message.payload for e in ra.settled] == [b"0", b"2"]
    assert [e.message.payload for e in rb.settled] == [b"1", b"3"]


# -- settlement ------------------------------------------------------------------------------


def test_accepted_removes_the_entry_for_good(clock: ManualClock) -> None:
    """An accepted entry leaves the queue; the owner hears of it when it is stored (a durable
    queue's persistent entry), since only then is something left to clean up."""
    queue, removals = make_queue(durable=True)
    only, rx = consumer(5)
    queue.attach(only)
    queue.push(QueuedMessage.of(Message("t", b"stored", qos=1, persistent=True), 1))
    queue.push(entry(b"volatile"))
    queue.dispatch(clock.now())
    stored, volatile = rx.take()
    assert (stored.delivery_count, stored.redelivered) == (0, False)
    assert queue.settle(stored, Settlement.ACCEPTED)
    assert queue.settle(volatile, Settlement.ACCEPTED)
    assert removals.seen == [(b"stored", Removal.ACCEPTED, 0)]
    assert (queue.count, queue.in_flight, only.credit.available) == (0, 0, 5)
    assert not queue.settle(stored, Settlement.ACCEPTED), "a delivery settles once"


@pytest.mark.parametrize("durable", [False, True])
def test_accepting_a_run_settles_as_accepting_each(clock: ManualClock, durable: bool) -> None:
    """accept_all (a subscriber's run of acknowledgements) ends the same state as settle() of
    each as accepted: a delivery settled already is skipped, one of another queue is settled
    by that queue, and it says whether a stored entry was among them and whether a queue
    that settled one has entries waiting."""

    def scene() -> tuple[Queue, Queue, Consumer, Consumer, Removals, list[Delivery]]:
        queue, removals = make_queue(durable=durable)
        other, _ = make_queue()
        mine, rx = consumer(3)
        theirs, other_rx = consumer(1)
        queue.attach(mine)
        other.attach(theirs)
        for i in range(5):
            queue.push(QueuedMessage.of(Message("t", b"m%d" % i, qos=1, persistent=True), 1))
        other.push(entry(b"o1"))
        other.push(entry(b"o2"))
        queue.dispatch(clock.now())
        other.dispatch(clock.now())
        ours = rx.take()
        assert queue.settle(ours[1], Settlement.ACCEPTED)  # settled already
        run = [ours[0], ours[1], *other_rx.take(), ours[2], ours[0]]
        return queue, other, mine, theirs, removals, run

    queue, other, mine, theirs, removals, run = scene()
    assert queue.accept_all(run) == (durable, True)
    state = (queue.count, queue.in_flight, mine.credit.available, sorted(mine.unsettled))
    others = (other.count, other.in_flight, theirs.credit.available, sorted(theirs.unsettled))
    seen = list(removals.seen)

    queue, other, mine, theirs, removals, run = scene()
    for delivery in run:
        owner = delivery.consumer.queue
        assert owner is not None
        owner.settle(delivery, Settlement.ACCEPTED)
    assert (queue.count, queue.in_flight, mine.credit.available, sorted(mine.unsettled)) == state
    assert (other.count, other.in_flight, theirs.credit.available) == others[:3]
    assert sorted(theirs.unsettled) == others[3]
    assert removals.seen == seen
    assert (queue.count, queue.in_flight, mine.credit.available) == (2, 0, 3)
    # Nothing of this queue's settled and nothing waiting anywhere: no pump needed.
    queue, other, mine, theirs, removals, run = scene()
    assert queue.accept_all([run[1]]) == (False, False)


def test_released_goes_back_ahead_of_later_entries_with_its_count_unchanged(
    clock: ManualClock,
) -> None:
    queue, removals = make_queue()
    only, rx = consumer(1)
    queue.attach(only)
    for payload in (b"1", b"2", b"3"):
        queue.push(entry(payload))
    queue.dispatch(clock.now())
    (first,) = rx.take()
    queue.settle(first, Settlement.RELEASED)
    queue.dispatch(clock.now())
    (again,) = rx.take()
    assert again.entry.message.payload == b"1"
    assert (again.delivery_count, again.redelivered) == (0, False)
    assert again.id != first.id, "each attempt is a delivery of its own"
    assert removals.seen == []


def test_modified_goes_back_with_its_count_incremented(clock: ManualClock) -> None:
    queue, _ = make_queue()
    only, rx = consumer(1)
    queue.attach(only)
    queue.push(entry(b"1"))
    queue.push(entry(b"2"))
    queue.dispatch(clock.now())
    queue.settle(rx.take()[0], Settlement.MODIFIED)
    queue.dispatch(clock.now())
    (again,) = rx.take()
    assert again.entry.message.payload == b"1"
    assert (again.delivery_count, again.redelivered) == (1, True)


def test_modified_undeliverable_here_goes_to_another_consumer(clock: ManualClock) -> None:
    """"Undeliverable here": this consumer never gets the entry again; others do, and later
    entries still reach the first consumer."""
    queue, _ = make_queue()
    a, ra = consumer(1, "a")
    queue.attach(a)
    queue.push(entry(b"poison"))
    queue.push(entry(b"next"))
    queue.dispatch(clock.now())
    (first,) = ra.take()
    queue.settle(first, Settlement.MODIFIED, undeliverable_here=True)
    queue.dispatch(clock.now())
    assert ra.payloads == [b"next"], "a skips the entry it refused and takes the next one"
    assert queue.count == 1
    b, rb = consumer(1, "b")
    queue.attach(b)
    queue.dispatch(clock.now())
    assert rb.payloads == [b"poison"]
    assert rb.deliveries[0].delivery_count == 1


def test_rejected_leaves_the_queue_as_a_dead_letter(clock: ManualClock) -> None:
    queue, removals = make_queue()
    only, rx = consumer(1)
    queue.attach(only)
    queue.push(entry(b"bad"))
    queue.dispatch(clock.now())
    queue.settle(rx.take()[0], Settlement.REJECTED)
    assert removals.seen == [(b"bad", Removal.REJECTED, 0)]
    assert queue.counters.dead_lettered == 1
    assert queue.count == 0


def test_dead_letter_after_the_maximum_delivery_count(clock: ManualClock) -> None:
    """With max_delivery_attempts 3, the third failed attempt ends it, with the reason."""
    queue, removals = make_queue(max_delivery_attempts=3)
    only, rx = consumer(1)
    queue.attach(only)
    queue.push(entry(b"flaky"))
    counts = []
    for _ in range(3):
        queue.dispatch(clock.now())
        (delivery,) = rx.take()
        counts.append(delivery.delivery_count)
        queue.settle(delivery, Settlement.MODIFIED)
    assert counts == [0, 1, 2]
    assert removals.seen == [(b"flaky", Removal.DELIVERY_LIMIT, 3)]
    assert Removal.DELIVERY_LIMIT.value == "maximum delivery attempts reached"
    assert queue.dispatch(clock.now()) == 0 and queue.count == 0


def test_released_never_counts_towards_the_maximum(clock: ManualClock) -> None:
    queue, removals = make_queue(max_delivery_attempts=1)
    only, rx = consumer(1)
    queue.attach(only)
    queue.push(entry(b"m"))
    for _ in range(5):
        queue.dispatch(clock.now())
        queue.settle(rx.take()[0], Settlement.RELEASED)
    assert removals.seen == [] and queue.count == 1


def test_received_state_is_kept_by_recall_but_not_by_detach(clock: ManualClock) -> None:
    """Recall takes back what a consumer has not received (an MQTT member that went away);
    an entry it holds already (PUBREC) stays until settled. Detach takes back everything."""
    queue, _ = make_queue()
    member, rx = consumer(5)
    queue.attach(member)
    for payload in (b"held", b"sent1", b"sent2"):
        queue.push(entry(payload))
    queue.dispatch(clock.now())
    held, _, _ = rx.take()
    assert queue.mark_received(held)
    assert held.state is DeliveryState.RECEIVED
    assert queue.recall(member) == 2
    assert list(member.unsettled.values()) == [held]
    assert [e.message.payload for e in queue.entries()] == [b"sent1", b"sent2"]
    assert [e.delivery_count for e in queue.entries()] == [1, 1]
    queue.detach(member)
    assert member.unsettled == {} and member.queue is None
    assert sorted(e.message.payload for e in queue.entries()) == [b"held", b"sent1", b"sent2"]


def test_a_detached_consumers_entries_go_to_the_remaining_one_in_order(
    clock: ManualClock,
) -> None:
    queue, _ = make_queue()
    a, ra = consumer(2, "a")
    b, rb = consumer(4, "b")
    queue.attach(a)
    queue.attach(b)
    for i in range(4):
        queue.push(entry(b"%d" % i))
    queue.dispatch(clock.now())
    assert ra.payloads == [b"0", b"2"] and rb.payloads == [b"1", b"3"]
    queue.settle(rb.take()[0], Settlement.ACCEPTED)
    queue.detach(a)
    queue.dispatch(clock.now())
    assert rb.payloads == [b"0", b"2"]
    assert [d.redelivered for d in rb.deliveries] == [True, True]


# -- order, visibility, expiry ---------------------------------------------------------------


@pytest.mark.parametrize("attach_first", [True, False])
def test_priority_order_then_fifo_inside_a_priority(clock: ManualClock, attach_first: bool) -> None:
    """Priority 9 before 0, arrival order among equals, whether the messages were queued before
    or after the consumer attached."""
    queue, _ = make_queue(ordering="priority")
    only, rx = consumer(1)
    if attach_first:
        queue.attach(only)
        only.receiver = None  # attached, but holds everything until all are queued
    for payload, priority in [(b"a4", 4), (b"b9", 9), (b"c0", 0), (b"d4", 4), (b"e9", 9)]:
        queue.push(entry(payload, priority=priority))
    if attach_first:
        only.receiver = rx
    else:
        queue.attach(only)
    got = []
    while queue.dispatch(clock.now()):
        (delivery,) = rx.take()
        got.append(delivery.entry.message.payload)
        queue.settle(delivery, Settlement.ACCEPTED)
    assert got == [b"b9", b"e9", b"a4", b"d4", b"c0"]


def test_a_redelivered_entry_keeps_its_place_inside_its_priority(clock: ManualClock) -> None:
    queue, _ = make_queue(ordering="priority")
    only, rx = consumer(1)
    queue.attach(only)
    for payload in (b"first", b"second"):
        queue.push(entry(payload, priority=5))
    queue.dispatch(clock.now())
    queue.push(entry(b"urgent", priority=9))
    queue.settle(rx.take()[0], Settlement.MODIFIED)
    order = []
    while queue.dispatch(clock.now()):
        (delivery,) = rx.take()
        order.append(delivery.entry.message.payload)
        queue.settle(delivery, Settlement.ACCEPTED)
    assert order == [b"urgent", b"first", b"second"]


def test_fifo_returned_entries_keep_their_arrival_order(clock: ManualClock) -> None:
    """Entries given back out of order still go out again in arrival order."""
    queue, _ = make_queue()
    only, rx = consumer(3)
    queue.attach(only)
    for payload in (b"1", b"2", b"3", b"4"):
        queue.push(entry(payload))
    queue.dispatch(clock.now())
    one, two, three = rx.take()
    queue.settle(three, Settlement.RELEASED)
    queue.settle(one, Settlement.RELEASED)
    queue.settle(two, Settlement.MODIFIED)
    queue.dispatch(clock.now())
    assert rx.payloads == [b"1", b"2", b"3"]


def test_delayed_entries_become_deliverable_at_their_delivery_time(clock: ManualClock) -> None:
    queue, _ = make_queue()
    only, rx = consumer(10)
    queue.attach(only)
    queue.push(entry(b"later", delivery_time=clock.now() + 30))
    queue.push(entry(b"now"))
    queue.dispatch(clock.now())
    assert rx.payloads == [b"now"]
    assert queue.next_visible_time() == clock.now() + 30
    clock.advance(29.9)
    assert queue.dispatch(clock.now()) == 0
    clock.advance(0.1)
    assert queue.dispatch(clock.now()) == 1
    assert rx.payloads == [b"now", b"later"]


def at_most_once(payload: bytes, **fields: object) -> QueuedMessage:
    return QueuedMessage.of(Message("t", payload, qos=0, **fields), 0)  # type: ignore[arg-type]


def test_a_due_at_most_once_entry_is_offered_whatever_the_credit(clock: ManualClock) -> None:
    """A queue whose owner offers QoS 0 (a session's, a group's) holds a delayed at-most-once
    entry until its time, then offers it as it offers any QoS 0: settled, without credit."""
    queue, removals = make_queue(offers_at_most_once=True)
    only, rx = consumer(1)
    queue.attach(only)
    queue.push(entry(b"q1"))
    queue.push(at_most_once(b"later", delivery_time=clock.now() + 30))
    queue.push(at_most_once(b"gone", delivery_time=clock.now() + 30, expiry=clock.now() + 10))
    assert queue.dispatch(clock.now()) == 1  # q1 takes the only credit
    clock.advance(29.9)
    assert queue.dispatch(clock.now()) == 0
    assert rx.settled == []
    clock.advance(0.1)
    assert queue.dispatch(clock.now()) == 1
    assert [e.message.payload for e in rx.settled] == [b"later"]
    assert [p for p, _, _ in removals.seen] == [b"gone"]
    assert queue.count == 0 and queue.bytes == 0 and queue.next_visible_time() is None


def test_a_queue_destination_keeps_a_due_at_most_once_entry_for_credit(
    clock: ManualClock,
) -> None:
    """A JMS queue's consumers compete for every entry alike: a due QoS 0 entry waits for
    credit there, as it would have without a delivery time."""
    queue, _ = make_queue()
    only, rx = consumer(1)
    queue.attach(only)
    queue.push(entry(b"q1"))
    queue.push(at_most_once(b"later", delivery_time=clock.now() + 30))
    queue.dispatch(clock.now())
    clock.advance(30)
    assert queue.dispatch(clock.now()) == 0
    assert rx.settled == [] and queue.count == 1


def test_expired_entries_are_counted_and_never_delivered(clock: ManualClock) -> None:
    queue, removals = make_queue()
    only, rx = consumer(10)
    queue.attach(only)
    only.receiver = None
    queue.push(entry(b"short", expiry=clock.now() + 5))
    queue.push(entry(b"long", expiry=clock.now() + 50))
    clock.advance(10)
    only.receiver = rx
    queue.dispatch(clock.now())
    assert rx.payloads == [b"long"]
    assert queue.counters.expired == 1
    assert removals.seen == [(b"short", Removal.EXPIRED, 0)]


def test_expire_sweeps_a_queue_nobody_consumes(clock: ManualClock) -> None:
    queue, removals = make_queue(ordering="priority")
    queue.push(entry(b"a", expiry=clock.now() + 1, priority=1))
    queue.push(entry(b"b", priority=7))
    queue.push(entry(b"c", expiry=clock.now() + 1, delivery_time=clock.now() + 100))
    queue.push(entry(b"d", priority=1))
    clock.advance(2)
    assert queue.expire(clock.now()) == 2
    assert sorted(p for p, _, _ in removals.seen) == [b"a", b"c"]
    assert queue.count == 2 and queue.bytes == 4
    assert [row.entry.message.payload for row in queue.browse(clock.now())] == [b"b", b"d"]


# -- browsing --------------------------------------------------------------------------------


def test_browsing_walks_entries_in_delivery_order_marking_in_flight_ones(
    clock: ManualClock,
) -> None:
    """A read-only walk: in-flight entries in their place, marked; delayed ones last; expired
    ones left out; nothing taken or changed."""
    queue, _ = make_queue(ordering="priority")
    only, rx = consumer(1)
    queue.attach(only)
    queue.push(entry(b"p4-first", priority=4))
    queue.dispatch(clock.now())
    (in_flight,) = rx.take()
    queue.push(entry(b"p4-second", priority=4))
    queue.push(entry(b"p9", priority=9))
    queue.push(entry(b"p0", priority=0))
    queue.push(entry(b"delayed", priority=9, delivery_time=clock.now() + 60))
    queue.push(entry(b"gone", priority=9, expiry=clock.now() + 1))
    clock.advance(1)
    before = (queue.count, queue.bytes, queue.in_flight, queue.counters.expired)
    rows = queue.browse(clock.now())
    assert [(r.entry.message.payload, r.state) for r in rows] == [
        (b"p9", EntryState.WAITING),
        (b"p4-first", EntryState.IN_FLIGHT),
        (b"p4-second", EntryState.WAITING),
        (b"p0", EntryState.WAITING),
        (b"delayed", EntryState.DELAYED),
    ]
    assert rows[1].delivery is in_flight
    assert (queue.count, queue.bytes, queue.in_flight, queue.counters.expired) == before


def test_browsing_a_fifo_queue_follows_arrival_and_visibility(clock: ManualClock) -> None:
    """A delayed entry that became visible ranks as arriving when it did, as dispatch will."""
    queue, _ = make_queue()
    queue.push(entry(b"1"))
    queue.push(entry(b"due", delivery_time=clock.now() + 5))
    queue.push(entry(b"2"))
    clock.advance(5)
    browsed = [r.entry.message.payload for r in queue.browse(clock.now())]
    only, rx = consumer(10)
    queue.attach(only)
    queue.dispatch(clock.now())
    assert browsed == rx.payloads == [b"1", b"2", b"due"]


def test_consumers_sharing_credit_count_against_one_window(clock: ManualClock) -> None:
    """One connection consuming from two queues (an MQTT session's own queue and a shared
    subscription's) has one Receive Maximum: both consumers spend the same credit."""
    own, group = make_queue()[0], make_queue()[0]
    receiver = RecordingReceiver()
    mine = Consumer(receiver, window=3)
    member = Consumer(receiver, share=mine.credit)
    own.attach(mine)
    group.attach(member)
    for i in range(2):
        own.push(entry(b"own%d" % i))
        group.push(entry(b"group%d" % i))
    own.dispatch(clock.now())
    group.dispatch(clock.now())
    assert receiver.payloads == [b"own0", b"own1", b"group0"]
    own.settle(receiver.deliveries[0], Settlement.ACCEPTED)
    group.dispatch(clock.now())
    assert receiver.payloads[-1] == b"group1"
    mine.set_window(10)
    assert mine.credit.available == member.credit.available == 7


def test_turns_move_on_only_when_a_consumer_takes_something(clock: ManualClock) -> None:
    """Entries arriving one at a time still alternate between two consumers (a dispatch that
    finds nothing to give must not use up a consumer's turn)."""
    queue, _ = make_queue()
    a, ra = consumer(100, "a")
    b, rb = consumer(100, "b")
    queue.attach(a)
    queue.attach(b)
    for i in range(6):
        queue.push(entry(b"%d" % i))
        queue.dispatch(clock.now())
    assert ra.payloads == [b"0", b"2", b"4"]
    assert rb.payloads == [b"1", b"3", b"5"]


def test_a_selective_consumer_skips_what_it_does_not_select(clock: ManualClock) -> None:
    """JMS queue selectors: an entry a consumer refuses goes to another consumer that selects
    it, or stays queued in its place when nobody present does."""
    queue, _ = make_queue(ordering="priority")
    evens, re = consumer(10, "evens")
    evens.selects = lambda e: int(e.message.payload) % 2 == 0
    queue.attach(evens)
    for n in range(5):
        queue.push(entry(str(n).encode()))
    assert queue.dispatch(clock.now()) == 3
    assert re.payloads == [b"0", b"2", b"4"]
    assert queue.count == 2, "the odd ones stay queued"
    odds, ro = consumer(10, "odds")
    odds.selects = lambda e: int(e.message.payload) % 2 == 1
    queue.attach(odds)
    queue.push(entry(b"5"))
    queue.push(entry(b"6"))
    queue.dispatch(clock.now())
    assert (re.payloads, ro.payloads) == ([b"0", b"2", b"4", b"6"], [b"1", b"3", b"5"])
    assert queue.count == 0


def test_without_selective_consumers_dispatch_never_asks(clock: ManualClock) -> None:
    """A selective consumer's detach leaves the queue dispatching as before: later entries
    go to the others, in turn."""
    queue, _ = make_queue()
    picky, rp = consumer(10, "picky")
    picky.selects = lambda e: False
    plain, rx = consumer(10, "plain")
    queue.attach(picky)
    queue.attach(plain)
    queue.push(entry(b"a"))
    queue.dispatch(clock.now())
    assert (rp.payloads, rx.payloads) == ([], [b"a"])
    queue.detach(picky)
    picky.selects = None
    queue.push(entry(b"b"))
    queue.dispatch(clock.now())
    assert rx.payloads == [b"a", b"b"]


# -- message groups (DESIGN.md section 5) ----------------------------------------------------


def grouped(payload: bytes, group: str) -> QueuedMessage:
    return entry(payload, group_id=group)


def test_each_message_group_sticks_to_one_consumer(clock: ManualClock) -> None:
    """Groups A and B interleaved over two competing consumers: every message of a group goes
    to the consumer that took the group's first one, while other entries still take turns."""
    queue, _ = make_queue(ordering="priority")
    first, r1 = consumer(100, "first")
    second, r2 = consumer(100, "second")
    queue.attach(first)
    queue.attach(second)
    for n in range(10):
        queue.push(grouped(b"A%d" % n, "A"))
        queue.push(grouped(b"B%d" % n, "B"))
    assert queue.dispatch(clock.now()) == 20
    groups_of = [{p[:1] for p in r.payloads} for r in (r1, r2)]
    assert sorted(map(sorted, groups_of)) == [[b"A"], [b"B"]], groups_of
    for receiver in (r1, r2):
        group = receiver.payloads[0][:1]
        assert receiver.payloads == [b"%s%d" % (group, n) for n in range(10)], "in order"


def test_a_group_waits_for_its_consumers_credit_without_blocking_others(
    clock: ManualClock,
) -> None:
    """The group's consumer has no credit left: the group's entries wait in their place, and
    entries of other groups and of none go to the other consumer meanwhile."""
    queue, _ = make_queue(ordering="priority")
    owner, ro = consumer(1, "owner")
    other, rx = consumer(10, "other")
    queue.attach(owner)
    queue.attach(other)
    queue.push(grouped(b"A0", "A"))
    queue.dispatch(clock.now())
    assert ro.payloads == [b"A0"]
    queue.push(grouped(b"A1", "A"))
    queue.push(entry(b"plain"))
    queue.push(grouped(b"B0", "B"))
    queue.push(grouped(b"A2", "A"))
    queue.dispatch(clock.now())
    assert rx.payloads == [b"plain", b"B0"]
    assert queue.count == 2, "A1 and A2 wait for their group's consumer"
    queue.settle(ro.take()[0], Settlement.ACCEPTED)
    queue.dispatch(clock.now())
    assert ro.payloads == [b"A1"], "the group stays with its consumer after an accept"
    queue.settle(ro.take()[0], Settlement.ACCEPTED)
    queue.dispatch(clock.now())
    assert ro.payloads == [b"A2"]
    assert rx.payloads == [b"plain", b"B0"]


def test_a_consumers_close_moves_its_group(clock: ManualClock) -> None:
    """Detaching the group's consumer returns its unsettled entries, and the group goes to
    the remaining consumer with them, in order."""
    queue, _ = make_queue(ordering="priority")
    owner, ro = consumer(10, "owner")
    other, rx = consumer(10, "other")
    queue.attach(owner)
    queue.attach(other)
    queue.push(grouped(b"A0", "A"))
    queue.push(grouped(b"B0", "B"))
    queue.dispatch(clock.now())
    assert (ro.payloads, rx.payloads) == ([b"A0"], [b"B0"])
    queue.push(grouped(b"A1", "A"))
    queue.dispatch(clock.now())
    assert ro.payloads == [b"A0", b"A1"]
    queue.detach(owner)
    queue.push(grouped(b"A2", "A"))
    queue.dispatch(clock.now())
    assert rx.payloads == [b"B0", b"A0", b"A1", b"A2"]
    assert rx.deliveries[1].redelivered


def test_releasing_a_groups_entries_lets_the_group_move(clock: ManualClock) -> None:
    """A consumer that gives every entry of its group back (released) no longer has the group:
    with no credit left for it, the group's entries go to the other consumer. While it still
    holds one of them, the group stays."""
    queue, _ = make_queue(ordering="priority")
    ro = RecordingReceiver()
    owner = Consumer(ro, credit=2, name="owner")
    other, rx = consumer(10, "other")
    queue.attach(owner)
    queue.push(grouped(b"A0", "A"))
    queue.push(grouped(b"A1", "A"))
    queue.dispatch(clock.now())
    assert ro.payloads == [b"A0", b"A1"]
    queue.attach(other)
    a0, a1 = ro.take()
    queue.settle(a1, Settlement.RELEASED)
    queue.dispatch(clock.now())
    assert rx.payloads == [], "the owner still holds A0: the group stays"
    queue.settle(a0, Settlement.RELEASED)
    queue.dispatch(clock.now())
    assert rx.payloads == [b"A0", b"A1"]
    queue.push(grouped(b"A2", "A"))
    owner.credit.add(5)
    queue.dispatch(clock.now())
    assert rx.payloads == [b"A0", b"A1", b"A2"], "the group now sticks to its new consumer"
    assert ro.payloads == []


def test_a_queue_without_groups_never_dispatches_selectively(clock: ManualClock) -> None:
    """Only a queue that has had an entry with a group pays for groups."""
    queue, _ = make_queue()
    a, _ = consumer(10)
    queue.attach(a)
    queue.push(entry(b"x"))
    assert not queue._selective
    queue.push(grouped(b"y", "G"))
    assert queue._selective


def test_unsettled_deliveries_are_each_consumers_own(clock: ManualClock) -> None:
    """A consumer's unsettled map is made by its first delivery (whichever path makes it):
    another consumer's deliveries never show in it."""
    queue, _ = make_queue()
    busy, rx = consumer(5)
    queue.attach(busy)
    queue.push(entry(b"dispatched"))
    queue.dispatch(clock.now())
    queue.deliver_now(busy, entry(b"direct"))
    idle, _ = consumer(5)
    other_queue, _ = make_queue()
    other_queue.attach(idle)
    assert [d.entry.message.payload for d in busy.unsettled.values()] == [b"dispatched", b"direct"]
    assert idle.unsettled == {} and Consumer(None, window=1).unsettled == {}
    for delivery in rx.take():
        queue.settle(delivery, Settlement.ACCEPTED)
    assert busy.unsettled == {}


def test_groups_past_the_limit_are_forgotten_when_nothing_of_them_is_in_flight(
    clock: ManualClock,
) -> None:
    """Producers inventing a group id a message must not grow the map without bound: past
    max_groups the groups used longest ago, with nothing in flight, are forgotten."""
    queue, _ = make_queue(ordering="priority", max_groups=4)
    first, r1 = consumer(10, "first")
    second, r2 = consumer(10, "second")
    queue.attach(first)
    queue.attach(second)
    for n in range(200):
        queue.push(grouped(b"m%d" % n, f"g{n}"))
        assert queue.dispatch(clock.now()) == 1
        for receiver in (r1, r2):
            for delivery in receiver.take():
                queue.settle(delivery, Settlement.ACCEPTED)
        assert queue.group_count <= 4


def test_groups_with_messages_in_flight_are_kept_past_the_limit(clock: ManualClock) -> None:
    """A group whose consumer holds one of its messages is never forgotten (its next message
    must go to the same consumer, after the one in flight); once they settle, the map shrinks
    back to the limit on the next new group."""
    queue, _ = make_queue(ordering="priority", max_groups=2)
    first, r1 = consumer(100, "first")
    second, r2 = consumer(100, "second")
    queue.attach(first)
    queue.attach(second)
    for n in range(10):
        queue.push(grouped(b"a%d" % n, f"g{n}"))
    assert queue.dispatch(clock.now()) == 10
    assert queue.group_count == 10, "all ten have a message in flight"
    owners = {n: queue.group_owner(f"g{n}") for n in range(10)}
    for n in range(10):
        queue.push(grouped(b"b%d" % n, f"g{n}"))
    assert queue.dispatch(clock.now()) == 10
    for n in range(10):
        owner = owners[n]
        assert owner is not None
        held = [d.entry.message.payload for d in owner.unsettled.values()]
        assert b"b%d" % n in held, "the group's second message went to its consumer"
    for receiver in (r1, r2):
        for delivery in receiver.take():
            queue.settle(delivery, Settlement.ACCEPTED)
    queue.push(grouped(b"new", "new"))
    queue.dispatch(clock.now())
    assert queue.group_count <= 2


def test_a_group_in_use_outlives_groups_used_longer_ago(clock: ManualClock) -> None:
    """The group forgotten first is the one used longest ago, not the one made first."""
    queue, _ = make_queue(ordering="priority", max_groups=2)
    only, receiver = consumer(100, "only")
    queue.attach(only)

    def send(payload: bytes, group: str) -> None:
        queue.push(grouped(payload, group))
        queue.dispatch(clock.now())
        for delivery in receiver.take():
            queue.settle(delivery, Settlement.ACCEPTED)

    send(b"A0", "A")
    send(b"B0", "B")
    send(b"A1", "A")  # A used after B
    send(b"C0", "C")
    assert queue.group_owner("A") is only
    assert queue.group_owner("B") is None, "B was used longest ago"
    assert queue.group_owner("C") is only
