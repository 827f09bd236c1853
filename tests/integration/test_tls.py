"""TLS listeners (mqtts:// on 8883 by default) with a CA, server and client certificates made
at test time: paho-mqtt and mosquitto_pub/mosquitto_sub over TLS, client certificates required
or optional, a verified certificate's common name or subject as the user name, and a minimum
TLS version."""

from __future__ import annotations

import base64
import os
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from kittiwake.mqtt.codec import PacketDecoder, encode
from kittiwake.mqtt.packets import ConnAck, Connect, Disconnect, Publish, PubRec, PubRel

from .brokerproc import BrokerProcess
from .certificates import PKI, make_pki
from .clients import MOSQUITTO_PUB, MQTTv5, PahoClient, mosquitto_pub, unique
from .test_users import kittiwake_passwd


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_table(pki: PKI, **extra: object) -> dict[str, object]:
    return {"certificate": str(pki.server.certificate), "key": str(pki.server.key), **extra}


def tls_paho(
    address: tuple[str, int], pki: PKI, *, cert: bool = True, protocol: int = 4
) -> PahoClient:
    client = PahoClient(tuple(address), unique("tls-paho"), protocol=protocol)  # type: ignore[arg-type]
    client.client.tls_set(
        ca_certs=str(pki.ca),
        certfile=str(pki.alice.certificate) if cert else None,
        keyfile=str(pki.alice.key) if cert else None,
    )
    return client


def raw_tls_connect(
    address: tuple[str, int], context: ssl.SSLContext, username: str | None = None
) -> ConnAck:
    """One MQTT 5 CONNECT over a TLS socket made with ``context``; the CONNACK."""
    with (
        socket.create_connection(tuple(address), timeout=5) as plain,
        context.wrap_socket(plain, server_hostname="localhost") as sock,
    ):
        sock.sendall(encode(Connect(unique("raw-tls"), 5, username=username), 5))
        decoder = PacketDecoder()
        decoder.protocol_version = 5
        packets = []
        while not packets:
            data = sock.recv(4096)
            assert data, "closed before a CONNACK"
            packets = decoder.feed(data)
        assert isinstance(packets[0], ConnAck)
        return packets[0]


def client_context(pki: PKI, *, cert: bool = False, maximum: ssl.TLSVersion | None = None):
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert:
        context.load_cert_chain(str(pki.alice.certificate), str(pki.alice.key))
    if maximum is not None:
        context.maximum_version = maximum
    return context


def test_paho_over_tls_publishes_and_subscribes(broker, pki):
    address = broker(listener={"tls": tls_table(pki)})
    sub = tls_paho(address, pki, cert=False, protocol=MQTTv5)
    pub = tls_paho(address, pki, cert=False)
    try:
        sub.connect()
        pub.connect()
        topic = unique("tls/topic")
        sub.subscribe(topic, 1)
        pub.publish(topic, b"encrypted", 1)
        assert sub.get().payload == b"encrypted"
    finally:
        sub.stop()
        pub.stop()


def test_a_plain_client_gets_nothing_from_a_tls_listener(broker, pki):
    address = broker(listener={"tls": tls_table(pki)})
    with socket.create_connection(tuple(address), timeout=5) as sock:
        sock.sendall(encode(Connect(unique("plain")), 4))
        data = b""
        try:
            while chunk := sock.recv(4096):
                data += chunk
        except (ConnectionResetError, TimeoutError):
            pass
        assert not data.startswith(b"\x20"), "a CONNACK in clear text"


