"""The store cannot write (disk full / I/O error): publishers are told, nothing acknowledged
earlier is lost, and the broker writes again once space is back.

The broker process gets a file size limit (``prlimit RLIMIT_FSIZE``). Python ignores SIGXFSZ,
so a write past the limit fails with EFBIG inside SQLite, which is what a full disk looks like
to the store: the commit fails. MQTT 5 publishers must get a negative PUBACK/PUBREC, 3.1.1
publishers (no negative acknowledgement) must be disconnected. The limit is then lifted, the
broker must accept writes again, and after a kill -9 every positively acknowledged message must
still reach the durable subscriber.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

from reliability_harness import BrokerCtl

from kittiwake.mqtt.packets import PubAck, PubComp, Publish, PubRec, PubRel
from tests.integration.rawclient import ConnectionClosed, RawClient

PAYLOAD = 64 * 1024
LIMIT = 1 << 20  # bytes any file of the broker may grow to while the "disk" is full


def set_file_limit(pid: int, limit: int) -> None:
    """The soft limit only: lowering the hard one could not be undone without privileges."""
    _soft, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    if hard != resource.RLIM_INFINITY and limit != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    soft = limit if limit != resource.RLIM_INFINITY else hard
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (soft, hard))


def test_disk_full_negative_ack_disconnect_and_no_loss(tmp_path: Path) -> None:
    ctl = BrokerCtl(tmp_path, log_level="warning")
    try:
        ctl.start()
        sub = RawClient(ctl.address, 4, timeout=5.0)  # type: ignore[arg-type]
        sub.connect("durable-sub", clean_start=False)
        sub.subscribe("big/#", 2)
        sub.close()  # offline: every message stays stored for it
        v5 = RawClient(ctl.address, 5, timeout=5.0)  # type: ignore[arg-type]
        v5.connect("pub-v5", clean_start=True)
        v5.publish("sync", b"", 1)  # everything above is on disk
        acked: list[bytes] = []

        set_file_limit(ctl.pid, LIMIT)
        negative = None
        for n in range(64):  # 64 x 64 KiB = 4 MiB, four times the limit
            payload = f"v5-{n}:".encode() + b"x" * PAYLOAD
            v5.publish(f"big/{n}", payload, 1, wait_ack=False)
            ack = v5.expect(PubAck, timeout=10.0)
            if ack.reason_code >= 0x80:
                negative = ack
                break
            acked.append(payload)
        assert negative is not None, "no negative PUBACK while the disk was full"
        assert negative.reason_code == 0x80, negative  # unspecified error
        assert acked, "the limit was hit before any message was stored; raise LIMIT"

        # QoS 2 from MQTT 5: negative PUBREC ends the exchange.
        v5.send(Publish("big/q2", b"q2 while full" + b"x" * PAYLOAD, 2, False, False, 900))
        rec = v5.expect(PubRec, timeout=10.0)
        assert rec.reason_code >= 0x80, f"a QoS 2 publication was accepted on a full disk: {rec}"

        # 3.1.1 has no negative PUBACK: the publisher is disconnected instead.
        v4 = RawClient(ctl.address, 4, timeout=5.0)  # type: ignore[arg-type]
        v4.connect("pub-v4", clean_start=True)
        v4.send(Publish("big/v4", b"v4 while full" + b"x" * PAYLOAD, 1, False, False, 1))
        try:
            packets = v4.recv_until_closed(timeout=10.0)
        except ConnectionClosed:
            packets = []
        assert not any(isinstance(p, PubAck) for p in packets), (
            f"a 3.1.1 publisher was acknowledged on a full disk: {packets}"
        )
        assert ctl.proc is not None and ctl.proc.alive(), "the broker died of a full disk"

        # Space is back: later batches succeed.
        set_file_limit(ctl.pid, resource.RLIM_INFINITY)
        after = b"after space came back" + b"y" * PAYLOAD
        v5.publish("big/after", after, 1, wait_ack=False)
        ack = v5.expect(PubAck, timeout=10.0)
        assert ack.reason_code == 0, f"the store did not recover from the write error: {ack}"
        acked.append(after)
        v5.close()

        ctl.kill9()
        ctl.start()
        sub = RawClient(ctl.address, 4, timeout=5.0)  # type: ignore[arg-type]
        assert sub.connect("durable-sub", clean_start=False).session_present
        got: list[bytes] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not set(acked) <= set(got):
            try:
                packet = sub.expect(Publish, timeout=max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                break
            got.append(packet.payload)
            if packet.qos == 1:
                sub.send(PubAck(packet.packet_id))  # type: ignore[arg-type]
            else:
                sub.send(PubRec(packet.packet_id))  # type: ignore[arg-type]
        missing = [p[:12] for p in acked if p not in got]
        assert not missing, (
            f"{len(missing)} of {len(acked)} acknowledged messages lost after the write errors: "
            f"{missing}\n{ctl.log_text(2)}"
        )
        assert "write failed" in ctl.log_text(2)
    finally:
        ctl.shutdown()


def _fill_disk(ctl: BrokerCtl, v5: RawClient) -> None:
    """Lower the limit and publish until the store refuses (a negative PUBACK)."""
    set_file_limit(ctl.pid, LIMIT)
    for n in range(64):
        v5.publish(f"fill/{n}", b"f" * PAYLOAD, 1, wait_ack=False)
        if v5.expect(PubAck, timeout=10.0).reason_code >= 0x80:
            return
    raise AssertionError("the store never refused a write")


def test_refused_qos2_publication_is_not_delivered(tmp_path: Path) -> None:
    """A v5 QoS 2 publication answered with a negative PUBREC was not accepted; the publisher
    will send it again. Delivering the refused copy too makes the retry a duplicate."""
    ctl = BrokerCtl(tmp_path, log_level="warning")
    try:
        ctl.start()
        keeper = RawClient(ctl.address, 4, timeout=5.0)  # type: ignore[arg-type]
        keeper.connect("keeper", clean_start=False)
        keeper.subscribe("fill/#", 1)
        keeper.subscribe("q2/#", 2)  # a durable subscriber: q2 messages must be stored
        keeper.close()  # stores every fill message, so the disk does fill up
        sub = RawClient(ctl.address, 5, timeout=5.0)  # type: ignore[arg-type]
        sub.connect("online-sub", clean_start=True)
        sub.subscribe("q2/#", 2)
        v5 = RawClient(ctl.address, 5, timeout=5.0)  # type: ignore[arg-type]
        v5.connect("pub-v5", clean_start=True)
        v5.publish("sync", b"", 1)  # the sessions are on disk
        _fill_disk(ctl, v5)
        v5.send(Publish("q2/t", b"refused" + b"r" * PAYLOAD, 2, False, False, 77))
        rec = v5.expect(PubRec, timeout=10.0)
        assert rec.reason_code >= 0x80, rec
        try:
            packet = sub.recv(1.0)
        except TimeoutError:
            return
        shown = (packet.topic, packet.payload[:16]) if isinstance(packet, Publish) else packet
        raise AssertionError(
            f"the subscriber received a publication the broker refused with {rec!r}: {shown}"
        )
    finally:
        ctl.shutdown()


RESENT = b"resent after refusal" + b"z" * PAYLOAD


def test_v311_qos2_resend_after_refusal_is_stored_before_pubrec(tmp_path: Path) -> None:
    """3.1.1 has no negative PUBREC: the publisher is disconnected and resends the PUBLISH
    (DUP, same id) once reconnected. The PUBREC for that resend is an acknowledgement like any
    other: after it the message must be on disk."""
    ctl = BrokerCtl(tmp_path, log_level="warning")
    try:
        ctl.start()
        keeper = RawClient(ctl.address, 4, timeout=5.0)  # type: ignore[arg-type]
        keeper.connect("keeper", clean_start=False)
        keeper.subscribe("fill/#", 1)
        keeper.subscribe("q2/#", 2)
        keeper.close()
        v5 = RawClient(ctl.address, 5, timeout=5.0)  # type: ignore[arg-type]
        v5.connect("pub-v5", clean_start=True)
        v4 = RawClient(ctl.address, 4, timeout=5.0)  # type: ignore[arg-type]
        v4.connect("pub-v4", clean_start=False)
        v5.publish("sync", b"", 1)  # both sessions on disk
        _fill_disk(ctl, v5)
        v4.send(Publish("q2/t", RESENT, 2, False, False, 12))
        packets = v4.recv_until_closed(timeout=10.0)
        assert not any(isinstance(p, PubRec) for p in packets), packets
        set_file_limit(ctl.pid, resource.RLIM_INFINITY)
        v4 = RawClient(ctl.address, 4, timeout=5.0)  # type: ignore[arg-type]
        assert v4.connect("pub-v4", clean_start=False).session_present
        v4.send(Publish("q2/t", RESENT, 2, False, True, 12))
        assert v4.expect(PubRec, timeout=10.0).packet_id == 12
        v4.send(PubRel(12))
        assert v4.expect(PubComp, timeout=10.0).packet_id == 12
        v5.publish("sync", b"", 1)  # whatever the broker queued is on disk now
        ctl.kill9()
        ctl.start()
        keeper = RawClient(ctl.address, 4, timeout=5.0)  # type: ignore[arg-type]
        assert keeper.connect("keeper", clean_start=False).session_present
        got = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                packet = keeper.recv(timeout=0.5)
            except TimeoutError:
                break
            if isinstance(packet, PubRel):
                keeper.send(PubComp(packet.packet_id))
                continue
            assert isinstance(packet, Publish), packet
            got.append(packet.payload[:24])
            if packet.qos == 1:
                keeper.send(PubAck(packet.packet_id))  # type: ignore[arg-type]
            else:
                keeper.send(PubRec(packet.packet_id))  # type: ignore[arg-type]
        assert RESENT[:24] in got, (
            "PUBREC and PUBCOMP were sent for a QoS 2 resend that was never stored; "
            f"after kill -9 the subscriber got {len(got)} messages, not that one"
        )
    finally:
        ctl.shutdown()
