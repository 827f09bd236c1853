"""Queue: ordering, delayed visibility, expiry, redelivery and its explicit bounds."""

from __future__ import annotations

import logging

import pytest

from kittiwake.broker.message import Message
from kittiwake.broker.queues import Queue, QueuedMessage, QueueTotals

NOW = 1_000.0


def entry(payload: bytes = b"x", topic: str = "t", **fields) -> QueuedMessage:
    return QueuedMessage(Message(topic, payload, qos=1, **fields), qos=1, persistent=False)


def queue(**kwargs) -> Queue:
    kwargs.setdefault("max_messages", 1000)
    kwargs.setdefault("max_bytes", 1_000_000)
    return Queue("q", **kwargs)


def pop_all(q: Queue, now: float = NOW) -> list[bytes]:
    out = []
    while (e := q.pop(now)) is not None:
        out.append(e.message.payload)
    return out


def test_fifo_order() -> None:
    """A FIFO queue hands entries back in arrival order."""
    q = queue()
    for i in range(5):
        assert q.push(entry(bytes([65 + i]))) == (True, [])
    assert len(q) == 5
    assert pop_all(q) == [b"A", b"B", b"C", b"D", b"E"]
    assert len(q) == 0
    assert q.pop(NOW) is None


def test_fifo_ignores_priority() -> None:
    """In FIFO order a message's priority does not reorder it."""
    q = queue()
    q.push(entry(b"low", priority=0))
    q.push(entry(b"high", priority=9))
    assert pop_all(q) == [b"low", b"high"]


def test_priority_order_highest_first_then_arrival() -> None:
    """Priority order: higher priority first; equal priority keeps arrival order."""
    q = queue(ordering="priority")
    for payload, priority in [(b"a4", 4), (b"b9", 9), (b"c4", 4), (b"d0", 0), (b"e9", 9)]:
        q.push(entry(payload, priority=priority))
    assert pop_all(q) == [b"b9", b"e9", b"a4", b"c4", b"d0"]


def test_delayed_entry_invisible_until_its_delivery_time() -> None:
    """An entry whose delivery time is in the future is invisible until the clock passes it."""
    q = queue()
    q.push(entry(b"later", delivery_time=NOW + 10))
    q.push(entry(b"now"))
    assert len(q) == 2
    assert q.next_visible_time() == NOW + 10
    assert pop_all(q, NOW) == [b"now"]
    assert q.pop(NOW + 9.99) is None
    assert len(q) == 1
    got = q.pop(NOW + 10)
    assert got is not None and got.message.payload == b"later"
    assert len(q) == 0 and q.bytes == 0
    assert q.next_visible_time() is None


def test_delayed_entries_become_visible_in_delivery_time_order() -> None:
    """Several delayed entries come out in order of their delivery times."""
    q = queue()
    q.push(entry(b"t30", delivery_time=NOW + 30))
    q.push(entry(b"t10", delivery_time=NOW + 10))
    q.push(entry(b"t20", delivery_time=NOW + 20))
    assert pop_all(q, NOW + 15) == [b"t10"]
    assert pop_all(q, NOW + 100) == [b"t20", b"t30"]


def test_delayed_entry_in_priority_queue() -> None:
    """Once visible, a delayed entry takes its place by priority."""
    q = queue(ordering="priority")
    q.push(entry(b"delayed-high", priority=9, delivery_time=NOW + 5))
    q.push(entry(b"low", priority=1))
    assert pop_all(q, NOW) == [b"low"]
    q.push(entry(b"mid", priority=5))
    assert pop_all(q, NOW + 5) == [b"delayed-high", b"mid"]


def test_releasing_a_delayed_entry_does_not_change_the_message() -> None:
    """Message is immutable once published (message.py): visibility is queue state, not the
    message's. The same Message is shared by other subscribers' queues and the store, and a
    JMS consumer reads its delivery time (JMSDeliveryTime) after it becomes visible."""
    q = queue()
    e = entry(b"later", delivery_time=NOW + 10)
    q.push(e)
    assert q.pop(NOW + 10) is e
    assert e.message.delivery_time == NOW + 10


def test_expired_entries_are_skipped_and_counted() -> None:
    """pop skips expired entries, counts them, and still returns the next live one."""
    q = queue()
    q.push(entry(b"dead1", expiry=NOW + 1))
    q.push(entry(b"alive", expiry=NOW + 100))
    q.push(entry(b"dead2", expiry=NOW + 2))
    q.push(entry(b"forever"))
    assert pop_all(q, NOW + 50) == [b"alive", b"forever"]
    assert q.counters.expired == 2
    assert q.bytes == 0


