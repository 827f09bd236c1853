"""The journal's Arrow Flight service over the network: exact ranges, topic filters, bounds,
QoS 0 opt-in, and malformed or unauthenticated requests answered with Flight errors while the
service keeps serving. Input is published by a real MQTT client (paho-mqtt) at QoS 1.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
flight = pytest.importorskip("pyarrow.flight")

from kittiwake.app import BrokerApp  # noqa: E402
from kittiwake.config import config_from_dict  # noqa: E402
from kittiwake.flight.listener import FlightUnavailable  # noqa: E402
from kittiwake.flight.protocol import (  # noqa: E402
    SCHEMA,
    SCHEMA_WITH_HEADERS,
    RangeRequest,
    lost_range,
    parse_latest_answer,
)

from .brokerproc import BrokerProcess  # noqa: E402
from .clients import MQTTv5, PahoClient, props, unique, wait_until  # noqa: E402

JOURNAL = {"retention_seconds": 3600, "qos0_topics": ["metrics/#"]}


@pytest.fixture(scope="module")
def flight_broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    process = BrokerProcess(tmp_path_factory.mktemp("flight"), flight=True, journal=JOURNAL)
    process.start()
    yield process
    process.stop()


@pytest.fixture
def client(flight_broker: BrokerProcess) -> Any:
    assert flight_broker.alive(), flight_broker.log_text()[-3000:]
    connection = flight.connect(flight_broker.flight_url)
    yield connection
    connection.close()


def latest(client: Any) -> tuple[int, int]:
    (result,) = list(client.do_action(flight.Action("latest", b"")))
    return parse_latest_answer(result.body.to_pybytes())[0]


def read(client: Any, start: int, end: int, topics: list[str], **kw: Any) -> Any:
    ticket = RangeRequest(start, end, tuple(topics), **kw).to_ticket()
    return client.do_get(flight.Ticket(ticket)).read_all()


def publish_all(
    paho: Callable[..., PahoClient], address: tuple[str, int], items: list[tuple[str, bytes]]
) -> None:
    publisher = paho(address)
    for topic, payload in items:
        publisher.publish(topic, payload, 1)  # returns once PUBACK'd: committed


def test_do_get_streams_exactly_the_range_on_the_filters(
    flight_broker: BrokerProcess, client: Any, paho: Callable[..., PahoClient]
) -> None:
    prefix = unique("range")
    items = [(f"{prefix}/{'a' if i % 3 else 'b'}/{i}", f"payload {i}".encode()) for i in range(30)]
    _earliest, before = latest(client)
    publish_all(paho, flight_broker.address, items)
    _earliest, after = latest(client)
    assert after >= before + len(items)

    table = read(client, before, after, [f"{prefix}/#"])
    assert table.schema.equals(SCHEMA)
    rows = table.to_pylist()
    assert [(r["topic"], r["payload"]) for r in rows] == items
    offsets = [r["offset"] for r in rows]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert all(before <= o < after for o in offsets)
    assert {(r["qos"], r["retain"], r["priority"]) for r in rows} == {(1, False, 4)}
    assert all(r["timestamp"] is not None and r["properties"] == [] for r in rows)

    # Two adjacent ranges are the whole range, with nothing twice: ranges are exact.
    middle = offsets[len(offsets) // 2]
    split = read(client, before, middle, [f"{prefix}/#"]).to_pylist()
    split += read(client, middle, after, [f"{prefix}/#"]).to_pylist()
    assert split == rows
    # The same range again gives the same rows.
    assert read(client, before, after, [f"{prefix}/#"]).to_pylist() == rows

    only_a = read(client, before, after, [f"{prefix}/a/+"]).to_pylist()
    assert [(r["topic"], r["payload"]) for r in only_a] == [
        item for item in items if f"{prefix}/a/" in item[0]
    ]
    assert read(client, before, after, [f"{prefix}/c/#", "elsewhere"]).num_rows == 0


def test_latest_reports_the_high_water_mark_and_earliest(
    flight_broker: BrokerProcess, client: Any, paho: Callable[..., PahoClient]
) -> None:
    earliest, high_water = latest(client)
    assert 1 <= earliest <= high_water
    publish_all(paho, flight_broker.address, [(unique("latest"), b"x")])
    assert latest(client)[1] > high_water
    actions = {a.type for a in client.list_actions()}
    assert {"latest", "offset_for_timestamp"} <= actions
    (answer,) = list(
        client.do_action(flight.Action("offset_for_timestamp", b'{"timestamp_ms": 0}'))
    )
    assert json.loads(answer.body.to_pybytes()) == {"0": earliest}


def test_properties_and_headers_travel_with_the_rows(
    flight_broker: BrokerProcess, client: Any, paho: Callable[..., PahoClient]
) -> None:
    topic = unique("props")
    _e, before = latest(client)
    publisher = paho(flight_broker.address, protocol=MQTTv5)
    properties = props(3, UserProperty=[("site", "north"), ("site", "south")])
    properties.ContentType = "text/plain"
    publisher.publish(topic, b"hello", 1, properties=properties)
    _e, after = latest(client)
    (row,) = read(client, before, after, [topic], include_headers=True).to_pylist()
    assert row["properties"] == [("site", "south")]
    assert row["headers"] == [
        {"key": "site", "value": b"north"},
        {"key": "site", "value": b"south"},
        {"key": "content_type", "value": b"text/plain"},
    ]
    table = read(client, before, after, [topic], include_headers=True)
    assert table.schema.equals(SCHEMA_WITH_HEADERS)


def test_qos0_is_journalled_only_on_opted_in_topics(
    flight_broker: BrokerProcess, client: Any, paho: Callable[..., PahoClient]
) -> None:
    suffix = unique("q0")
    _e, before = latest(client)
    publisher = paho(flight_broker.address)
    publisher.publish(f"chat/{suffix}", b"not kept", 0)
    publisher.publish(f"metrics/{suffix}", b"kept", 0)
    # QoS 0 has no acknowledgement: wait for the journal to show it.
    wait_until(lambda: latest(client)[1] > before, timeout=10)
    rows = read(client, before, latest(client)[1], ["#"]).to_pylist()
    assert [(r["topic"], r["payload"], r["qos"]) for r in rows] == [
        (f"metrics/{suffix}", b"kept", 0)
    ]


@pytest.mark.parametrize(
    ("ticket", "message"),
    [
        (b"\xff\xfe not json", "not a JSON document"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"start": 5, "end": 2, "topics": ["#"]}', "ends before it starts"),
        (b'{"start": -1, "end": 2, "topics": ["#"]}', "start must be an offset"),
        (b'{"start": 0, "end": 1, "topics": []}', "non-empty list"),
        (b'{"start": 0, "end": 1, "topics": ["a/#/b"]}', "'#' before its last level"),
        (b'{"start": 0, "end": 1, "topics": ["#"], "partition": 7}', "partition 7"),
        (b'{"start": 0, "end": 1, "topics": ["#"], "extra": 1}', "unknown fields"),
        (b'{"start": 0, "end": 99999999999, "topics": ["#"]}', "high-water mark"),
    ],
)
def test_a_malformed_ticket_gets_a_flight_error(client: Any, ticket: bytes, message: str) -> None:
    with pytest.raises(flight.FlightServerError, match=message):
        client.do_get(flight.Ticket(ticket)).read_all()
    # The service is still there for the next caller.
    assert latest(client)[1] >= 1


@pytest.mark.parametrize(
    ("action", "body", "message"),
    [
        ("nonsense", b"", "unknown action"),
        ("offset_for_timestamp", b"{}", "timestamp_ms"),
        ("offset_for_timestamp", b"nope", "not a JSON document"),
    ],
)
def test_a_malformed_action_gets_a_flight_error(
    client: Any, action: str, body: bytes, message: str
) -> None:
    with pytest.raises(flight.FlightServerError, match=message):
        list(client.do_action(flight.Action(action, body)))
    assert latest(client)[1] >= 1


@pytest.mark.parametrize(
    "header",
    [
        b"Bearer some-token",
        b"Basic " + base64.b64encode(b"user:secret"),
        b"Basic %%%",
        b"Digest whatever",
    ],
)
def test_credentials_are_refused_while_no_users_exist(
    flight_broker: BrokerProcess, header: bytes
) -> None:
    """Anonymous access is allowed now; credentials cannot be checked, so they are refused
    rather than silently ignored (the hook the users' issue fills in)."""
    connection = flight.connect(flight_broker.flight_url)
    try:
        options = flight.FlightCallOptions(headers=[(b"authorization", header)])
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(connection.do_action(flight.Action("latest", b""), options))
    finally:
        connection.close()


def test_a_dropped_range_is_named_in_the_metadata(
    broker: Callable[..., BrokerProcess], paho: Callable[..., PahoClient]
) -> None:
    """A range the byte retention dropped is served from what is kept, with the lost part
    in the schema metadata (the Spark source fails or warns on it)."""
    process = broker(flight=True, journal={"retention_bytes": 2000})
    connection = flight.connect(process.flight_url)
    try:
        _e, start = latest(connection)
        publisher = paho(process.address)
        # The sweep runs at most once a second: keep publishing until it has dropped `start`.
        count = 0

        def dropped() -> bool:
            nonlocal count
            count += 1
            publisher.publish(unique("fill"), b"x" * 500, 1)
            return latest(connection)[0] > start

        wait_until(dropped, timeout=20, interval=0.05)
        earliest, high_water = latest(connection)
        reader = connection.do_get(
            flight.Ticket(RangeRequest(start, high_water, ("#",)).to_ticket())
        )
        assert lost_range(reader.schema.metadata) == (start, earliest)
        rows = reader.read_all().to_pylist()
        assert rows and min(r["offset"] for r in rows) >= earliest
    finally:
        connection.close()


def _latest_at(url: str) -> tuple[int, int]:
    connection = flight.connect(url)
    try:
        return latest(connection)
    finally:
        connection.close()


def test_the_app_starts_and_stops_the_flight_listener_with_the_broker(tmp_path: Any) -> None:
    config = config_from_dict(
        {
            "listeners": [{"protocol": "flight", "port": 0}, {"port": 0}],
            "store": {"data_dir": str(tmp_path)},
            "journal": {"retention_seconds": 60},
            "sys": {"interval": 0},
        }
    )

    async def body() -> None:
        app = BrokerApp(config)
        await app.start()
        host, port = app.addresses[0]
        url = f"grpc://{host}:{port}"
        assert host == "127.0.0.1" and port != 0
        assert await asyncio.to_thread(_latest_at, url) == (1, 1)
        await app.stop()
        with pytest.raises(flight.FlightUnavailableError):
            await asyncio.to_thread(_latest_at, url)

    asyncio.run(body())


def test_a_flight_listener_without_pyarrow_is_refused_with_what_to_install(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kittiwake.flight.listener as listener_module

    real_find_spec = listener_module.importlib.util.find_spec
    monkeypatch.setattr(
        listener_module.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pyarrow" else real_find_spec(name, *a),
    )
    config = config_from_dict(
        {"listeners": [{"protocol": "flight"}], "store": {"data_dir": str(tmp_path)}}
    )
    with pytest.raises(FlightUnavailable, match=r"pip install 'kittiwake\[flight\]'"):
        BrokerApp(config)


def test_a_flight_listener_needs_the_disk_store(tmp_path: Any) -> None:
    config = config_from_dict(
        {"listeners": [{"protocol": "flight"}], "store": {"backend": "memory"}}
    )
    with pytest.raises(FlightUnavailable, match="sqlite"):
        BrokerApp(config)


def test_a_read_resumes_after_a_broker_kill9_with_every_offset_once(
    broker: Callable[..., BrokerProcess], tmp_path: Any
) -> None:
    """The data source's client reads a range larger than gRPC buffers; the broker is killed
    (-9) after the first batch and restarted on the same address: the read resumes after the
    last offset received, and yields every offset of the range exactly once."""
    from kittiwake.broker.message import Message
    from kittiwake.spark.client import JournalClient
    from kittiwake.spark.options import SourceOptions
    from kittiwake.store.sqlite import SQLiteStore

    count = 200_000
    process = BrokerProcess(tmp_path / "resume", flight=True, journal=JOURNAL)

    async def fill() -> None:  # the broker's own store code writes the journal it will serve
        store = SQLiteStore(
            process.workdir / "data", journal_retention_seconds=3600, synchronous="NORMAL"
        )
        for first in range(0, count, 5000):
            for i in range(first, first + 5000):
                store.journal(Message(f"bulk/{i % 7}", b"p" * 100, qos=1, persistent=True))
            commit = store.commit()
            if commit is not None:
                await commit
        store.close()

    asyncio.run(fill())
    process.start()
    try:
        client = JournalClient(
            SourceOptions.parse({"url": process.flight_url, "retryTimeoutMs": "30000"})
        )
        earliest, high_water = client.bounds()
        assert high_water - earliest == count
        batches = client.read(earliest, high_water)
        offsets = next(batches).column("offset").to_pylist()
        process.kill()
        process.restart()
        for batch in batches:
            offsets += batch.column("offset").to_pylist()
    finally:
        process.stop()
    assert offsets == list(range(earliest, high_water))
