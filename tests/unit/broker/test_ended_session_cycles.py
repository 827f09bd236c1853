"""An ended session leaves nothing for the cyclic collector: kittiwake.collector freezes the
heap as the broker grows, and a cycle frozen alive is never collected, so a session that ends
(expired, clean disconnect, taken over) must be freed by reference counts alone. Its queue and
consumer, its subscriptions' copies and their route plans point at each other; ending it
breaks those cycles.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from conftest import Harness

from kittiwake.broker.message import Message
from kittiwake.broker.sessions import Session

KEPT_TYPES = {"Session", "SessionCopy", "RoutePlan", "Subscription", "Queue", "Consumer"}


def offline_publish_then_expire(h: Harness) -> Session:
    session, _, _ = h.connect("dev", clean_start=False, expiry=60)
    h.subscribe(session, "d/1", 1)
    h.broker.disconnect(session, publish_will=False)
    h.publish("d/1", b"x", 1)  # its plan is worked out while it is offline
    h.advance(61)
    return session


def no_local_offline_then_expire(h: Harness) -> Session:
    session, _, _ = h.connect("dev", clean_start=False, expiry=60)
    h.subscribe(session, "d/1", 1, no_local=True)
    h.broker.disconnect(session, publish_will=False)
    h.publish("d/1", b"x", 1)
    h.advance(61)
    return session


def online_then_clean_end(h: Harness) -> Session:
    session, _, _ = h.connect("dev")
    h.subscribe(session, "d/1", 1)
    h.publish("d/1", b"x", 1)
    h.broker.disconnect(session, publish_will=False)
    return session


def will_on_its_own_topic(h: Harness) -> Session:
    will = Message(topic="d/1", payload=b"bye", qos=0, retain=False, persistent=False)
    session, _, _ = h.connect("dev", will=will)
    h.subscribe(session, "d/1", 1)
    h.broker.disconnect(session, publish_will=True)
    return session


def clean_takeover_of_an_offline_session(h: Harness) -> Session:
    session, _, _ = h.connect("dev", clean_start=False, expiry=600)
    h.subscribe(session, "d/1", 1)
    h.broker.disconnect(session, publish_will=False)
    h.publish("d/1", b"x", 1)
    h.connect("dev", clean_start=True)
    return session


def options_changed_then_ended(h: Harness) -> Session:
    session, _, _ = h.connect("dev")
    h.subscribe(session, "d/1", 1, no_local=True)
    h.publish("d/1", b"x", 1)
    h.subscribe(session, "d/1", 0)  # new options: the old copy is let go
    h.publish("d/1", b"x", 1)
    h.broker.disconnect(session, publish_will=False)
    return session


@pytest.fixture
def saved_garbage() -> Iterator[list[object]]:
    """What the cyclic collector finds, kept for the test instead of freed."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


@pytest.mark.parametrize(
    "scenario",
    [
        offline_publish_then_expire,
        no_local_offline_then_expire,
        online_then_clean_end,
        will_on_its_own_topic,
        clean_takeover_of_an_offline_session,
        options_changed_then_ended,
    ],
)
def test_an_ended_session_is_freed_without_the_cyclic_collector(
    scenario: object, saved_garbage: list[object]
) -> None:
    h = Harness()
    ended = scenario(h)  # type: ignore[operator]
    assert h.broker.sessions.get("dev") is not ended
    del ended
    gc.collect()
    left = sorted(type(o).__name__ for o in saved_garbage if type(o).__name__ in KEPT_TYPES)
    assert left == [], "only the cyclic collector would free these"
    assert h.broker is not None  # the broker itself lives on, as in a serving process