def test_the_expiry_sweep_removes_only_what_expired_and_keeps_the_order() -> None:
    """expire (the sweep of queues nobody consumes) takes the expired entries wherever they
    wait (returned, ready, delayed) and leaves the rest in their order; with nothing expired
    it changes nothing."""
    q = queue()
    q.push(entry(b"1", expiry=NOW + 100))
    q.push(entry(b"dead", expiry=NOW + 1))
    q.push(entry(b"2"))
    q.push(entry(b"3", expiry=NOW + 100))
    taken = q.pop(NOW)
    assert taken is not None
    q.push_front(taken)  # returned to the head, as a redelivery
    assert q.expire(NOW) == 0
    assert (q.count, q.counters.expired) == (4, 0)
    assert q.expire(NOW + 50) == 1
    assert q.counters.expired == 1
    assert pop_all(q, NOW + 50) == [b"1", b"2", b"3"]


def test_push_front_redelivers_ahead_of_the_rest() -> None:
    """push_front puts a taken entry back at the head (redelivery) and restores its bytes."""
    q = queue()
    for p in (b"1", b"2", b"3"):
        q.push(entry(p))
    first = q.pop(NOW)
    assert first is not None
    before = q.bytes
    q.push_front(first)
    assert q.bytes == before + first.size
    assert pop_all(q) == [b"1", b"2", b"3"]


def test_push_front_is_never_refused() -> None:
    """Redelivery is not subject to the bound: a full queue still takes the entry back."""
    q = queue(max_messages=1)
    q.push(entry(b"1"))
    taken = q.pop(NOW)
    q.push(entry(b"2"))
    q.push_front(taken)
    assert len(q) == 2
    assert pop_all(q) == [b"1", b"2"]


def test_push_front_in_priority_queue_keeps_arrival_rank() -> None:
    """In priority order a redelivered entry goes back ahead of later equal-priority ones."""
    q = queue(ordering="priority")
    for p in (b"1", b"2"):
        q.push(entry(p, priority=4))
    taken = q.pop(NOW)
    q.push(entry(b"3", priority=4))
    q.push_front(taken)
    assert pop_all(q) == [b"1", b"2", b"3"]


def test_count_bound_reject_new() -> None:
    """reject_new: a full queue refuses the new entry, keeps the old ones and counts it."""
    q = queue(max_messages=2, policy="reject_new")
    assert q.push(entry(b"1"))[0] and q.push(entry(b"2"))[0]
    assert q.push(entry(b"3")) == (False, [])
    assert q.counters.rejected == 1
    assert pop_all(q) == [b"1", b"2"]


def test_count_bound_discard_oldest() -> None:
    """discard_oldest: the oldest entry makes room and is returned for its owner to release."""
    q = queue(max_messages=2, policy="discard_oldest")
    first = entry(b"1")
    q.push(first)
    q.push(entry(b"2"))
    accepted, victims = q.push(entry(b"3"))
    assert accepted is True
    assert victims == [first]
    assert q.counters.discarded == 1 and q.counters.rejected == 0
    assert pop_all(q) == [b"2", b"3"]


def test_byte_bound_reject_new() -> None:
    """The byte budget (payload + topic) is a bound of its own."""
    q = queue(max_bytes=10, policy="reject_new")
    assert q.push(entry(b"aaaa"))[0]  # 4 + len("t") = 5 bytes
    assert q.push(entry(b"bbbb"))[0]  # 10 bytes
    assert q.bytes == 10
    assert q.push(entry(b"c")) == (False, [])
    assert q.counters.rejected == 1
    assert q.bytes == 10


def test_byte_bound_discard_oldest_drops_as_many_as_needed() -> None:
    """discard_oldest drops the oldest entries until the new one fits the byte budget."""
    q = queue(max_bytes=10, policy="discard_oldest")
    a, b = entry(b"aa"), entry(b"bb")  # 3 bytes each
    q.push(a)
    q.push(b)
    q.push(entry(b"cc"))  # 9 bytes
    accepted, victims = q.push(entry(b"dddddd"))  # 7 bytes: needs 6 freed
    assert accepted
    assert victims == [a, b]
    assert q.bytes == 10
    assert pop_all(q) == [b"cc", b"dddddd"]


def test_entry_larger_than_the_budget_is_refused_even_when_discarding() -> None:
    """An entry that can never fit is refused and nothing is thrown away for it."""
    q = queue(max_bytes=10, policy="discard_oldest")
    q.push(entry(b"aa"))
    assert q.push(entry(b"x" * 20)) == (False, [])
    assert q.counters.rejected == 1 and q.counters.discarded == 0
    assert pop_all(q) == [b"aa"]


def _drop_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if r.name == "kittiwake.broker.queues"]
    caplog.clear()
    return lines