@pytest.mark.skipif(not MOSQUITTO_PUB, reason="mosquitto-clients not installed")
def test_mosquitto_clients_over_tls_with_a_client_certificate(
    broker, pki, tmp_path, mosquitto_sub
):
    """mosquitto_sub and mosquitto_pub verify the broker against the CA and log in with a
    certificate; the common name is the user, so no password is needed although users exist
    and anonymous clients are refused."""
    users = tmp_path / "users"
    kittiwake_passwd(users, "someone", "else")
    address = broker(
        auth={"password_file": str(users)},
        listener={"tls": tls_table(pki, ca=str(pki.ca), certificate_user="cn")},
    )
    topic = unique("tls/mosquitto")
    tls = ["--cafile", str(pki.ca), "--cert", str(pki.alice.certificate),
           "--key", str(pki.alice.key)]
    sub = mosquitto_sub(address.address, [topic], qos=1, extra=tls).wait_subscribed(10)
    mosquitto_pub(address.address, topic, "over tls", qos=1, extra=tls)
    assert sub.get(10).payload == "over tls"
    assert "(user 'alice' by certificate" in address.log_text()
    # Without a certificate the anonymous client is refused (users exist).
    refused = subprocess.run(
        [MOSQUITTO_PUB, "-h", "localhost", "-p", str(address.port), "-t", topic, "-m", "x",
         "--cafile", str(pki.ca)],
        timeout=20, capture_output=True, text=True, stdin=subprocess.DEVNULL,
    )
    assert refused.returncode != 0 and "not authori" in refused.stderr.lower()


def test_certificate_subject_as_the_user(broker, pki):
    address = broker(
        listener={"tls": tls_table(pki, ca=str(pki.ca), certificate_user="subject")},
        auth={"allow_anonymous": False},
    )
    client = tls_paho(address, pki, cert=True, protocol=MQTTv5)
    try:
        client.connect()
    finally:
        client.stop()
    assert "(user 'CN=alice,O=Example Devices' by certificate" in address.log_text()


def test_a_required_client_certificate_is_checked_against_the_ca(broker, pki):
    address = broker(
        listener={"tls": tls_table(pki, ca=str(pki.ca), require_client_certificate=True)}
    )
    assert raw_tls_connect(address, client_context(pki, cert=True)).reason_code == 0
    with pytest.raises((ssl.SSLError, ConnectionError, AssertionError)):
        raw_tls_connect(address, client_context(pki, cert=False))
    rogue = client_context(pki)
    rogue.load_cert_chain(str(pki.rogue.certificate), str(pki.rogue.key))
    with pytest.raises((ssl.SSLError, ConnectionError, AssertionError)):
        raw_tls_connect(address, rogue)
    assert address.alive()


def test_minimum_tls_version(broker, pki):
    address = broker(listener={"tls": tls_table(pki, min_version="1.3")})
    assert raw_tls_connect(address, client_context(pki)).reason_code == 0
    with pytest.raises((ssl.SSLError, ConnectionError)):
        raw_tls_connect(address, client_context(pki, maximum=ssl.TLSVersion.TLSv1_2))


