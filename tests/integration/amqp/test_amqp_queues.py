"""Queue destinations over AMQP with python-qpid-proton's blocking client: send and receive,
the four outcomes, redelivery counting, dead letters, priority, competing consumers,
presettled (acknowledgement-free) links, and refusals of what is not supported yet."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from proton import Delivery, Message, Timeout
from proton.reactor import AtMostOnce, Copy, Selector
from proton.utils import BlockingConnection, BlockingReceiver, LinkDetached

from ..clients import unique

Connect = Callable[..., BlockingConnection]


def modified_failed(receiver: BlockingReceiver, *, undeliverable: bool = False) -> None:
    """Settle the received messages as MODIFIED with delivery-failed (what Qpid JMS sends on
    a session recover or rollback); the blocking client's release() does not set the flag."""
    fetcher = receiver.fetcher
    assert fetcher is not None
    while fetcher.unsettled:
        delivery = fetcher.unsettled.popleft()
        delivery.local.failed = True
        delivery.local.undeliverable = undeliverable
        delivery.update(Delivery.MODIFIED)
        delivery.settle()
    receiver.connection.wait(lambda: True, timeout=1)


def test_send_and_receive_with_accept(amqp: Connect) -> None:
    queue = unique("q")
    connection = amqp()
    sender = connection.create_sender(queue)
    sender.send(Message(body="hello", durable=True, properties={"n": 1}))
    receiver = connection.create_receiver(queue)
    message = receiver.receive(timeout=5)
    assert (message.body, message.durable, message.properties) == ("hello", True, {"n": 1})
    assert message.delivery_count == 0
    receiver.accept()
    with pytest.raises(Timeout):
        receiver.receive(timeout=0.3)


def test_queue_prefix_and_capability_name_the_same_queue(amqp: Connect) -> None:
    name = unique("q")
    connection = amqp()
    connection.create_sender(f"queue://{name}").send(Message(body="via prefix"))
    receiver = connection.create_receiver(name)
    assert receiver.receive(timeout=5).body == "via prefix"
    receiver.accept()


def test_released_comes_back_unchanged_modified_counts_an_attempt(amqp: Connect) -> None:
    queue = unique("q")
    connection = amqp()
    connection.create_sender(queue).send(Message(body="again"))
    receiver = connection.create_receiver(queue)
    assert receiver.receive(timeout=5).delivery_count == 0
    receiver.release(delivered=False)  # RELEASED: never seen, the count stays
    assert receiver.receive(timeout=5).delivery_count == 0
    modified_failed(receiver)  # one more attempt
    message = receiver.receive(timeout=5)
    assert message.body == "again" and message.delivery_count == 1
    receiver.accept()


def test_rejected_goes_to_the_dead_letter_queue(amqp: Connect) -> None:
    queue = unique("q")
    connection = amqp()
    connection.create_sender(queue).send(Message(body=b"poison", properties={"k": "v"}))
    receiver = connection.create_receiver(queue)
    receiver.receive(timeout=5)
    receiver.reject()
    dead = connection.create_receiver("DLQ")
    letter = dead.receive(timeout=5)
    while letter.properties.get("KW_OriginalQueue") != queue:  # the DLQ is shared
        dead.accept()
        letter = dead.receive(timeout=5)
    dead.accept()
    assert bytes(letter.body) == b"poison"
    assert letter.properties["k"] == "v"
    assert letter.properties["KW_Reason"] == "rejected"
    assert letter.properties["KW_OriginalDestination"] == f"queue://{queue}"


def test_too_many_failed_attempts_dead_letter(amqp: Connect) -> None:
    """The module broker allows 3 delivery attempts."""
    queue = unique("q")
    connection = amqp()
    connection.create_sender(queue).send(Message(body="flaky"))
    receiver = connection.create_receiver(queue)
    for attempt in range(3):
        assert receiver.receive(timeout=5).delivery_count == attempt
        modified_failed(receiver)
    with pytest.raises(Timeout):
        receiver.receive(timeout=0.3)
    dead = connection.create_receiver("DLQ")
    reasons = []
    for _ in range(20):
        letter = dead.receive(timeout=5)
        dead.accept()
        if letter.properties.get("KW_OriginalQueue") == queue:
            reasons.append(letter.properties["KW_Reason"])
            break
    assert reasons == ["maximum delivery attempts reached"]


