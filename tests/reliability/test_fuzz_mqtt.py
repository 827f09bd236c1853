"""A bounded fuzzing run against a real broker process: at least 100,000 hostile MQTT inputs
(well-formed packets with odd values and byte-mutated frames, many per connection) over
sockets, while well-behaved clients watch.

What must hold (DESIGN.md §4, "bad input gets a clear answer and harms no one else"): the
broker never crashes and never logs an internal error; everything it answers decodes; a
subscriber connected the whole time receives every acknowledged message; and an offline
persistent session finds every acknowledged QoS 1 message, even after the broker is killed
with SIGKILL at the end. The count of inputs and the time taken are printed.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from mqtt_fuzzing import PROTECTED_PREFIX, Template, run_script, templates

from tests.integration.brokerproc import BrokerProcess
from tests.integration.clients import PahoClient, unique
from tests.integration.rawclient import RawClient

# Inputs the broker must handle; connections come from one Hypothesis template each
# SCRIPTS_PER_TEMPLATE times, with a different mutation each time.
TARGET_INPUTS = 100_000
SCRIPTS_PER_TEMPLATE = 40
# A bound on the whole run, far above what it needs (about 30 s on an idle 2-core machine).
RUN_DEADLINE = 600.0
# Log lines that mean the broker met a bug rather than bad input.
BUG_MARKERS = ("Traceback", "internal error", "Fatal error", "Exception in callback")


class FuzzRun:
    """Counts and checks shared by the Hypothesis examples of one run."""

    def __init__(self, broker: BrokerProcess, publisher: RawClient) -> None:
        self.broker = broker
        self.publisher = publisher
        self.inputs = 0
        self.connections = 0
        self.templates = 0
        self.acknowledged: list[bytes] = []
        self._log_offset = 0

    def run_template(self, template: Template) -> None:
        self.templates += 1
        for script in template.scripts(SCRIPTS_PER_TEMPLATE):
            outcome = run_script(self.broker.address, script)
            self.inputs += outcome.handled
            self.connections += 1
        where = f"after template {template!r:.2000}"
        assert self.broker.alive(), f"the broker died {where}:\n{self.broker.log_text()[-5000:]}"
        self.check_log(where)
        # Traffic that must get through all along: one acknowledged message per template.
        payload = b"keep-%d" % len(self.acknowledged)
        self.publisher.publish(f"{PROTECTED_PREFIX}/{len(self.acknowledged) % 7}", payload, 1)
        self.acknowledged.append(payload)

    def check_log(self, where: str) -> None:
        with open(self.broker.log_path, "rb") as log:
            log.seek(self._log_offset)
            new = log.read().decode("utf-8", "replace")
        self._log_offset += len(new.encode("utf-8", "replace"))
        for marker in BUG_MARKERS:
            assert marker not in new, f"the broker met a bug ({marker!r}) {where}:\n{new[-5000:]}"


def test_hundred_thousand_hostile_inputs_harm_no_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "data"
    sections = {
        "log_level": "warning",  # info would log every one of the connections
        "sys": {"interval": 0},
        "store": {"data_dir": str(data_dir)},
    }
    broker = BrokerProcess(tmp_path / "run1", **sections).start()  # type: ignore[arg-type]
    try:
        # An offline persistent session that must find every acknowledged message later.
        keeper_id = unique("fuzz-keeper")
        keeper = RawClient(broker.address, 4)
        keeper.connect(keeper_id, clean_start=False)
        keeper.subscribe(f"{PROTECTED_PREFIX}/#", 1)
        keeper.disconnect()
        # A subscriber connected through the whole run, and the publisher feeding both.
        watcher = PahoClient(broker.address, unique("fuzz-watcher"), protocol=5)
        watcher.connect(keepalive=60)
        watcher.subscribe(f"{PROTECTED_PREFIX}/#", 1)
        publisher = RawClient(broker.address, 4)
        publisher.connect(unique("fuzz-publisher"), keepalive=0)
        run = FuzzRun(broker, publisher)

        @settings(
            max_examples=20,
            deadline=None,
            database=None,
            # Shrinking would replay against a broker already changed by the run; the failing
            # input is in the assertion message instead.
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(templates())
        def fuzz(template: Template) -> None:
            run.run_template(template)

        started = time.monotonic()
        while run.inputs < TARGET_INPUTS:
            assert time.monotonic() - started < RUN_DEADLINE, (
                f"only {run.inputs} inputs in {RUN_DEADLINE}s"
            )
            fuzz()
        elapsed = time.monotonic() - started

        # The bystanders: the watcher got everything, the publisher is still connected.
        received = {m.payload for m in watcher.get_many(len(run.acknowledged), timeout=30)}
        assert received == set(run.acknowledged)
        assert publisher.is_open(within=0.05)
        watcher.stop()
        publisher.disconnect()

        # Kill -9, restart on the same data: the offline session still has every message.
        assert broker.proc is not None
        os.kill(broker.proc.pid, signal.SIGKILL)
        broker.proc.wait(10)
        broker.stop()
        broker = BrokerProcess(tmp_path / "run2", **sections).start()  # type: ignore[arg-type]
        keeper = RawClient(broker.address, 4)
        assert keeper.connect(keeper_id, clean_start=False).session_present
        got: set[bytes] = set()
        deadline = time.monotonic() + 60
        while len(got) < len(run.acknowledged) and time.monotonic() < deadline:
            packet = keeper.recv(timeout=max(deadline - time.monotonic(), 0.01))
            if getattr(packet, "topic", "").startswith(PROTECTED_PREFIX):
                got.add(packet.payload)  # type: ignore[attr-defined]
                if packet.qos:  # type: ignore[attr-defined]
                    keeper.send_raw(b"\x40\x02" + packet.packet_id.to_bytes(2, "big"))  # type: ignore[attr-defined]
        assert got == set(run.acknowledged), (
            f"lost {len(set(run.acknowledged) - got)} acknowledged messages"
        )
        keeper.disconnect()
        with capsys.disabled():
            print(
                f"\nfuzzing: {run.inputs} hostile inputs on {run.connections} connections "
                f"({run.templates} Hypothesis templates) in {elapsed:.1f}s, "
                f"{run.inputs / elapsed:.0f} inputs/s; {len(run.acknowledged)} acknowledged "
                "messages all delivered, before and after kill -9"
            )
    finally:
        broker.stop()