def _tls_record_waiting(sock: ssl.SSLSocket) -> bool:
    """True when the bytes the kernel holds for ``sock``, not yet read by its TLS layer,
    start with a whole TLS record (the broker has answered). Looked at with MSG_PEEK on a
    duplicate descriptor, so the TLS layer still reads every byte."""
    with socket.socket(fileno=os.dup(sock.fileno())) as raw:
        try:
            data = raw.recv(1 << 16, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
    return len(data) >= 5 and len(data) >= 5 + int.from_bytes(data[3:5], "big")


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_client_still_sending_pubrels_reads_the_disconnect_over_tls(
    broker, pki, raw, version, loop
):
    """TLS has no half-close: after DISCONNECT 0x93 the broker keeps the connection, dropping
    what the client still sends, until the client closes. A client busy sending PUBRELs for
    earlier PUBRECs then reads the PUBRECs and the DISCONNECT instead of a reset (the same as
    over plain TCP, see test_malformed). asyncio's own TLS transport resets the connection
    when a record arrives after its close_notify; uvloop's drops it."""
    address = broker(
        limits={"receive_maximum": 2}, listener={"tls": tls_table(pki)}, uvloop=loop == "uvloop"
    )
    context = client_context(pki, maximum=version)
    context.minimum_version = version
    client = raw(address, 5, tls=context)
    client.connect(unique("tls-pubrel-sender"))
    client.send_raw(b"".join(encode(Publish("t/rm", b"x", 2, packet_id=i), 5) for i in (1, 2, 3)))
    # The broker answers the three in one write (they came in one read) and decides to close
    # in the same turn of its loop: once that record is here, the PUBRELs reach a closed
    # connection. Had it closed the socket, it would answer the first PUBREL with a reset,
    # and a later send would fail before the client has read anything.
    deadline = time.monotonic() + 5
    while not _tls_record_waiting(client.sock):
        assert time.monotonic() < deadline, "no answer from the broker within 5 s"
        time.sleep(0.005)
    for packet_id in (1, 2):
        client.send(PubRel(packet_id))
    for _ in range(20):  # a client still busy for a while, not one burst the kernel takes
        client.send(PubRel(1))
        time.sleep(0.01)
    # Then it reads, up to the DISCONNECT (after which an MQTT 5 client closes).
    packets = [client.recv()]
    while not isinstance(packets[-1], Disconnect):
        packets.append(client.recv())
    kinds = [type(p) for p in packets]
    assert packets[-1].reason_code == 0x93, packets
    assert kinds.count(PubRec) == 2, packets


def test_a_tls_client_that_never_closes_is_let_go_after_the_linger(broker, pki, raw):
    """The wait for the client's close after our close_notify is bounded by the broker's
    LINGER_TIMEOUT (as a half-closed TCP connection's is), not the event loop's 30 s TLS
    shutdown timeout: a client that never answers holds no connection slot for longer."""
    from kittiwake.mqtt.server import LINGER_TIMEOUT

    from .test_malformed import _wait_for_state

    address = broker(listener={"tls": tls_table(pki)})
    client = raw(address, 5, tls=client_context(pki))
    client.connect(unique("tls-silent"))
    client.send_raw(b"\x00\x00")  # reserved packet type 0: DISCONNECT 0x81, then the close
    # The client reads nothing and does not close; the broker's FIN must come (CLOSE_WAIT).
    _wait_for_state(client.sock, {7, 8}, timeout=LINGER_TIMEOUT + 10)


def test_mqtts_defaults_to_port_8883() -> None:
    from kittiwake.config import config_from_dict

    config = config_from_dict(
        {"listeners": [{"tls": {"certificate": "server.pem", "key": "server.key"}}]}
    )
    assert config.listeners[0].port == 8883


def test_a_broken_certificate_file_stops_the_start(tmp_path: Path, pki: PKI) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    process = BrokerProcess(tmp_path / "b", listener={"tls": {"certificate": str(bad)}})
    with pytest.raises(RuntimeError, match="cannot start"):
        process.start()


def test_flight_over_tls_with_users(tmp_path: Path, pki: PKI) -> None:
    """The Flight listener takes the same tls table, and checks the same users (HTTP Basic)."""
    import asyncio

    flight = pytest.importorskip("pyarrow.flight")
    from kittiwake.app import BrokerApp
    from kittiwake.config import config_from_dict

    users = tmp_path / "users"
    kittiwake_passwd(users, "spark", "executor")
    config = config_from_dict(
        {
            "listeners": [
                {"protocol": "flight", "port": 0, "tls": tls_table(pki)},
                {"port": 0},
            ],
            "auth": {"password_file": str(users)},
            "store": {"data_dir": str(tmp_path / "data")},
            "journal": {"retention_seconds": 60},
            "sys": {"interval": 0},
        }
    )

    def latest(url: str, headers: list[tuple[bytes, bytes]]) -> bytes:
        client = flight.connect(url, tls_root_certs=pki.ca.read_bytes())
        try:
            options = flight.FlightCallOptions(headers=headers)
            (result,) = list(client.do_action(flight.Action("latest", b""), options))
            return bytes(result.body.to_pybytes())
        finally:
            client.close()

    async def body() -> None:
        app = BrokerApp(config)
        await app.start()
        try:
            host, port = app.addresses[0]
            url = f"grpc+tls://localhost:{port}"
            basic = [(b"authorization", b"Basic " + base64.b64encode(b"spark:executor"))]
            assert await asyncio.to_thread(latest, url, basic)
            wrong = [(b"authorization", b"Basic " + base64.b64encode(b"spark:nope"))]
            with pytest.raises(flight.FlightUnauthenticatedError):
                await asyncio.to_thread(latest, url, wrong)
            with pytest.raises(flight.FlightUnauthenticatedError):  # anonymous: users exist
                await asyncio.to_thread(latest, url, [])
            with pytest.raises(flight.FlightUnavailableError):  # plain gRPC: no
                await asyncio.to_thread(
                    lambda: list(flight.connect(f"grpc://{host}:{port}").do_action(
                        flight.Action("latest", b""),
                        flight.FlightCallOptions(headers=basic, timeout=5),
                    ))
                )
        finally:
            await app.stop()

    asyncio.run(body())


# -- AMQP and HTTPS listeners with the same tls table ------------------------------------------


def amqps_connection(process: BrokerProcess, pki: PKI, *, cert: bool, **kwargs: object):
    """A python-qpid-proton blocking connection over TLS, checking the broker against the CA
    (and showing alice's certificate with ``cert``)."""
    from proton import SSLDomain
    from proton.utils import BlockingConnection

    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(pki.ca))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    if cert:
        domain.set_credentials(str(pki.alice.certificate), str(pki.alice.key), None)
    url = f"amqps://localhost:{process.amqp_port}"
    return BlockingConnection(url, timeout=10, ssl_domain=domain, **kwargs)


