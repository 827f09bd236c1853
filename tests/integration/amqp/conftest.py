"""Fixtures for the AMQP tests: a module broker with an AMQP listener beside its MQTT one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ..brokerproc import BrokerProcess


@pytest.fixture(scope="module")
def amqp_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker (memory store) with AMQP and MQTT listeners for the whole module."""
    sections: dict[str, Any] = {"store": {"backend": "memory"}}
    process = BrokerProcess(tmp_path_factory.mktemp("amqp-broker"), amqp=True, **sections)
    process.start()
    yield process
    process.stop()


@pytest.fixture
def amqp_url(amqp_broker: BrokerProcess) -> str:
    assert amqp_broker.alive(), f"the broker died:\n{amqp_broker.log_text()[-5000:]}"
    return amqp_broker.amqp_url
