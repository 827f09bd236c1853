"""The Spark sink's fenced writes over the network, without Spark: a put reaches an MQTT
subscriber (paho-mqtt) and the journal once, its replay publishes nothing, a committed batch
refuses late puts, fences survive a kill -9; oversized, unauthorised and malformed puts get
Flight errors while the service keeps serving.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
flight = pytest.importorskip("pyarrow.flight")

from kittiwake.flight.protocol import (  # noqa: E402
    WRITE_SCHEMA,
    RangeRequest,
    WriteAnswer,
    WriteRequest,
    parse_latest_answer,
)
from kittiwake.spark.client import SinkClient  # noqa: E402
from kittiwake.spark.options import SinkOptions  # noqa: E402

from .brokerproc import BrokerProcess  # noqa: E402
from .clients import PahoClient, unique, wait_until  # noqa: E402

MAX_PUT_ROWS = 500
SECTIONS: dict[str, Any] = {
    "journal": {"retention_seconds": 3600},
    "limits": {"max_put_rows": MAX_PUT_ROWS},
    "auth": {"publish_deny": ["secret/#"]},
}


@pytest.fixture(scope="module")
def sink_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("writes"), flight=True, **SECTIONS)
    process.start()
    yield process
    process.stop()


def rows(topic: str, payloads: list[str], **columns: list[Any]) -> pa.RecordBatch:
    count = len(payloads)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([topic] * count),
            pa.array([p.encode() for p in payloads], pa.binary()),
            pa.array(columns.get("qos", [1] * count), pa.int32()),
            pa.array(columns.get("retain", [False] * count)),
            pa.nulls(count, WRITE_SCHEMA.field("properties").type),
        ],
        schema=WRITE_SCHEMA,
    )


def put(url: str, request: WriteRequest, *batches: pa.RecordBatch) -> WriteAnswer:
    return SinkClient(SinkOptions.parse({"url": url, "retryTimeoutMs": "20000"})).put(
        request, list(batches)
    )


def journal(url: str, topic: str) -> list[tuple[str, bytes]]:
    connection = flight.connect(url)
    try:
        (result,) = list(connection.do_action(flight.Action("latest", b"")))
        _earliest, high_water = parse_latest_answer(result.body.to_pybytes())[0]
        ticket = RangeRequest(0, high_water, (topic,)).to_ticket()
        table = connection.do_get(flight.Ticket(ticket)).read_all()
        return [(r["topic"], r["payload"]) for r in table.to_pylist()]
    finally:
        connection.close()


def test_a_put_is_published_once_and_its_replay_publishes_nothing(
    sink_broker: BrokerProcess, paho: Callable[..., PahoClient]
) -> None:
    topic = unique("out")
    subscriber = paho(sink_broker.address)
    subscriber.subscribe(topic, 1)
    request = WriteRequest(unique("query"), 0, 0)
    payloads = [f"row {i}" for i in range(20)]

    url = sink_broker.flight_url
    first = put(url, request, rows(topic, payloads[:8]), rows(topic, payloads[8:]))
    assert first == WriteAnswer(20, False)
    got = subscriber.get_many(20)
    assert [m.payload.decode() for m in got] == payloads
    assert {m.qos for m in got} == {1}

    replay = put(url, request, rows(topic, payloads))
    assert replay == WriteAnswer(20, True)
    subscriber.no_message(within=0.5)
    assert journal(url, topic) == [(topic, p.encode()) for p in payloads]


def test_a_late_put_for_a_committed_batch_publishes_nothing(
    sink_broker: BrokerProcess, paho: Callable[..., PahoClient]
) -> None:
    topic = unique("late")
    writer = unique("query")
    url = sink_broker.flight_url
    assert not put(url, WriteRequest(writer, 4, 0), rows(topic, ["a"])).already_committed
    SinkClient(SinkOptions.parse({"url": url})).commit(writer, 4)
    # Partition 1 of batch 4 never came before, but the batch is committed: a zombie task.
    assert put(url, WriteRequest(writer, 4, 1), rows(topic, ["zombie"])).already_committed
    assert not put(url, WriteRequest(writer, 5, 0), rows(topic, ["b"])).already_committed
    assert journal(url, topic) == [(topic, b"a"), (topic, b"b")]


def test_a_retained_row_is_retained(
    sink_broker: BrokerProcess, paho: Callable[..., PahoClient]
) -> None:
    topic = unique("stats")
    put(
        sink_broker.flight_url,
        WriteRequest(unique("query"), 0, 0),
        rows(topic, ["old", "new"], retain=[True, True]),
    )
    late = paho(sink_broker.address)
    late.subscribe(topic, 1)
    message = late.get()
    assert (message.payload, message.retain) == (b"new", True)
    late.no_message(within=0.3)


def test_too_large_unauthorised_and_malformed_puts_get_flight_errors(
    sink_broker: BrokerProcess,
) -> None:
    url = sink_broker.flight_url
    topic = unique("refused")
    big = rows(topic, ["x"] * (MAX_PUT_ROWS + 1))
    with pytest.raises(flight.FlightServerError, match=f"at most {MAX_PUT_ROWS} rows"):
        put(url, WriteRequest(unique("query"), 0, 0), big)
    with pytest.raises(flight.FlightUnauthorizedError, match="secret/x"):
        put(url, WriteRequest(unique("query"), 0, 0), rows("secret/x", ["x"]))
    connection = flight.connect(url)
    try:
        descriptor = flight.FlightDescriptor.for_command(b'{"writer": "a b"}')
        writer, _answers = connection.do_put(descriptor, WRITE_SCHEMA)
        with pytest.raises(flight.FlightServerError, match="writer id"):
            writer.close()
        with pytest.raises(flight.FlightServerError, match="unknown action"):
            list(connection.do_action(flight.Action("commit_write", b"{}")))
    finally:
        connection.close()
    assert journal(url, topic) == []
    # The service still takes writes.
    assert not put(url, WriteRequest(unique("query"), 0, 0), rows(topic, ["ok"])).already_committed


def test_fences_survive_a_broker_kill9(
    broker: Callable[..., BrokerProcess], paho: Callable[..., PahoClient]
) -> None:
    process = broker(flight=True, journal={"retention_seconds": 3600})
    topic = unique("crash")
    request = WriteRequest(unique("query"), 2, 1)
    assert not put(process.flight_url, request, rows(topic, ["a", "b"])).already_committed
    process.kill()
    process.restart()
    subscriber = paho(process.address)
    subscriber.subscribe(topic, 1)
    assert put(process.flight_url, request, rows(topic, ["a", "b"])).already_committed
    subscriber.no_message(within=0.3)
    assert journal(process.flight_url, topic) == [(topic, b"a"), (topic, b"b")]


def test_a_put_is_checked_against_its_users_acls(
    broker: Callable[..., BrokerProcess], tmp_path: Any
) -> None:
    """Basic credentials name the user whose ACL rules decide where its rows may go."""
    from .test_users import kittiwake_passwd

    users = tmp_path / "users"
    kittiwake_passwd(users, "alice", "wonderland")
    process = broker(
        flight=True,
        journal={"retention_seconds": 3600},
        auth={"password_file": str(users), "acl": [{"users": ["alice"], "publish": ["alice/#"]}]},
    )
    options = {"url": process.flight_url, "username": "alice", "password": "wonderland"}
    client = SinkClient(SinkOptions.parse(options))
    assert not client.put(WriteRequest("q", 0, 0), [rows("alice/t", ["ok"])]).already_committed
    with pytest.raises(flight.FlightUnauthorizedError, match="'bob/t' is not authorised"):
        client.put(WriteRequest("q", 0, 1), [rows("bob/t", ["no"])])
    wrong = SinkClient(SinkOptions.parse({**options, "password": "nope"}))
    with pytest.raises(flight.FlightUnauthenticatedError):
        wrong.put(WriteRequest("q", 0, 2), [rows("alice/t", ["no"])])


def test_a_put_past_the_concurrent_puts_limit_is_answered_busy_and_retried(
    broker: Callable[..., BrokerProcess],
) -> None:
    process = broker(
        flight=True, journal={"retention_seconds": 3600}, limits={"max_concurrent_puts": 1}
    )
    url = process.flight_url
    topic = unique("busy")
    done = WriteRequest(unique("query"), 0, 0)
    assert not put(url, done, rows(topic, ["first"])).already_committed
    once = SinkClient(SinkOptions.parse({"url": url, "retryTimeoutMs": "1"}))

    def refused_busy() -> bool:
        try:
            once.put(done, [rows(topic, ["first"])])  # a committed unit: harmless when taken
        except flight.FlightUnavailableError as exc:
            assert "max_concurrent_puts" in str(exc)
            return True
        return False

    connection = flight.connect(url)
    try:
        held = WriteRequest(unique("query"), 0, 0)
        descriptor = flight.FlightDescriptor.for_command(held.to_descriptor())
        writer, answers = connection.do_put(descriptor, WRITE_SCHEMA)
        writer.write_batch(rows(topic, ["held open"]))
        wait_until(refused_busy, timeout=10)  # the open put holds the only slot
        writer.done_writing()
        assert WriteAnswer.from_bytes(answers.read().to_pybytes()) == WriteAnswer(1, False)
        writer.close()
    finally:
        connection.close()
    # The slot is free again; a sender that retries gets through.
    after = put(url, WriteRequest(unique("query"), 0, 0), rows(topic, ["after"]))
    assert not after.already_committed
    assert journal(url, topic) == [(topic, b"first"), (topic, b"held open"), (topic, b"after")]