@pytest.mark.parametrize("policy", ["reject_new", "discard_oldest"])
def test_drops_are_logged_first_at_once_then_by_the_tick_with_true_counts(
    policy, caplog: pytest.LogCaptureFixture
) -> None:
    """The first drop is logged when it happens; later ones only by report_drops (the
    broker's tick), one line giving how many since the last line and how many in all; a
    tick with no new drop logs nothing and the next drop is logged at once again."""
    totals = QueueTotals()
    q = queue(max_messages=2, policy=policy, totals=totals)
    q.push(entry(b"a"))
    q.push(entry(b"b"))
    with caplog.at_level(logging.WARNING, "kittiwake.broker.queues"):
        for _ in range(1_500):
            q.push(entry(b"c"))
        assert q.dropped == 1_500
        [first] = _drop_lines(caplog)
        assert "1 in all" in first and policy in first
        totals.report_drops()
        [report] = _drop_lines(caplog)
        assert "1499 more dropped, 1500 in all" in report
        totals.report_drops()  # nothing new: quiet, and the run is over
        assert _drop_lines(caplog) == []
        totals.report_drops()
        q.push(entry(b"d"))
        q.push(entry(b"e"))
        [again] = _drop_lines(caplog)
        assert "1501 in all" in again
        q.end_drop_report()  # the queue's end tells what the tick has not
        [last] = _drop_lines(caplog)
        assert "1 more dropped, 1502 in all" in last
        totals.report_drops()
        assert _drop_lines(caplog) == []


def test_discard_oldest_in_priority_order_drops_lowest_priority_newest() -> None:
    """In priority order the cheapest entry to lose is the lowest-priority, newest one."""
    q = queue(max_messages=3, policy="discard_oldest", ordering="priority")
    q.push(entry(b"low-old", priority=1))
    low_new = entry(b"low-new", priority=1)
    q.push(low_new)
    q.push(entry(b"high", priority=9))
    accepted, victims = q.push(entry(b"mid", priority=5))
    assert accepted and victims == [low_new]
    assert pop_all(q) == [b"high", b"mid", b"low-old"]


def test_bytes_track_contents() -> None:
    """bytes is the sum of queued entry sizes through push, pop and drain."""
    q = queue()
    q.push(entry(b"12345", topic="ab"))  # 7
    q.push(entry(b"1", topic="abc", delivery_time=NOW + 5))  # 4, delayed
    assert q.bytes == 11
    q.pop(NOW)
    assert q.bytes == 4
    drained = q.drain()
    assert [e.message.payload for e in drained] == [b"1"]
    assert q.bytes == 0 and len(q) == 0


def test_drain_returns_visible_and_delayed_entries() -> None:
    """drain empties the queue of every entry, visible or not."""
    q = queue(ordering="priority")
    q.push(entry(b"a", priority=3))
    q.push(entry(b"b", delivery_time=NOW + 100))
    assert sorted(e.message.payload for e in q.drain()) == [b"a", b"b"]
    assert q.pop(NOW + 1000) is None


def test_sequence_numbers_follow_arrival() -> None:
    """Each accepted entry gets a larger arrival sequence than the previous one."""
    q = queue()
    entries = [entry(bytes([i])) for i in range(3)]
    for e in entries:
        q.push(e)
    assert [e.sequence for e in entries] == sorted({e.sequence for e in entries})


def test_pop_hands_back_expired_entries_when_asked() -> None:
    """pop can report the expired entries it skipped, so their owner can release them."""
    q = queue()
    dead = entry(b"dead", expiry=NOW)
    q.push(dead)
    q.push(entry(b"alive"))
    expired: list[QueuedMessage] = []
    got = q.pop(NOW, expired)
    assert got is not None and got.message.payload == b"alive"
    assert expired == [dead]


def test_structures_made_on_first_use_belong_to_their_queue() -> None:
    """A fresh queue shares empty heaps and zero counters until it needs its own: filling one
    queue's priority, delayed and returned heaps and counting its drops leaves another
    fresh queue empty and unharmed, and each hands out its own entries."""
    used = queue(ordering="priority", max_messages=3, policy="reject_new")
    used.push(entry(b"low", priority=1))
    used.push(entry(b"later", delivery_time=NOW + 5))
    taken = used.pop(NOW)
    assert taken is not None
    used.push_front(taken)
    used.push(entry(b"high", priority=9))
    assert used.push(entry(b"refused")) == (False, [])
    fifo = queue()
    fifo.push_front(entry(b"back"))
    fresh = queue()
    assert fresh.counters.rejected == 0 and used.counters.rejected == 1
    assert fresh.entries() == [] and fresh.next_visible_time() is None
    assert pop_all(fresh, NOW + 10) == []
    assert pop_all(fifo) == [b"back"]
    # "later" has the default priority (4), above "low"'s 1.
    assert pop_all(used, NOW + 10) == [b"high", b"later", b"low"]
    used.push(entry(b"again", delivery_time=NOW + 20))
    assert used.drain()[0].message.payload == b"again"
    assert queue().next_visible_time() is None
