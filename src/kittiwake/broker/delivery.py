"""The one rule for how reliably a message reaches a subscriber: the lower level wins.

Every protocol front end and every queue uses :func:`delivery_level`; no other code decides.
"""

from __future__ import annotations

from typing import NamedTuple


class DeliveryLevel(NamedTuple):
    """What a subscriber gets: the QoS on its wire and whether the copy is stored."""

    qos: int
    persistent: bool


def delivery_level(
    published_qos: int, persistent: bool, subscription_max_qos: int
) -> DeliveryLevel:
    """Combine the publisher's reliability with the subscription's cap.

    The delivered QoS is the lower of the two. A copy is persistent only when the publisher made
    the message persistent and the delivered QoS is above 0: QoS 0 is never written to disk.
    JMS senders are expressed on the MQTT scale (PERSISTENT = 2, NON_PERSISTENT = 1, acks
    disabled = 0), which gives the JMS-to-MQTT table of DESIGN.md section 2.
    """
    return LEVELS[published_qos][persistent][subscription_max_qos]


def _level(published_qos: int, persistent: bool, subscription_max_qos: int) -> DeliveryLevel:
    qos = min(published_qos, subscription_max_qos)
    return DeliveryLevel(qos, persistent and qos > 0)


# The rule is evaluated per delivery; all 18 answers are built once so the hot path only indexes
# (LEVELS[published_qos][persistent][subscription_max_qos], what delivery_level returns).
LEVELS = tuple(
    tuple(tuple(_level(p, bool(s), m) for m in range(3)) for s in range(2)) for p in range(3)
)
