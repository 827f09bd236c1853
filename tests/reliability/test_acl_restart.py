"""Per-user read rules hold for a persistent session across a restart: what its user may not
read is never queued for it while it is offline, also before its client reconnects (the
session's principal is stored with it; DESIGN.md section 4)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from reliability_harness import BrokerCtl

from kittiwake.mqtt.packets import Publish
from tests.integration.rawclient import RawClient


def add_user(path: Path, user: str, password: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "kittiwake", "passwd", str(path), user],
        input=f"{password}\n{password}\n", text=True, check=True, capture_output=True,
        timeout=60,
    )


def test_a_recovered_session_is_filtered_by_its_users_rules(tmp_path: Path) -> None:
    passwords = tmp_path / "passwd"
    add_user(passwords, "alice", "wonderland")
    ctl = BrokerCtl(
        tmp_path / "b",
        auth={
            "password_file": str(passwords),
            "allow_anonymous": True,
            # alice reads everything under site/ but site/hr/; anonymous clients publish.
            "acl": [
                {"users": ["alice"], "subscribe": ["site/#"], "deny_subscribe": ["site/hr/#"]},
                {"publish": ["site/#"]},
            ],
        },
    )
    try:
        ctl.start()
        with RawClient(ctl.address, 4) as alice:  # type: ignore[arg-type]
            alice.connect("alice-1", clean_start=False, username="alice",
                          password=b"wonderland")
            assert alice.subscribe("site/#", 1).reason_codes == [1]
            alice.disconnect()
        ctl.kill9()
        ctl.start()
        with RawClient(ctl.address, 4) as publisher:  # type: ignore[arg-type]
            publisher.connect("publisher")
            publisher.publish("site/hr/salaries", b"not for alice", 1)
            publisher.publish("site/lamp", b"for alice", 1)
        with RawClient(ctl.address, 4) as alice:  # type: ignore[arg-type]
            connack = alice.connect("alice-1", clean_start=False, username="alice",
                                    password=b"wonderland")
            assert connack.session_present
            got = alice.expect(Publish)
            assert (got.topic, got.payload) == ("site/lamp", b"for alice")
            alice.no_packet(0.5)
    finally:
        ctl.shutdown()
