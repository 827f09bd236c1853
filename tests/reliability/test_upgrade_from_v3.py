"""An upgrade keeps working data: a database written by the previous Kittiwake (store schema 3,
commit f4e127c) is migrated in place, keeps every session, subscription, will, queued message
(with its delivery state), retained message and QoS 2 state, and the upgraded broker serves
them over MQTT.

The database and ``expected.json`` (that broker's own reading of it) come from
tests/fixtures/store_v3/make_database.py, run against f4e127c; see its docstring.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kittiwake.broker.message import Message
from kittiwake.broker.sessions import session_producer_name, session_queue_name
from kittiwake.clock import ManualClock
from kittiwake.mqtt.packets import PubAck, PubComp, Publish, PubRec, PubRel
from kittiwake.mqtt.properties import Properties
from kittiwake.mqtt.reason_codes import ReasonCode
from kittiwake.store.sqlite import DATABASE_FILE, SCHEMA_VERSION, SQLiteStore
from tests.integration.brokerproc import BrokerProcess
from tests.integration.rawclient import RawClient

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "store_v3"
EXPECTED: dict[str, Any] = json.loads((FIXTURE / "expected.json").read_text())
# The fixture's limits: subscriber windows of 2, so some messages were left waiting.
LIMITS = {"max_inflight": 2}


def upgraded_copy(directory: Path) -> Path:
    directory.mkdir(parents=True)
    shutil.copyfile(FIXTURE / DATABASE_FILE, directory / DATABASE_FILE)
    return directory


def schema_version(directory: Path) -> int:
    connection = sqlite3.connect(directory / DATABASE_FILE)
    try:
        return int(
            connection.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
        )
    finally:
        connection.close()


def same_message(got: Message, want: dict[str, Any], *, published: bool = True) -> None:
    """``got`` (the upgraded store's) carries everything ``want`` (the v3 store's) did. Times
    are compared on the wall clock (the test's manual clock reads wall seconds)."""
    where = want["topic"]
    assert (got.topic, got.payload) == (want["topic"], base64.b64decode(want["payload"])), where
    assert (got.qos, got.retain, got.persistent, got.priority) == (
        want["qos"], want["retain"], want["persistent"], want["priority"],
    ), where
    for name in ("expiry", "delivery_time"):
        value = getattr(got, name)
        assert (value is None) == (want[name] is None), (where, name)
        if value is not None:
            assert value == pytest.approx(want[name], abs=0.001), (where, name)
    if published:
        assert got.timestamp == round(want["created"] * 1000), where
    assert got.origin == want["origin"], where
    fields = got.mqtt5
    if fields is None:
        assert not want["user_properties"] and want["content_type"] is None, where
        assert want["response_topic"] is None and want["correlation_data"] is None, where
        assert want["payload_format_indicator"] is None, where
    else:
        assert [list(pair) for pair in fields.user_properties] == want["user_properties"], where
        assert fields.content_type == want["content_type"], where
        assert fields.response_topic == want["response_topic"], where
        correlation = want["correlation_data"]
        assert fields.correlation_data == (
            None if correlation is None else base64.b64decode(correlation)
        ), where
        assert fields.payload_format_indicator == want["payload_format_indicator"], where
    assert got.properties is None, where  # MQTT has no typed application properties


def test_the_upgraded_store_holds_everything_the_v3_store_held(tmp_path: Path) -> None:
    data = upgraded_copy(tmp_path / "data")
    # Clock time 0 is the epoch on this clock: the store's clock times read as wall seconds.
    store = SQLiteStore(data, clock=ManualClock(0.0, wall_start_ms=0))
    try:
        state = store.recover()
    finally:
        store.close()
    assert schema_version(data) == SCHEMA_VERSION

    assert set(state.sessions) == set(EXPECTED["sessions"])
    for client_id, want in EXPECTED["sessions"].items():
        got = state.sessions[client_id]
        assert (got.expiry_interval, got.will_delay, got.will_expiry) == (
            want["expiry_interval"], want["will_delay"], want["will_expiry"],
        ), client_id
        assert [
            [s.topic_filter, s.max_qos, s.no_local, s.retain_as_published, s.retain_handling,
             s.subscription_id]
            for s in got.subscriptions
        ] == want["subscriptions"], client_id
        assert (got.will is None) == (want["will"] is None), client_id
        if got.will is not None:
            same_message(got.will, want["will"], published=False)
            assert got.will.timestamp == 0  # a will has no time until it is published

    want_queued = sorted(
        (
            session_queue_name(q["client_id"]), q["message_id"], q["qos"], q["retain"],
            tuple(q["subscription_ids"]), q["delivery_count"], q["delivery_id"], q["state"],
        )
        for q in EXPECTED["queued"]
    )
    got_queued = sorted(
        (q.queue, q.message_id, q.qos, q.retain, q.subscription_ids, q.delivery_count,
         q.delivery_id, q.state)
        for q in state.queued
    )
    assert got_queued == want_queued
    # The fixture has what it claims: both delivery states in flight, waiting entries, inline
    # rows (from the run without retention) and journal references.
    assert {q.state for q in state.queued} == {"queued", "sent", "received"}

    assert set(state.messages) == {int(k) for k in EXPECTED["messages"]}
    for message_id, want in EXPECTED["messages"].items():
        got_message = state.messages[int(message_id)]
        assert got_message.message_id == int(message_id)
        same_message(got_message, want)

    assert set(state.retained) == set(EXPECTED["retained"])
    retained_ids = [m.message_id for m in state.retained.values()]
    for topic, want in EXPECTED["retained"].items():
        same_message(state.retained[topic], want)
    # v3 dropped a retained message's id; the upgrade gives each a fresh one nobody uses.
    highest_before = max(EXPECTED["journal_ids"] + [int(k) for k in EXPECTED["messages"]])
    assert len(set(retained_ids)) == len(retained_ids)
    assert min(retained_ids) > highest_before

    assert state.duplicates == {
        session_producer_name(client_id): set(ids)
        for client_id, ids in EXPECTED["incoming_qos2"].items()
    }
    assert state.duplicates[session_producer_name("pub-v5")] == {41, 42}

    connection = sqlite3.connect(data / DATABASE_FILE)
    try:
        journal = [r[0] for r in connection.execute("SELECT message_id FROM journal ORDER BY 1")]
        inline = connection.execute(
            "SELECT COUNT(*) FROM queue_entries WHERE topic IS NOT NULL"
        ).fetchone()[0]
        leftovers = connection.execute(
            "SELECT name FROM sqlite_master WHERE name LIKE 'v3_%'"
        ).fetchall()
    finally:
        connection.close()
    assert journal == EXPECTED["journal_ids"]
    assert inline == 2
    assert leftovers == []


def test_new_ids_after_the_upgrade_are_above_every_old_one(tmp_path: Path) -> None:
    data = upgraded_copy(tmp_path / "data")

    async def publish_one() -> int:
        store = SQLiteStore(data, clock=ManualClock())
        store.recover()
        message = Message("after/upgrade", b"new", qos=1, persistent=True)
        store.journal(message)
        store.close()
        return message.message_id

    new_id = asyncio.run(publish_one())
    store = SQLiteStore(data, clock=ManualClock())
    try:
        retained_ids = [m.message_id for m in store.recover().retained.values()]
    finally:
        store.close()
    assert new_id > max(retained_ids + EXPECTED["journal_ids"])


# -- the upgraded broker over MQTT -------------------------------------------------------------


@pytest.fixture
def upgraded_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    data = upgraded_copy(tmp_path / "data")
    broker = BrokerProcess(tmp_path / "broker", store={"data_dir": str(data)}, limits=LIMITS)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def queued_payloads(client_id: str) -> set[bytes]:
    """The payloads the v3 store held for a client's queue (in flight or waiting)."""
    return {
        base64.b64decode(EXPECTED["messages"][str(q["message_id"])]["payload"])
        for q in EXPECTED["queued"]
        if q["client_id"] == client_id
    }


def receive_all(client: RawClient, count: int, timeout: float = 10.0) -> list[Publish]:
    """``count`` PUBLISH packets, each acknowledged as it arrives (QoS 1 PUBACK, QoS 2
    PUBREC then PUBCOMP after the PUBREL), so a window of 2 keeps moving."""
    deadline = time.monotonic() + timeout
    got: list[Publish] = []
    while len(got) < count:
        packet = client.recv(max(deadline - time.monotonic(), 0.001))
        if isinstance(packet, Publish):
            got.append(packet)
            if packet.qos == 1:
                client.send(PubAck(packet.packet_id or 0))
            elif packet.qos == 2:
                client.send(PubRec(packet.packet_id or 0))
        elif isinstance(packet, PubRel):
            client.send(PubComp(packet.packet_id))
    return got


def test_the_upgraded_broker_serves_the_stored_sessions(upgraded_broker: BrokerProcess) -> None:
    address = upgraded_broker.address

    # watcher first: its inline rows from the run without retention, and the will of sub-v4
    # (no delay: due at the first tick after the upgraded broker recovered sub-v4's session
    # without a client; sub-v4 reconnecting first would rightly cancel it).
    watcher = RawClient(address, 4)
    assert watcher.connect("watcher", clean_start=False).session_present
    got = receive_all(watcher, len(queued_payloads("watcher")) + 1)
    assert {p.payload for p in got} == queued_payloads("watcher") | {b"sub-v4 is gone"}


    # sub-v5: its PUBREC'd QoS 2 delivery comes back as a PUBREL, its unacknowledged QoS 1 as
    # a resend (DUP), then the waiting messages with their subscription id and properties.
    sub_v5 = RawClient(address, 5)
    connack = sub_v5.connect(
        "sub-v5", clean_start=False,
        properties=Properties(session_expiry_interval=3600, receive_maximum=2),
    )
    assert connack.session_present
    in_flight = {q["state"]: q for q in EXPECTED["queued"] if q["client_id"] == "sub-v5"}
    release = sub_v5.wait_for(PubRel, timeout=10)
    assert release.packet_id == in_flight["received"]["delivery_id"]
    resend = sub_v5.wait_for(Publish, timeout=10)
    assert (resend.packet_id, resend.dup, resend.qos) == (
        in_flight["sent"]["delivery_id"], True, 1,
    )
    assert resend.properties.subscription_identifiers == [7]
    sub_v5.send(PubComp(release.packet_id))
    sub_v5.send(PubAck(resend.packet_id or 0))
    waiting = receive_all(sub_v5, len(queued_payloads("sub-v5")) - 2)
    released = EXPECTED["messages"][str(in_flight["received"]["message_id"])]["payload"]
    assert {p.payload for p in waiting} | {resend.payload, base64.b64decode(released)} == (
        queued_payloads("sub-v5")
    )
    [with_properties] = [p for p in waiting if p.topic == "fixture/queue/d"]
    props = with_properties.properties
    assert props.content_type == "application/json"
    assert props.response_topic == "fixture/replies"
    assert props.correlation_data == b"\x00corr\xff"
    assert props.payload_format_indicator == 1
    assert props.user_properties == [("k", "v1"), ("k", "v2"), ("other", "x")]
    assert props.message_expiry_interval is not None
    assert props.message_expiry_interval > 9 * 365 * 24 * 3600
    assert props.subscription_identifiers == [7]

    # sub-v4: both in-flight QoS 1 deliveries come back as resends, then the rest.
    sub_v4 = RawClient(address, 4)
    assert sub_v4.connect("sub-v4", clean_start=False).session_present
    delivered = receive_all(sub_v4, len(queued_payloads("sub-v4")))
    assert {p.payload for p in delivered} == queued_payloads("sub-v4")
    assert sorted(p.packet_id for p in delivered if p.dup) == sorted(
        q["delivery_id"]
        for q in EXPECTED["queued"]
        if q["client_id"] == "sub-v4" and q["state"] == "sent"
    )

    # pub-v5: its unreleased QoS 2 ids survived. A resend of 41 is acknowledged and not
    # routed again (the marker after it is the next thing sub-v4 gets); both ids release.
    pub = RawClient(address, 5)
    assert pub.connect(
        "pub-v5", clean_start=False, properties=Properties(session_expiry_interval=3600)
    ).session_present
    pub.send(Publish("fixture/queue/e", b"qos2 id 41", 2, False, True, 41))
    assert pub.wait_for(PubRec, packet_id=41).reason_code == ReasonCode.SUCCESS
    pub.publish("fixture/queue/marker", b"marker", 1)
    [next_for_v4] = receive_all(sub_v4, 1)
    assert next_for_v4.payload == b"marker", "the QoS 2 resend was routed a second time"
    for packet_id in (41, 42):
        pub.send(PubRel(packet_id))
        assert pub.wait_for(PubComp, packet_id=packet_id).reason_code == ReasonCode.SUCCESS
    receive_all(sub_v5, 1)  # the marker

    # noLocal, retain-as-published and the subscription id of sub-v5's third subscription.
    sub_v5.publish("fixture/nolocal", b"own", 1)
    pub.publish("fixture/nolocal", b"other", 1, retain=True)
    [from_other] = receive_all(sub_v5, 1)
    assert (from_other.payload, from_other.retain) == (b"other", True)
    assert from_other.properties.subscription_identifiers == [9]

    # The shared subscription: each message reaches exactly one of the two members.
    for n in range(4):
        pub.publish(f"fixture/shared/after-{n}", b"shared %d" % n, 1)
    shared: list[bytes] = []
    deadline = time.monotonic() + 10
    while len(shared) < 4 and time.monotonic() < deadline:
        for member in (sub_v4, sub_v5):
            with contextlib.suppress(TimeoutError):
                shared += [p.payload for p in receive_all(member, 1, timeout=0.2)]
    assert sorted(shared) == [b"shared %d" % n for n in range(4)]

    # A new subscriber gets the retained messages, properties and all.
    fresh = RawClient(address, 5)
    fresh.connect("fresh")
    fresh.subscribe("fixture/retained/#", 2)
    retained = {p.topic: p for p in receive_all(fresh, len(EXPECTED["retained"]))}
    assert set(retained) == set(EXPECTED["retained"])
    assert all(p.retain for p in retained.values())
    with_props = retained["fixture/retained/props"].properties
    assert (with_props.content_type, with_props.user_properties) == (
        "text/plain", [("retained", "yes")],
    )
    for client in (sub_v5, sub_v4, pub, watcher, fresh):
        client.disconnect()