def test_proton_over_tls_sends_and_receives_on_an_amqp_listener(broker, pki):
    from proton import Message

    process = broker(amqp={"tls": tls_table(pki)}, store={"backend": "memory"})
    connection = amqps_connection(process, pki, cert=False)
    try:
        queue = unique("tls-amqp")
        connection.create_sender(queue).send(Message(body="encrypted"))
        receiver = connection.create_receiver(queue)
        assert receiver.receive(timeout=10).body == "encrypted"
        receiver.accept()
    finally:
        connection.close()
    assert "AMQP over TLS listening" in process.log_text()


def test_an_amqp_client_certificate_names_the_user_by_sasl_external(broker, pki, tmp_path):
    """certificate_user = "cn" on an amqp listener: a client that shows alice's certificate
    and no password logs in as alice (SASL EXTERNAL) although users exist, anonymous access
    is off, and only alice may send to her queue."""
    from proton import Message
    from proton.utils import LinkDetached

    users = tmp_path / "users"
    kittiwake_passwd(users, "someone", "else")
    queue = unique("alice-q")
    process = broker(
        amqp={"tls": tls_table(pki, ca=str(pki.ca), certificate_user="cn")},
        auth={
            "password_file": str(users),
            "allow_anonymous": False,
            "acl": [{"users": ["alice"], "send": [queue], "receive": [queue]}],
        },
        store={"backend": "memory"},
    )
    connection = amqps_connection(process, pki, cert=True)
    try:
        connection.create_sender(queue).send(Message(body="by certificate"))
        receiver = connection.create_receiver(queue)
        assert receiver.receive(timeout=10).body == "by certificate"
        receiver.accept()
        with pytest.raises(LinkDetached, match="unauthorized-access"):
            connection.create_sender(unique("not-hers"))
    finally:
        connection.close()
    from proton import ConnectionException

    with pytest.raises(ConnectionException, match="unauthorized-access"):  # no user at all
        amqps_connection(process, pki, cert=False)


def test_kittiwake_status_against_an_https_listener(broker, pki):
    """The admin commands reach an http listener with a tls table over https://, checking it
    against --cafile."""
    from .test_admin_commands import kittiwake

    process = broker(http={"tls": tls_table(pki), "allow_anonymous": True})
    url = f"https://127.0.0.1:{process.http_port}"
    status = kittiwake("status", "--url", url, "--cafile", str(pki.ca))
    assert status.returncode == 0, status.stderr
    assert "version" in status.stdout
    unchecked = kittiwake("status", "--url", url)  # the test CA is not a system one
    assert unchecked.returncode != 0


def test_an_https_client_certificate_names_the_user(broker, pki, tmp_path):
    """certificate_user = "cn" on an http listener: alice's certificate is her login (she is
    an admin), with no Basic header; without it the request is refused."""
    import json
    import urllib.error
    import urllib.request

    users = tmp_path / "users"
    kittiwake_passwd(users, "someone", "else")
    process = broker(
        http={"tls": tls_table(pki, ca=str(pki.ca), certificate_user="cn")},
        auth={"password_file": str(users), "admins": ["alice"]},
    )
    url = f"https://127.0.0.1:{process.http_port}/api/status"
    with urllib.request.urlopen(url, context=client_context(pki, cert=True), timeout=10) as ok:
        assert "version" in json.loads(ok.read())
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, context=client_context(pki), timeout=10)
    assert refused.value.code == 401
