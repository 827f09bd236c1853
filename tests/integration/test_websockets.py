"""MQTT over WebSockets (MQTT 5 §6): ws:// and wss:// on path /mqtt with subprotocol mqtt,
tested with paho-mqtt's websocket transport and with the websockets library as a raw client
(for what real clients do not do: packets split over frames, several in one frame, text
frames, wrong paths)."""

from __future__ import annotations

import socket

import pytest
from paho.mqtt.client import WebsocketConnectionError
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

from kittiwake.mqtt.codec import PacketDecoder, encode
from kittiwake.mqtt.packets import (
    ConnAck,
    Connect,
    Disconnect,
    SubAck,
    Subscribe,
    SubscriptionRequest,
)

from .certificates import PKI, make_pki
from .clients import MQTTv5, PahoClient, unique


@pytest.fixture(scope="module")
def module_broker_config() -> dict[str, object]:
    return {"listener": {"protocol": "websockets"}}


@pytest.fixture(scope="module")
def module_broker(tmp_path_factory: pytest.TempPathFactory, module_broker_config):
    from .brokerproc import BrokerProcess

    process = BrokerProcess(tmp_path_factory.mktemp("ws"), **module_broker_config)
    process.start()
    yield process
    process.stop()


def ws_paho(address: tuple[str, int], protocol: int = 4) -> PahoClient:
    return PahoClient(address, unique("ws-paho"), protocol=protocol, transport="websockets")


def url(address: tuple[str, int], path: str = "/mqtt", scheme: str = "ws") -> str:
    return f"{scheme}://{address[0]}:{address[1]}{path}"


def mqtt_packets(ws, version: int, count: int) -> list[object]:
    decoder = PacketDecoder()
    decoder.protocol_version = version
    packets: list[object] = []
    while len(packets) < count:
        packets += decoder.feed(ws.recv(timeout=5))
    return packets


@pytest.mark.parametrize("protocol", [4, MQTTv5])
def test_paho_over_websockets(address, protocol):
    sub, pub = ws_paho(address, protocol), ws_paho(address, protocol)
    try:
        sub.connect()
        pub.connect()
        topic = unique("ws/topic")
        sub.subscribe(topic, 1)
        pub.publish(topic, b"through a websocket", 1)
        message = sub.get()
        assert (message.topic, message.payload) == (topic, b"through a websocket")
    finally:
        sub.stop()
        pub.stop()


def test_packets_split_over_frames_and_several_in_one_frame(address):
    """MQTT-6.0.0-2: the receiver reassembles the stream whatever the framing."""
    with ws_connect(url(address), subprotocols=["mqtt"]) as ws:
        assert ws.subprotocol == "mqtt"
        connect = encode(Connect(unique("ws-raw"), 5), 5)
        subscribe = encode(Subscribe(1, [SubscriptionRequest("ws/split", 0)]), 5)
        ws.send([connect[:5], connect[5:] + subscribe[:3]])  # one message in two frames
        ws.send(subscribe[3:] + b"\xc0\x00")  # the rest and a PINGREQ in one frame
        connack, suback, pong = mqtt_packets(ws, 5, 3)
        assert isinstance(connack, ConnAck) and connack.reason_code == 0
        assert isinstance(suback, SubAck) and suback.reason_codes == [0]
        assert type(pong).__name__ == "PingResp"


def still_serving(address: tuple[str, int]) -> None:
    client = ws_paho(address)
    try:
        client.connect()
    finally:
        client.stop()


def test_a_text_frame_closes_the_connection(address):
    """MQTT-6.0.0-1: MQTT travels in binary frames only."""
    with ws_connect(url(address), subprotocols=["mqtt"]) as ws:
        ws.send(encode(Connect(unique("ws-text"), 4), 4))
        mqtt_packets(ws, 4, 1)
        ws.send("hello")
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=5)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1003
    still_serving(address)


