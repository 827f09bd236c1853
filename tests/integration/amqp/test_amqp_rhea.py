"""rhea (AMQP 1.0 for Node.js, installed by ``make test-deps``) as a second AMQP client:
queue send/receive, redelivery counting, topic publish/subscribe with MQTT on the other side,
a JMS selector filter, a durable subscription resumed after a detach, a transaction through
the coordinator, request/reply through a dynamic queue, and a queue browser."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ..brokerproc import BrokerProcess
from ..clients import PahoClient, unique

RHEA_DIR = Path(__file__).parent / "rhea"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(
    NODE is None or not (RHEA_DIR / "node_modules" / "rhea").is_dir(),
    reason="node and rhea come with `make test-deps` (npm ci in tests/integration/amqp/rhea)",
)


def run(amqp_broker: BrokerProcess, scenario: str, address: str) -> dict[str, Any]:
    assert NODE is not None
    done = subprocess.run(
        [NODE, "scenarios.js", amqp_broker.host, str(amqp_broker.amqp_port), scenario, address],
        cwd=RHEA_DIR,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines, f"rhea printed nothing: {done.stderr}"
    result: dict[str, Any] = json.loads(lines[-1])
    assert "error" not in result, (result, done.stderr)
    return result


@pytest.fixture
def rhea_subscriber(amqp_broker: BrokerProcess) -> Iterator[Callable[[str], subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []

    def start(address: str) -> subprocess.Popen[str]:
        assert NODE is not None
        process = subprocess.Popen(
            [NODE, "scenarios.js", amqp_broker.host, str(amqp_broker.amqp_port), "subscribe",
             address],
            cwd=RHEA_DIR,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline() or "{}")
        assert ready == {"ready": True}, process.stderr.read() if process.stderr else ""
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(5)


def test_rhea_queue_send_and_receive(amqp_broker: BrokerProcess) -> None:
    result = run(amqp_broker, "queue", unique("rhea-q"))
    assert result["got"] == [{"body": f"m{n}", "n": n} for n in (1, 2, 3)]


def test_rhea_failed_delivery_is_counted(amqp_broker: BrokerProcess) -> None:
    assert run(amqp_broker, "redeliver", unique("rhea-r"))["counts"] == [0, 1]


def test_mqtt_to_rhea(
    amqp_broker: BrokerProcess,
    paho: Callable[..., PahoClient],
    rhea_subscriber: Callable[[str], subprocess.Popen[str]],
) -> None:
    topic = unique("rhea-t") + "/x"
    subscriber = rhea_subscriber(f"topic://{topic}")
    paho(amqp_broker.address).publish(topic, b"from mqtt", qos=1)
    out, _ = subscriber.communicate(timeout=15)
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"body": "from mqtt", "durable": True, "to": topic}


def test_rhea_to_mqtt(amqp_broker: BrokerProcess, paho: Callable[..., PahoClient]) -> None:
    topic = unique("rhea-p") + "/x"
    subscriber = paho(amqp_broker.address)
    assert subscriber.subscribe(topic, 2) == [2]
    assert run(amqp_broker, "publish", f"topic://{topic}") == {"accepted": True}
    received = subscriber.get(timeout=5)
    assert (received.payload, received.qos) == (b"from rhea", 2)


def test_rhea_selector_filter_on_a_topic_subscription(amqp_broker: BrokerProcess) -> None:
    """The selector in Qpid JMS's form (rhea.filter.selector: key jms-selector, descriptor
    0x0000468C00000004) is applied by the broker and echoed in its attach."""
    result = run(amqp_broker, "selector", f"topic://{unique('rhea-sel')}/x")
    assert result["got"] == ["b2", "end"]
    assert result["echoed"] == {"descriptor": 0x0000468C00000004, "selector": "colour = 'blue'"}


def test_rhea_durable_subscription_resumed_after_a_detach(amqp_broker: BrokerProcess) -> None:
    result = run(amqp_broker, "durable", f"topic://{unique('rhea-dur')}/x")
    assert result["got"] == ["before", "while away"]
    # Answered as durable (unsettled-state) and never expiring.
    assert result["resumed"] == {"durable": 2, "expiry_policy": "never"}


def test_rhea_transaction_commits_a_send(amqp_broker: BrokerProcess) -> None:
    result = run(amqp_broker, "transaction", unique("rhea-txn"))
    assert result["declared"] is True
    assert result["send_state"] == 0x34, "a transactional send is answered transactional-state"
    # Invisible until the commit: the untransacted message sent after it comes out first.
    assert result["got"] == ["outside", "in transaction"]
    assert result["discharged"] is True


def test_rhea_request_reply_through_a_dynamic_queue(amqp_broker: BrokerProcess) -> None:
    result = run(amqp_broker, "request_reply", unique("rhea-req"))
    assert result == {"reply": "reply to question", "correlation_id": "req-1", "temporary": True}


def test_rhea_queue_browser_consumes_nothing(amqp_broker: BrokerProcess) -> None:
    result = run(amqp_broker, "browse", unique("rhea-browse"))
    assert result == {"browsed": ["m1", "m2"], "consumed": ["m1", "m2"], "mode": "copy"}
