"""Fixtures for the kittiwake.jms scenarios: one broker process per module with AMQP and MQTT
listeners, and ``jms_url`` to reach it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ..brokerproc import BrokerProcess


@pytest.fixture(scope="module")
def jms_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    sections: dict[str, Any] = {
        "store": {"backend": "memory"},
        "queues": {"max_delivery_attempts": 5},
    }
    process = BrokerProcess(tmp_path_factory.mktemp("jms-broker"), amqp=True, **sections)
    process.start()
    yield process
    process.stop()


@pytest.fixture
def jms_url(jms_broker: BrokerProcess) -> str:
    assert jms_broker.alive(), f"the broker died:\n{jms_broker.log_text()[-5000:]}"
    return jms_broker.amqp_url
