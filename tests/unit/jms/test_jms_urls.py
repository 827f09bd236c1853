"""Connection URLs: plain amqp:// and Qpid JMS's failover:(...)?failover.option=value."""

from __future__ import annotations

import pytest

from kittiwake.jms import JMSException
from kittiwake.jms.aio import ConnectionFactory
from kittiwake.jms.urls import Address, Failover, parse_url


def test_a_plain_url() -> None:
    parsed = parse_url("amqp://alice:s%40cret@broker.example:5673")
    assert parsed.addresses == (Address("broker.example", 5673),)
    assert (parsed.username, parsed.password, parsed.failover) == ("alice", "s@cret", None)
    assert parse_url("amqp://h").addresses == (Address("h", 5672),)


def test_a_failover_url_with_qpid_options() -> None:
    parsed = parse_url(
        "failover:(amqp://a:5672,amqp://b:5673)?failover.maxReconnectAttempts=3"
        "&failover.initialReconnectDelay=50&maxReconnectDelay=400"
        "&failover.reconnectBackOffMultiplier=1.5"
    )
    assert parsed.addresses == (Address("a", 5672), Address("b", 5673))
    assert parsed.failover == Failover(
        max_attempts=3, initial_delay_ms=50, max_delay_ms=400, backoff=1.5
    )


def test_failover_defaults_reconnect_without_end() -> None:
    parsed = parse_url("failover:(amqp://a,amqp://b)")
    assert parsed.failover == Failover()
    assert parsed.failover is not None and parsed.failover.max_attempts is None
    assert parse_url("failover:amqp://a").addresses == (Address("a", 5672),)


@pytest.mark.parametrize(
    "url",
    [
        "failover:(amqp://a",
        "failover:()",
        "failover:(amqp://a)?failover.maxReconnectAttempt=3",
        "failover:(amqp://a)?maxReconnectAttempts=many",
        "http://a",
    ],
)
def test_bad_urls_are_refused_with_the_reason(url: str) -> None:
    with pytest.raises(JMSException):
        parse_url(url)


def test_a_failover_factory_reconnects_with_its_options() -> None:
    factory = ConnectionFactory(
        "failover:(amqp://a,amqp://b)?failover.maxReconnectAttempts=4"
        "&failover.initialReconnectDelay=20&failover.maxReconnectDelay=100"
    )
    assert factory.reconnect
    assert (factory.reconnect_attempts, factory.reconnect_delay) == (4, 0.02)
    assert factory.reconnect_max_delay == 0.1
    assert not ConnectionFactory("amqp://a").reconnect