def test_a_malformed_packet_gets_disconnect_then_a_websocket_close(address):
    with ws_connect(url(address), subprotocols=["mqtt"]) as ws:
        ws.send(encode(Connect(unique("ws-bad"), 5), 5))
        mqtt_packets(ws, 5, 1)
        ws.send(b"\x00\x00")
        (disconnect,) = mqtt_packets(ws, 5, 1)
        assert isinstance(disconnect, Disconnect) and disconnect.reason_code == 0x81
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=5)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1000


@pytest.mark.parametrize(
    ("path", "subprotocols", "status"),
    [("/other", ["mqtt"], 404), ("/mqtt", None, 400), ("/mqtt", ["chat"], 400)],
)
def test_handshakes_that_are_refused(address, path, subprotocols, status):
    with pytest.raises(InvalidStatus) as info:
        ws_connect(url(address, path), subprotocols=subprotocols, open_timeout=5)
    assert info.value.response.status_code == status


def test_plain_mqtt_on_a_websocket_listener_is_refused(address):
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(encode(Connect(unique("tcp-on-ws")), 4))
        data = sock.recv(4096)
        assert not data.startswith(b"\x20")  # no CONNACK: an HTTP error, or nothing
    still_serving(address)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_paho_over_secure_websockets(broker, pki):
    address = broker(
        listener={
            "protocol": "websockets",
            "tls": {"certificate": str(pki.server.certificate), "key": str(pki.server.key)},
        }
    )
    client = PahoClient(tuple(address), unique("wss"), protocol=MQTTv5, transport="websockets")
    client.client.tls_set(ca_certs=str(pki.ca))
    try:
        client.connect()
        topic = unique("wss/topic")
        client.subscribe(topic, 1)
        client.publish(topic, b"secure websocket", 1)
        assert client.get().payload == b"secure websocket"
    finally:
        client.stop()


# -- allowed origins ------------------------------------------------------------------------

ALLOWED = "https://app.example.com"


def raw_handshake(address: tuple[str, int], *origins: str) -> bytes:
    """The status line of a hand-written WebSocket upgrade carrying these Origin headers."""
    lines = [
        "GET /mqtt HTTP/1.1",
        f"Host: {address[0]}:{address[1]}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
        "Sec-WebSocket-Protocol: mqtt",
        *(f"Origin: {origin}" for origin in origins),
    ]
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.partition(b"\r\n")[0]


def test_a_listener_with_allowed_origins_refuses_other_browsers_pages(broker):
    """A page from another site gets HTTP 403 (logged); the allowed origin (in any case) and
    clients that send no Origin (not browsers) get in."""
    process = broker(listener={"protocol": "websockets", "allowed_origins": [ALLOWED]})
    address = tuple(process)
    assert raw_handshake(address, "https://evil.example") == b"HTTP/1.1 403 Forbidden"
    assert raw_handshake(address, ALLOWED, "https://evil.example").startswith(b"HTTP/1.1 403")
    assert raw_handshake(address, "https://APP.example.com") == (
        b"HTTP/1.1 101 Switching Protocols"
    )
    assert raw_handshake(address).startswith(b"HTTP/1.1 101")
    log = process.log_text()
    assert "origin https://evil.example not in allowed_origins" in log

    # paho sends Origin: http://host:port unless told otherwise.
    refused = PahoClient(address, unique("ws-origin"), transport="websockets")
    try:
        with pytest.raises(WebsocketConnectionError):
            refused.client.connect(address[0], address[1])
    finally:
        refused.stop()
    allowed = PahoClient(address, unique("ws-origin"), protocol=MQTTv5, transport="websockets")
    allowed.client.ws_set_options(headers={"Origin": ALLOWED})
    try:
        allowed.connect()
        topic = unique("ws/origin")
        allowed.subscribe(topic, 1)
        allowed.publish(topic, b"from an allowed page", 1)
        assert allowed.get().payload == b"from an allowed page"
    finally:
        allowed.stop()


def test_without_allowed_origins_any_origin_connects(address):
    """The default, as Mosquitto's and EMQX's (the README says what that risks)."""
    assert raw_handshake(address, "https://anywhere.example").startswith(b"HTTP/1.1 101")
