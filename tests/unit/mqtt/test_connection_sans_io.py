"""The MQTT connection is a state machine driven by bytes alone: no event loop runs here.

What needs the loop is handed in by the asyncio shell (mqtt/server.py): the login's password
check, which the shell runs on a worker thread, and ``call_soon``. Here the test plays the
shell: it answers the password check itself and runs the deferred callbacks when it chooses.
"""

from __future__ import annotations

import asyncio

import pytest
from connection_harness import LaterTurns, PendingCheck, Wire

from kittiwake.broker.authentication import (
    Authentication,
    Credentials,
    PasswordHash,
    Principal,
    Refusal,
)
from kittiwake.broker.broker import Broker
from kittiwake.clock import ManualClock
from kittiwake.mqtt.codec import encode
from kittiwake.mqtt.login import Login
from kittiwake.mqtt.packets import (
    ConnAck,
    Connect,
    PingReq,
    PingResp,
    PubAck,
    PubAckRun,
    Publish,
    SubAck,
    Subscribe,
    SubscriptionRequest,
)
from kittiwake.mqtt.properties import Properties
from kittiwake.mqtt.reason_codes import ReasonCode

# Cheap hashes for tests (the parameters travel with each hash; production uses 2**14).
FAST = 4


def no_loop() -> None:
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()


def users(**passwords: str) -> Authentication:
    return Authentication(
        {name: PasswordHash.make(pw, log2_n=FAST) for name, pw in passwords.items()}
    )


def test_a_round_trip_needs_no_event_loop() -> None:
    no_loop()
    broker = Broker(clock=ManualClock())
    sub, pub = Wire(broker, 5), Wire(broker, 4)
    assert sub.connect("sub").reason_code == 0
    sub.send(Subscribe(1, [SubscriptionRequest("t", 1)]))
    assert [type(p) for p in sub.received()] == [SubAck]
    assert pub.connect("pub").reason_code == 0
    pub.send(Publish("t", b"hello", 1, packet_id=7))
    assert [(type(p), p.packet_id) for p in pub.received()] == [(PubAck, 7)]  # type: ignore[attr-defined]
    got = sub.received()
    assert [(type(p), p.payload) for p in got] == [(Publish, b"hello")]  # type: ignore[attr-defined]


def test_a_connect_and_what_follows_it_wait_for_a_pending_password_check() -> None:
    no_loop()
    broker = Broker(clock=ManualClock())
    authentication = users(alice="pw")
    checks: list[tuple[Credentials, PendingCheck]] = []

    def verify(credentials: Credentials) -> PendingCheck:
        check = PendingCheck()
        checks.append((credentials, check))
        return check

    wire = Wire(broker, 5, login=Login(authentication, address="10.0.0.1", verify=verify))
    wire.send(Connect("c", protocol_version=5, username="alice", password=b"pw"))
    wire.send(Subscribe(1, [SubscriptionRequest("t", 0)]))
    wire.send(PingReq())
    assert wire.received() == [], "answered before the password was checked"
    [(credentials, check)] = checks
    assert (credentials.username, credentials.password, credentials.address) == (
        "alice",
        "pw",
        "10.0.0.1",
    )
    check.answer(authentication.verify(credentials))
    got = wire.received()
    assert [type(p) for p in got] == [ConnAck, SubAck, PingResp]
    assert got[0].reason_code == 0  # type: ignore[attr-defined]
    assert wire.connection.principal == Principal("alice", True, "password")


@pytest.mark.parametrize("outcome", ["refused", "failed"])
def test_a_pending_check_that_refuses_or_fails_refuses_the_connect(outcome: str) -> None:
    broker = Broker(clock=ManualClock())
    check = PendingCheck()
    login = Login(users(alice="pw"), verify=lambda _credentials: check)
    wire = Wire(broker, 5, login=login)
    wire.send(Connect("c", protocol_version=5, username="alice", password=b"wrong"))
    wire.send(Subscribe(1, [SubscriptionRequest("t", 0)]))
    assert wire.received() == []
    if outcome == "refused":
        check.answer(Refusal.BAD_CREDENTIALS)
    else:
        check.fail(RuntimeError("worker thread died"))
    got = wire.received()
    assert [(type(p), p.reason_code) for p in got] == [  # type: ignore[attr-defined]
        (ConnAck, ReasonCode.BAD_USER_NAME_OR_PASSWORD)
    ]
    assert wire.connection.closed and wire.transport.closed


@pytest.mark.parametrize(("password", "code"), [(b"pw", 0), (b"wrong", 0x86)])
def test_without_a_shell_the_password_is_verified_inline(password: bytes, code: int) -> None:
    no_loop()
    broker = Broker(clock=ManualClock())
    wire = Wire(broker, 5, login=Login(users(alice="pw")))
    assert wire.connect("c", username="alice", password=password).reason_code == code


