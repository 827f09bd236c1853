"""Queue destinations over AMQP with python-qpid-proton's blocking client: send and receive,
the four outcomes, redelivery counting, dead letters, priority, competing consumers,
presettled (acknowledgement-free) links, selectors on queue consumers."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from proton import Delivery, Message, Timeout, byte, symbol
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


def test_an_at_most_once_message_to_a_settling_consumer_is_done_once_sent(
    amqp: Connect,
) -> None:
    """A presettled (acknowledgements disabled) non-persistent send is at most once: a consumer
    whose link settles still gets it settled on sending, and the broker is done with it then,
    so nothing comes back when that consumer goes. Before, its core delivery sat in the link's
    unsettled map until the link closed, which then gave it back to the queue: sent twice."""
    queue = unique("q")
    connection = amqp()
    connection.create_sender(queue, options=AtMostOnce()).send(Message(body="once"))
    receiver = connection.create_receiver(queue, credit=1)
    assert receiver.receive(timeout=5).body == "once"
    fetcher = receiver.fetcher
    assert fetcher is not None and not fetcher.unsettled, "sent settled: at most once"
    receiver.close()
    again = connection.create_receiver(queue, name="again")
    connection.create_sender(queue, name="fence").send(Message(body="fence"))
    assert again.receive(timeout=5).body == "fence"
    again.accept()


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


def test_a_queue_consumer_gets_only_what_its_selector_selects(amqp: Connect) -> None:
    """JMS: an entry the consumer's selector refuses is skipped, not taken; it stays queued
    for a consumer that selects it, in its place."""
    queue = unique("q")
    connection = amqp()
    sender = connection.create_sender(queue)
    for n in range(6):
        sender.send(Message(body=n, properties={"colour": "red" if n % 2 else "blue"}))
    reds = connection.create_receiver(
        queue, credit=10, name="reds", options=Selector("colour = 'red'")
    )
    got = []
    for _ in range(3):
        got.append(reds.receive(timeout=5).body)
        reds.accept()
    assert got == [1, 3, 5]
    with pytest.raises(Timeout):
        reds.receive(timeout=0.3)
    # The blue ones were never taken: a consumer without a selector gets them, in order.
    plain = connection.create_receiver(queue, credit=10, name="plain")
    rest = []
    for _ in range(3):
        rest.append(plain.receive(timeout=5).body)
        plain.accept()
    assert rest == [0, 2, 4]


def test_competing_selective_consumers_each_get_their_own(amqp: Connect) -> None:
    queue = unique("q")
    connection = amqp()
    small = connection.create_receiver(queue, credit=10, name="small", options=Selector("n < 5"))
    large = connection.create_receiver(queue, credit=10, name="large", options=Selector("n >= 5"))
    sender = connection.create_sender(queue)
    for n in range(10):
        sender.send(Message(body=n, properties={"n": n}))
    got_small, got_large = [], []
    for receiver, got in ((small, got_small), (large, got_large)):
        for _ in range(5):
            got.append(receiver.receive(timeout=5).body)
            receiver.accept()
    assert (got_small, got_large) == ([0, 1, 2, 3, 4], [5, 6, 7, 8, 9])


def test_an_entry_no_consumer_selects_stays_queued(amqp: Connect) -> None:
    """Nobody selects it now: it waits (JMS keeps it), and a later consumer gets it."""
    queue = unique("q")
    connection = amqp()
    picky = connection.create_receiver(queue, credit=5, name="picky", options=Selector("k = 1"))
    sender = connection.create_sender(queue)
    sender.send(Message(body="unwanted", properties={"k": 2}))
    sender.send(Message(body="wanted", properties={"k": 1}))
    assert picky.receive(timeout=5).body == "wanted"
    picky.accept()
    with pytest.raises(Timeout):
        picky.receive(timeout=0.3)
    picky.close()
    later = connection.create_receiver(queue, name="later")
    message = later.receive(timeout=5)
    assert message.body == "unwanted" and message.delivery_count == 0
    later.accept()


def test_a_selective_consumer_reads_header_fields(amqp: Connect) -> None:
    queue = unique("q")
    connection = amqp()
    sender = connection.create_sender(queue)
    sender.send(Message(body="low", priority=1))
    sender.send(Message(body="high", priority=8))
    urgent = connection.create_receiver(
        queue, credit=5, name="urgent", options=Selector("JMSPriority > 4")
    )
    assert urgent.receive(timeout=5).body == "high"
    urgent.accept()
    with pytest.raises(Timeout):
        urgent.receive(timeout=0.3)


def test_an_invalid_queue_selector_is_refused(amqp: Connect) -> None:
    connection = amqp()
    with pytest.raises(LinkDetached, match="invalid-field"):
        connection.create_receiver(unique("q"), options=Selector("a = "))


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


def test_browser_given_one_credit_at_a_time_sees_every_message(amqp: Connect) -> None:
    """A browser's credit coming back to a number it had before is still new credit: the
    browser sends by its link's credit, not its consumer's, so it must not skip the flow."""
    queue = unique("q")
    connection = amqp()
    sender = connection.create_sender(queue)
    for n in range(4):
        sender.send(Message(body=n))
    # credit=1: proton's blocking receiver grants one more whenever it has none left.
    browser = connection.create_receiver(queue, credit=1, name="browser", options=[Copy()])
    seen = []
    for _ in range(4):
        seen.append(browser.receive(timeout=5).body)
        browser.accept()
    assert seen == [0, 1, 2, 3]


def test_browser_topped_up_to_its_earlier_credit_sees_the_rest(amqp: Connect) -> None:
    queue = unique("q")
    connection = amqp()
    sender = connection.create_sender(queue)
    for n in range(6):
        sender.send(Message(body=n))
    browser = connection.create_receiver(queue, credit=3, name="browser", options=[Copy()])
    seen = [browser.receive(timeout=5).body for _ in range(3)]
    browser.accept()
    browser.link.flow(3)  # back to 3, as Qpid JMS tops a browser up to its prefetch
    seen += [browser.receive(timeout=5).body for _ in range(3)]
    assert seen == [0, 1, 2, 3, 4, 5]


def test_a_dead_letter_keeps_its_jms_type_and_body(amqp: Connect) -> None:
    """A TextMessage and a MapMessage rejected to the DLQ come out as a TextMessage and a
    MapMessage with their ids, gaining the dead letter's properties."""
    queue = unique("q")
    jms_type = symbol("x-opt-jms-msg-type")
    connection = amqp()
    sender = connection.create_sender(queue)
    sent = [
        Message(body="text", annotations={jms_type: byte(5)}, id="ID:t", properties={"k": 1}),
        Message(body={"a": 1}, annotations={jms_type: byte(2)}, correlation_id="c"),
    ]
    for message in sent:
        sender.send(message)
    receiver = connection.create_receiver(queue, credit=2)
    for _ in sent:
        receiver.receive(timeout=5)
        receiver.reject()
    dead = connection.create_receiver("DLQ", credit=10)
    letters = []
    for _ in range(50):
        letter = dead.receive(timeout=5)
        dead.accept()
        if letter.properties.get("KW_OriginalQueue") == queue:  # the DLQ is shared
            letters.append(letter)
            if len(letters) == len(sent):
                break
    for want, got in zip(sent, letters, strict=True):
        assert got.body == want.body and type(got.body) is type(want.body)
        assert got.annotations[jms_type] == want.annotations[jms_type]
        assert (got.id, got.correlation_id) == (want.id, want.correlation_id)
        assert got.properties["KW_Reason"] == "rejected"
        assert got.properties["KW_OriginalDestination"] == f"queue://{queue}"
    assert letters[0].properties["k"] == 1
