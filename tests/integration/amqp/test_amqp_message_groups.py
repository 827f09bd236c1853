"""Message groups over AMQP 1.0 (DESIGN.md section 5): messages on a queue with the same
group-id (JMSXGroupID) go to one consumer at a time, and the group moves only when that
consumer closes or gives its messages back. Real sockets, python-qpid-proton's client."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from proton import Message, Timeout
from proton.utils import BlockingConnection, BlockingReceiver

from ..clients import unique

Connect = Callable[..., BlockingConnection]


def take(receiver: BlockingReceiver, count: int) -> list[Message]:
    """Receive and accept ``count`` messages (each within a bounded wait)."""
    got = []
    for _ in range(count):
        got.append(receiver.receive(timeout=5))
        receiver.accept()
    return got


def test_each_group_sticks_to_one_consumer_and_moves_when_it_closes(amqp: Connect) -> None:
    queue = unique("q")
    connection = amqp()
    first = connection.create_receiver(queue, credit=20, name="first")
    second = connection.create_receiver(queue, credit=20, name="second")
    sender = connection.create_sender(queue)
    for n in range(5):
        sender.send(Message(body=f"A{n}", group_id="A"))
        sender.send(Message(body=f"B{n}", group_id="B"))
    got = {name: take(receiver, 5) for name, receiver in (("first", first), ("second", second))}
    group_of = {}
    for name, messages in got.items():
        groups = {m.group_id for m in messages}
        assert len(groups) == 1, f"{name} got messages of several groups: {messages}"
        group = groups.pop()
        group_of[group] = name
        assert [m.body for m in messages] == [f"{group}{n}" for n in range(5)], "in order"
    assert sorted(group_of) == ["A", "B"]
    receivers = {"first": first, "second": second}
    # Later messages of each group follow it.
    sender.send(Message(body="A5", group_id="A"))
    sender.send(Message(body="B5", group_id="B"))
    for group in ("A", "B"):
        assert [m.body for m in take(receivers[group_of[group]], 1)] == [f"{group}5"]
    # The consumer of A closes: A moves to the one that is left.
    receivers.pop(group_of["A"]).close()
    (remaining,) = receivers.values()
    sender.send(Message(body="A6", group_id="A"))
    assert [m.body for m in take(remaining, 1)] == ["A6"]
    connection.close()


def test_unsettled_group_messages_move_with_the_group_when_their_consumer_closes(
    amqp: Connect,
) -> None:
    queue = unique("q")
    holder_connection = amqp()
    holder = holder_connection.create_receiver(queue, credit=10, name="holder")
    sender = amqp().create_sender(queue)
    for n in range(3):
        sender.send(Message(body=f"G{n}", group_id="G"))
    assert [holder.receive(timeout=5).body for _ in range(3)] == ["G0", "G1", "G2"]
    other = amqp().create_receiver(queue, credit=10, name="other")
    sender.send(Message(body="G3", group_id="G"))
    with pytest.raises(Timeout):
        other.receive(timeout=0.3)  # G is the holder's while it is there
    holder_connection.close()  # never settled: the group and its messages move
    got = take(other, 4)
    assert [m.body for m in got] == ["G0", "G1", "G2", "G3"]
    assert [m.delivery_count for m in got[:3]] == [1, 1, 1], "sent to the holder before"