def test_a_dropped_delivery_gives_back_its_credit_on_a_later_turn() -> None:
    """A QoS 1 message above the client's Maximum Packet Size is dropped and its delivery
    completed through ``call_soon`` (not inline, so a run of them cannot recurse); until that
    turn runs it holds the client's only Receive Maximum slot."""
    no_loop()
    broker = Broker(clock=ManualClock())
    later = LaterTurns()
    sub = Wire(broker, 5, call_soon=later)
    sub.connect("sub", properties=Properties(receive_maximum=1, maximum_packet_size=2048))
    sub.send(Subscribe(1, [SubscriptionRequest("t", 1)]))
    sub.received()
    pub = Wire(broker, 5)
    pub.connect("pub")
    pub.send(Publish("t", b"x" * 4096, 1, packet_id=1))
    pub.send(Publish("t", b"small", 1, packet_id=2))
    assert sub.received() == []
    assert later.run() == 1
    got = sub.received()
    assert [(type(p), p.payload) for p in got] == [(Publish, b"small")]  # type: ignore[attr-defined]
    assert later.waiting == []


def test_a_3x_subscriber_gets_the_right_frame_as_size_level_and_retain_change_on_one_topic() -> (
    None
):
    """A QoS 1/2 PUBLISH head is reused per topic only while payload size, level and retain
    flag match the message it was made for."""
    no_loop()
    broker = Broker(clock=ManualClock())
    sub, pub = Wire(broker, 4), Wire(broker, 4)
    sub.connect("sub")
    sub.send(Subscribe(1, [SubscriptionRequest("t", 2)]))
    sub.received()
    pub.connect("pub")
    sent = [
        (b"aa", 1, False),
        (b"bb", 1, False),
        (b"ccc", 1, False),
        (b"dd", 2, False),
        (b"ee", 1, True),
        (b"f" * 200, 1, False),
        (b"gg", 1, False),
    ]
    for packet_id, (payload, qos, retain) in enumerate(sent, start=1):
        pub.send(Publish("t", payload, qos, retain, packet_id=packet_id))
    got = [p for p in sub.received() if isinstance(p, Publish)]
    # A live delivery carries RETAIN only for retain-as-published (3.1.1: never).
    assert [(p.payload, p.qos, p.retain) for p in got] == [(b, q, False) for b, q, _ in sent]
    assert len({p.packet_id for p in got}) == len(sent)
    # 3.1.1 sends the retained message again on every SUBSCRIBE, RETAIN set, between live ones.
    sub.send(Subscribe(2, [SubscriptionRequest("t", 2)]))
    pub.send(Publish("t", b"hh", 1, False, packet_id=9))
    again = [(p.payload, p.qos, p.retain) for p in sub.received() if isinstance(p, Publish)]
    assert again == [(b"ee", 1, True), (b"hh", 1, False)]


def test_qos0_follows_a_device_that_reconnects_while_the_fleet_keeps_its_plans() -> None:
    """Route plans survive other devices connecting; a device's own reconnection (even in
    another protocol version) moves its QoS 0 to the new connection, never the old one."""
    broker = Broker(clock=ManualClock())
    device, publisher = Wire(broker, 4), Wire(broker, 4)
    device.connect("device", clean_start=False, properties=Properties())
    publisher.connect("publisher")
    device.send(Subscribe(1, [SubscriptionRequest("s/1/in", 0)]))
    device.received()
    publisher.send(Publish("s/1/in", b"first", 0, False, False, None))
    assert [p.payload for p in device.received() if isinstance(p, Publish)] == [b"first"]
    plan = broker.routes.plan("s/1/in")
    Wire(broker, 4).connect("another")
    assert broker.routes.plan("s/1/in") is plan
    again = Wire(broker, 5)  # takes the session over, now in 5.0
    again.connect(
        "device", clean_start=False, properties=Properties(session_expiry_interval=60)
    )
    publisher.send(Publish("s/1/in", b"second", 0, False, False, None))
    assert [p.payload for p in again.received() if isinstance(p, Publish)] == [b"second"]
    assert not [p for p in device.received() if isinstance(p, Publish)]


@pytest.mark.parametrize("version", [4, 5])
def test_a_run_of_pubacks_settles_each_known_id_once(version: int) -> None:
    """The server's decoder gives a read's plain PUBACKs as one PubAckRun: acted on whole
    (one read) or handed over alone (as held input is), each known id is settled once; a
    repeated or unknown id is ignored, as a lone PUBACK's is."""
    broker = Broker(clock=ManualClock())
    sub, pub = Wire(broker, version), Wire(broker, 4)
    sub.connect("sub")
    sub.send(Subscribe(1, [SubscriptionRequest("t", 1)]))
    sub.received()
    pub.connect("pub")
    for i in range(5):
        pub.send(Publish("t", b"m%d" % i, 1, packet_id=1 + i))
    first = sub.received()
    ids = [p.packet_id for p in first]  # type: ignore[union-attr]
    assert len(ids) == 5
    session = broker.sessions["sub"]
    # Whole, in one read: the first two, one of them twice, and an id never sent.
    sub.send_bytes(b"".join(encode(PubAck(i), 4) for i in (ids[0], ids[1], ids[0], 0x7777)))
    assert sorted(d.tag for d in session.inflight.values()) == sorted(ids[2:])
    # Alone, through handle: the rest.
    sub.connection.handle(PubAckRun([ids[2], 0x7777, ids[3], ids[4], ids[4]]))
    assert not session.inflight
    assert sub.received() == []
