"""Fixtures for the AMQP tests: a module broker with an AMQP listener beside its MQTT one."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from proton.utils import BlockingConnection

from ..brokerproc import BrokerProcess


@pytest.fixture(scope="module")
def amqp_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker (memory store) with AMQP and MQTT listeners for the whole module."""
    sections: dict[str, Any] = {
        "store": {"backend": "memory"},
        "queues": {"max_delivery_attempts": 3},
    }
    process = BrokerProcess(tmp_path_factory.mktemp("amqp-broker"), amqp=True, **sections)
    process.start()
    yield process
    process.stop()


@pytest.fixture
def amqp_url(amqp_broker: BrokerProcess) -> str:
    assert amqp_broker.alive(), f"the broker died:\n{amqp_broker.log_text()[-5000:]}"
    return amqp_broker.amqp_url


@pytest.fixture
def amqp(amqp_url: str) -> Iterator[Callable[..., BlockingConnection]]:
    """``amqp()``: a new BlockingConnection to the module broker, closed after the test."""
    made: list[BlockingConnection] = []

    def connect(**kwargs: Any) -> BlockingConnection:
        connection = BlockingConnection(amqp_url, timeout=10, **kwargs)
        made.append(connection)
        return connection

    yield connect
    for connection in made:
        with contextlib.suppress(Exception):  # teardown must reach every connection
            connection.close()
