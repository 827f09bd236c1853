"""Graceful restarts (SIGTERM, wait, start again) keep every durability guarantee.

A shorter version of the kill -9 soak: the same clients and checks across a few SIGTERM
cycles, plus what only a graceful stop can get wrong (exit status, wills of persistent
sessions, QoS 2 state written at shutdown).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from reliability_harness import (
    BrokerCtl,
    PahoPublisher,
    RawPublisher,
    Stream,
    all_delivered,
    check,
    retained_snapshot,
    start_soak_subscribers,
    wait_for,
)

from kittiwake.mqtt.packets import PubComp, Publish, PubRec, PubRel, Will
from kittiwake.mqtt.properties import Properties
from tests.integration.rawclient import RawClient

SEED = int(os.environ.get("KITTIWAKE_RESTART_SEED", "2718"))
CYCLES = 6


def test_graceful_restarts_under_load_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    print(f"\ngraceful restart soak: seed={SEED} cycles={CYCLES}")
    deadline = time.monotonic() + 60
    ctl = BrokerCtl(tmp_path)
    threads: list = []
    try:
        ctl.start()
        subscribers = start_soak_subscribers(ctl, deadline, threads)
        with RawClient(ctl.address, 4) as c:  # type: ignore[arg-type]
            c.connect("setup")
            c.publish("r/sentinel", b"s", 1, retain=True)  # also a barrier: sessions are stored
        publishers = [
            RawPublisher(ctl, "raw-v4-q1", version=4, qos=1, topic="k/a", tag="a", rate=120,
                         window=16, deadline=deadline),
            RawPublisher(ctl, "raw-v4-q2", version=4, qos=2, topic="k/b", tag="b", rate=120,
                         window=16, deadline=deadline),
            RawPublisher(ctl, "raw-v5-q2", version=5, qos=2, topic="k/c", tag="c", rate=100,
                         window=10, deadline=deadline),
        ]
        paho_pub = PahoPublisher(ctl, "paho-pub", topics={1: "k/d1", 2: "k/d2"}, tag="d",
                                 rate=100, window=16, deadline=deadline)
        for pub in [*publishers, paho_pub]:
            pub.start()
            threads.append(pub)

        for cycle in range(1, CYCLES + 1):
            time.sleep(rng.uniform(0.3, 0.8))
            with RawClient(ctl.address, 4) as c:  # type: ignore[arg-type]
                c.connect(f"retainer-{cycle}")
                c.publish("r/p", f"p{cycle}".encode(), 1, retain=True)
                c.publish("r/np", f"np{cycle}".encode(), 0, retain=True)
                c.publish("r/sync", b"", 1)
                c.disconnect()
            time.sleep(rng.uniform(0.0, 0.3))
            code = ctl.terminate()
            assert code == 0, f"cycle {cycle}: SIGTERM exit status {code}\n{ctl.log_text(1)}"
            ctl.start()
            snapshot = retained_snapshot(ctl.address, ["r/p", "r/np"], "r/sentinel")  # type: ignore[arg-type]
            assert snapshot == {"r/p": f"p{cycle}".encode()}, (cycle, snapshot)

        time.sleep(0.3)
        for pub in [*publishers, paho_pub]:
            pub.finish.set()
        finished = wait_for(lambda: all(not p.is_alive() for p in [*publishers, paho_pub]), 15)
        streams = [Stream(p.client_id, p.tag, p.topic, p.qos, p.sent, p.acked) for p in publishers]
        streams += [
            Stream(f"paho-pub/qos{q}", paho_pub.stream_tag(q), paho_pub.topics[q], q,
                   paho_pub.sent[q], paho_pub.acked[q])
            for q in (1, 2)
        ]
        wait_for(lambda: all(all_delivered(streams, s.deliveries) for s in subscribers.values()),
                 15, interval=0.1)
        for thread in threads:
            thread.stop()
        for thread in threads:
            thread.join(5)
        report = [f"seed={SEED} restarts={ctl.terminations}"] + [
            f"{p.client_id}: sent={len(p.sent)} acked={len(p.acked)} resent={p.resent} "
            f"connects={p.connects}" for p in publishers
        ]
        print("\n".join(report))
        assert not {t.name: t.errors for t in threads if t.errors}
        assert finished, "; ".join(report)
        assert not {t.name: t.not_present for t in threads if t.not_present}, (
            "reconnections without session-present=1"
        )
        verdict = check(
            streams, {n: s.deliveries for n, s in subscribers.items()},
            exactly_once={"b": True, "c": True, paho_pub.stream_tag(2): True},
        )
        assert verdict.ok(), (
            f"seed {SEED}: missing={verdict.missing} duplicates={verdict.duplicates} "
            f"phantoms={verdict.phantoms} anomalies="
            f"{ {t.name: t.anomalies[:5] for t in threads if t.anomalies} }\n" + "\n".join(report)
        )
        assert ctl.terminations == CYCLES
    finally:
        for thread in threads:
            thread.stop()
        ctl.shutdown()
        for thread in threads:
            thread.join(5)


def test_will_of_persistent_session_survives_graceful_restart(tmp_path: Path) -> None:
    """A persistent session's will is part of the session: a graceful stop must not drop it.
    After the restart the client does not come back, so the will is published (as after kill
    -9, where it is)."""
    ctl = BrokerCtl(tmp_path)
    try:
        ctl.start()
        watcher = RawClient(ctl.address, 4, timeout=5.0)  # type: ignore[arg-type]
        watcher.connect("watcher", clean_start=False)
        watcher.subscribe("wills/#", 1)
        willer = RawClient(ctl.address, 5, timeout=5.0)  # type: ignore[arg-type]
        willer.connect(
            "willer", clean_start=False,
            properties=Properties(session_expiry_interval=600),
            will=Will("wills/willer", b"willer is gone", qos=1,
                      properties=Properties(will_delay_interval=1)),
        )
        watcher.publish("sync", b"", 1)  # both sessions are on disk
        assert ctl.terminate() == 0
        ctl.start()
        watcher = RawClient(ctl.address, 4, timeout=5.0)  # type: ignore[arg-type]
        assert watcher.connect("watcher", clean_start=False).session_present
        try:
            will = watcher.expect(Publish, timeout=4.0)
        except TimeoutError:
            raise AssertionError(
                "the will of persistent session 'willer' did not survive the graceful restart "
                f"(it does survive kill -9)\n{ctl.log_text(2)}"
            ) from None
        assert (will.topic, will.payload) == ("wills/willer", b"willer is gone")
    finally:
        ctl.shutdown()


def test_qos2_state_written_at_graceful_shutdown(tmp_path: Path) -> None:
    """PUBREC received, broker stopped gracefully before PUBREL: the exchange completes on the
    restarted broker and the message is delivered exactly once."""
    ctl = BrokerCtl(tmp_path)
    try:
        ctl.start()
        sub = RawClient(ctl.address, 4, timeout=5.0)  # type: ignore[arg-type]
        sub.connect("sub", clean_start=False)
        sub.subscribe("t", 2)
        sub.close()
        pub = RawClient(ctl.address, 4, timeout=5.0)  # type: ignore[arg-type]
        pub.connect("pub", clean_start=False)
        pub.send(Publish("t", b"graceful", 2, False, False, 5))
        pub.expect(PubRec)
        assert ctl.terminate() == 0
        ctl.start()
        pub = RawClient(ctl.address, 4, timeout=5.0)  # type: ignore[arg-type]
        assert pub.connect("pub", clean_start=False).session_present
        pub.send(Publish("t", b"graceful", 2, False, True, 5))  # as if PUBREC had been lost
        assert pub.expect(PubRec).packet_id == 5
        pub.send(PubRel(5))
        assert pub.expect(PubComp).packet_id == 5
        sub = RawClient(ctl.address, 4, timeout=5.0)  # type: ignore[arg-type]
        assert sub.connect("sub", clean_start=False).session_present
        first = sub.expect(Publish, timeout=3.0)
        assert (first.payload, first.qos) == (b"graceful", 2)
        sub.send(PubRec(first.packet_id))  # type: ignore[arg-type]
        sub.expect(PubRel)
        sub.send(PubComp(first.packet_id))  # type: ignore[arg-type]
        sub.no_packet(0.5)
    finally:
        ctl.shutdown()
