"""delivery_level: the one rule of DESIGN.md §2 — the publisher sets the level, the lower wins."""

from __future__ import annotations

import pytest

from kittiwake.broker.delivery import DeliveryLevel, delivery_level

# (published qos, publisher persistent, subscription max qos) -> (delivered qos, persistent)
# Written out in full rather than computed, so the table is the specification.
WHOLE_RULE: list[tuple[int, bool, int, int, bool]] = [
    (0, False, 0, 0, False),
    (0, False, 1, 0, False),
    (0, False, 2, 0, False),
    (0, True, 0, 0, False),  # QoS 0 is never written to disk, even from a persistent sender
    (0, True, 1, 0, False),
    (0, True, 2, 0, False),
    (1, False, 0, 0, False),
    (1, False, 1, 1, False),
    (1, False, 2, 1, False),
    (1, True, 0, 0, False),  # capped to QoS 0 by the subscription: not stored
    (1, True, 1, 1, True),
    (1, True, 2, 1, True),
    (2, False, 0, 0, False),
    (2, False, 1, 1, False),
    (2, False, 2, 2, False),
    (2, True, 0, 0, False),
    (2, True, 1, 1, True),
    (2, True, 2, 2, True),
]


@pytest.mark.parametrize(
    ("published_qos", "persistent", "max_qos", "qos", "stored"),
    WHOLE_RULE,
    ids=[f"pub{p}-{'P' if s else 'NP'}-sub{m}" for p, s, m, _, _ in WHOLE_RULE],
)
def test_whole_rule(
    published_qos: int, persistent: bool, max_qos: int, qos: int, stored: bool
) -> None:
    """Delivered QoS = min(published, subscription); stored only if persistent and QoS > 0."""
    assert delivery_level(published_qos, persistent, max_qos) == DeliveryLevel(qos, stored)


def test_whole_rule_table_is_complete() -> None:
    """The table above covers every combination of the three inputs exactly once."""
    keys = {(p, s, m) for p, s, m, _, _ in WHOLE_RULE}
    assert len(keys) == len(WHOLE_RULE) == 3 * 2 * 3


# JMS senders on the MQTT scale (Message.qos docstring, DESIGN.md §2).
PERSISTENT = (2, True)
NON_PERSISTENT = (1, False)
ACKS_DISABLED = (0, False)

# Each row is one sentence of the seed table in DESIGN.md §2.
SEED_TABLE: list[tuple[str, tuple[int, bool], int, DeliveryLevel]] = [
    ("any message to a QoS 0 subscription arrives at QoS 0 (persistent)",
     PERSISTENT, 0, DeliveryLevel(0, False)),
    ("any message to a QoS 0 subscription arrives at QoS 0 (nonpersistent)",
     NON_PERSISTENT, 0, DeliveryLevel(0, False)),
    ("any message to a QoS 0 subscription arrives at QoS 0 (acks disabled)",
     ACKS_DISABLED, 0, DeliveryLevel(0, False)),
    ("nonpersistent with acks disabled arrives at QoS 0 (QoS 1 subscription)",
     ACKS_DISABLED, 1, DeliveryLevel(0, False)),
    ("nonpersistent with acks disabled arrives at QoS 0 (QoS 2 subscription)",
     ACKS_DISABLED, 2, DeliveryLevel(0, False)),
    ("nonpersistent at a QoS 1 subscription arrives at QoS 1, not persistent",
     NON_PERSISTENT, 1, DeliveryLevel(1, False)),
    ("nonpersistent at a QoS 2 subscription arrives at QoS 1, not persistent",
     NON_PERSISTENT, 2, DeliveryLevel(1, False)),
    ("persistent arrives at QoS 1 (QoS 1 subscription), persistent",
     PERSISTENT, 1, DeliveryLevel(1, True)),
    ("persistent arrives at QoS 2 (QoS 2 subscription), persistent",
     PERSISTENT, 2, DeliveryLevel(2, True)),
]


@pytest.mark.parametrize(
    ("sender", "max_qos", "expected"),
    [row[1:] for row in SEED_TABLE],
    ids=[row[0] for row in SEED_TABLE],
)
def test_jms_to_mqtt_seed_table(
    sender: tuple[int, bool], max_qos: int, expected: DeliveryLevel
) -> None:
    """The JMS-to-MQTT seed table of DESIGN.md §2, one row per sentence."""
    published_qos, persistent = sender
    assert delivery_level(published_qos, persistent, max_qos) == expected


def test_result_is_named() -> None:
    """Callers may read the level by name (qos, persistent) as well as unpack it."""
    level = delivery_level(2, True, 1)
    assert (level.qos, level.persistent) == (1, True)
    qos, persistent = level
    assert (qos, persistent) == (1, True)


def test_broker_uses_the_rule(harness) -> None:
    """The broker's publish path applies the rule: a QoS 1 subscriber gets a QoS 2 message at 1."""
    session, consumer, _ = harness.connect("sub")
    harness.subscribe(session, "t", qos=1)
    harness.subscribe(harness.connect("sub0")[0], "t", qos=0)
    harness.publish("t", b"m", qos=2)
    [got] = consumer.deliveries
    assert (got.qos, got.entry.persistent) == (1, True)
    assert got.delivery_id != 0


def test_qos0_delivery_uses_id_zero(harness) -> None:
    """A QoS 0 delivery carries delivery id 0 and never enters the in-flight window."""
    session, consumer, _ = harness.connect("sub")
    harness.subscribe(session, "t", qos=0)
    harness.publish("t", b"m", qos=2)
    [got] = consumer.deliveries
    assert (got.delivery_id, got.qos, got.entry.persistent) == (0, 0, False)
    assert session.inflight == {}