def test_priority_order_for_messages_already_queued(amqp: Connect) -> None:
    queue = unique("q")
    connection = amqp()
    sender = connection.create_sender(queue)
    for body, priority in (("low", 1), ("high", 9), ("default", 4), ("high2", 9)):
        sender.send(Message(body=body, priority=priority))
    receiver = connection.create_receiver(queue)
    got = []
    for _ in range(4):
        got.append(receiver.receive(timeout=5).body)
        receiver.accept()
    assert got == ["high", "high2", "default", "low"]


def test_competing_consumers_share_without_duplicates(amqp: Connect) -> None:
    queue = unique("q")
    connection = amqp()
    first = connection.create_receiver(queue, credit=5, name="first")
    second = connection.create_receiver(queue, credit=5, name="second")
    sender = connection.create_sender(queue)
    for n in range(10):
        sender.send(Message(body=n))
    got: list[int] = []
    for receiver in (first, second):
        for _ in range(5):
            got.append(receiver.receive(timeout=5).body)
            receiver.accept()
    assert sorted(got) == list(range(10))


def test_unsettled_deliveries_come_back_when_the_consumer_goes(amqp: Connect) -> None:
    queue = unique("q")
    first_connection = amqp()
    first_connection.create_sender(queue).send(Message(body="in flight"))
    receiver = first_connection.create_receiver(queue)
    assert receiver.receive(timeout=5).body == "in flight"
    first_connection.close()  # never settled
    receiver = amqp().create_receiver(queue)
    message = receiver.receive(timeout=5)
    assert message.body == "in flight" and message.delivery_count == 1
    receiver.accept()


def test_presettled_both_ways(amqp: Connect) -> None:
    queue = unique("q")
    connection = amqp()
    sender = connection.create_sender(queue, options=AtMostOnce())
    for n in range(3):
        sender.send(Message(body=n))
    receiver = connection.create_receiver(queue, options=AtMostOnce(), credit=3)
    assert [receiver.receive(timeout=5).body for _ in range(3)] == [0, 1, 2]
    # Settled on sending: nothing comes back when this consumer goes away.
    receiver.close()
    again = connection.create_receiver(queue, name="again")
    with pytest.raises(Timeout):
        again.receive(timeout=0.3)


def test_undeliverable_here_skips_that_consumer(amqp: Connect) -> None:
    queue = unique("q")
    connection = amqp()
    connection.create_sender(queue).send(Message(body="not for me"))
    picky = connection.create_receiver(queue, name="picky")
    assert picky.receive(timeout=5).body == "not for me"
    modified_failed(picky, undeliverable=True)
    with pytest.raises(Timeout):
        picky.receive(timeout=0.3)
    other = connection.create_receiver(queue, name="other")
    message = other.receive(timeout=5)
    assert message.body == "not for me" and message.delivery_count == 1
    other.accept()


def test_queue_selectors_are_refused_until_supported(amqp: Connect) -> None:
    connection = amqp()
    with pytest.raises(LinkDetached, match="not-implemented"):
        connection.create_receiver(unique("q"), options=Selector("a = 1"))


def test_drain_gets_a_waiting_message_before_the_credit_is_used_up(amqp: Connect) -> None:
    """Qpid JMS pulls with drain when prefetch is 0: a waiting message must come, not an
    emptied credit."""
    queue = unique("q")
    connection = amqp()
    connection.create_sender(queue).send(Message(body="waiting"))
    receiver = connection.create_receiver(queue, credit=0, name="puller")
    receiver.link.drain(1)
    assert receiver.receive(timeout=5).body == "waiting"
    receiver.accept()


def test_browser_sees_without_consuming_with_a_selector(amqp: Connect) -> None:
    queue = unique("q")
    connection = amqp()
    sender = connection.create_sender(queue)
    for n in range(4):
        sender.send(Message(body=n, properties={"even": n % 2 == 0}))
    browser = connection.create_receiver(
        queue, credit=10, name="browser", options=[Copy(), Selector("even = TRUE")]
    )
    seen = []
    for _ in range(2):
        seen.append(browser.receive(timeout=5).body)
        browser.accept()
    with pytest.raises(Timeout):
        browser.receive(timeout=0.3)
    assert seen == [0, 2]
    # Nothing was taken: a consumer still gets all four.
    consumer = connection.create_receiver(queue, credit=10, name="consumer")
    got = []
    for _ in range(4):
        got.append(consumer.receive(timeout=5).body)
        consumer.accept()
    assert got == [0, 1, 2, 3]
