"""What the journal serves over Arrow Flight of AMQP publications: a durable message (JMS
PERSISTENT) is journalled on ``[journal] persistent_topics``; a non-durable one (JMS
NON_PERSISTENT, which reaches the broker at QoS 1 but is never written toward the store) only
where its topic is opted in with ``qos0_topics``, like a QoS 0 publication. Sent by
python-qpid-proton, read back by a pyarrow Flight client, as Spark's executors read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from proton import Message
from proton.utils import BlockingConnection

from ..brokerproc import BrokerProcess, closing_all, live_amqp_url
from ..clients import unique

pa = pytest.importorskip("pyarrow")
flight = pytest.importorskip("pyarrow.flight")

from kittiwake.flight.protocol import RangeRequest, parse_latest_answer  # noqa: E402

# persistent_topics / qos0_topics of each broker: one selecting by topic, one the default.
SELECTIONS = {
    "by-topic": {"persistent_topics": ["a/#"], "qos0_topics": ["b/#"]},
    "default": {},
}


@pytest.fixture(scope="module", params=sorted(SELECTIONS))
def journal_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, BrokerProcess]]:
    name = request.param
    process = BrokerProcess(
        tmp_path_factory.mktemp(f"amqp-journal-{name}"),
        amqp=True,
        flight=True,
        journal={"retention_seconds": 3600, **SELECTIONS[name]},
    )
    process.start()
    try:
        yield name, process
    finally:
        process.stop()


@pytest.fixture
def flight_client(journal_broker: tuple[str, BrokerProcess]) -> Iterator[Any]:
    _name, process = journal_broker
    live_amqp_url(process)  # asserts the broker still runs, with its log if not
    connection = flight.connect(process.flight_url)
    yield connection
    connection.close()


@pytest.fixture
def amqp(journal_broker: tuple[str, BrokerProcess]) -> Iterator[Callable[..., BlockingConnection]]:
    _name, process = journal_broker

    def connect() -> BlockingConnection:
        return BlockingConnection(live_amqp_url(process), timeout=10)

    with closing_all(connect) as tracked:
        yield tracked


def high_water(client: Any) -> int:
    (result,) = list(client.do_action(flight.Action("latest", b"")))
    return parse_latest_answer(result.body.to_pybytes())[0][1]


def served_topics(client: Any, start: int, end: int, topics: list[str]) -> list[str]:
    ticket = RangeRequest(start, end, tuple(topics)).to_ticket()
    return [row["topic"] for row in client.do_get(flight.Ticket(ticket)).read_all().to_pylist()]


def test_durable_and_non_durable_messages_are_served_as_the_selection_says(
    journal_broker: tuple[str, BrokerProcess],
    flight_client: Any,
    amqp: Callable[..., BlockingConnection],
) -> None:
    name, _process = journal_broker
    tag = unique("j")
    sent = [
        (f"a/{tag}/durable", True),
        (f"a/{tag}/non-durable", False),
        (f"b/{tag}/durable", True),
        (f"b/{tag}/non-durable", False),
        (f"a/{tag}/end", True),  # last: its commit follows every earlier journal write
    ]
    before = high_water(flight_client)
    connection = amqp()
    for topic, durable in sent:
        # Returns once the broker settled it: for a durable message, after its commit.
        connection.create_sender(f"topic://{topic}").send(Message(body=topic, durable=durable))
    after = high_water(flight_client)

    if name == "by-topic":
        # a/#: persistent messages; b/#: non-persistent ones (QoS 0 and JMS NON_PERSISTENT).
        expected = [f"a/{tag}/durable", f"b/{tag}/non-durable", f"a/{tag}/end"]
    else:
        # The default: persistent messages on every topic, no non-persistent one.
        expected = [f"a/{tag}/durable", f"b/{tag}/durable", f"a/{tag}/end"]
    # Whole-journal filters, prefix filters and '+' filters (matched in SQL or in Python).
    for filters in (["#"], [f"a/{tag}/#", f"b/{tag}/#"], [f"+/{tag}/+"]):
        assert served_topics(flight_client, before, after, filters) == expected, filters
