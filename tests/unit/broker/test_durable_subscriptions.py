"""JMS's rule for asking for a durable subscription again (broker.durable_subscriptions): the
same definition resumes it; another topic, selector or noLocal replaces it."""

from __future__ import annotations

from kittiwake.broker.durable_subscriptions import (
    DurableDefinitions,
    SubscriptionDefinition,
    redefined,
)

CLIENT_ID = "$durable/app/audit"


def durable_session(harness, topic: str = "orders"):
    session, _, _ = harness.connect(CLIENT_ID, expiry=3600)
    harness.subscribe(session, topic, qos=2)
    return session


def test_a_blank_selector_is_none() -> None:
    assert SubscriptionDefinition.of("t", "  ") == SubscriptionDefinition("t")
    assert SubscriptionDefinition.of("t", " n > 1 ").selector == "n > 1"


def test_nothing_to_replace_without_a_subscription() -> None:
    asked = SubscriptionDefinition.of("orders", "n > 1")
    assert not redefined(None, SubscriptionDefinition.of("other", None), asked)


def test_another_topic_replaces_it_even_with_its_definition_unknown(harness) -> None:
    """The topic is the session's subscription (stored): known after a restart too."""
    session = durable_session(harness)
    assert redefined(session, None, SubscriptionDefinition.of("elsewhere", None))
    assert not redefined(session, None, SubscriptionDefinition.of("orders", "n > 1"))


def test_another_selector_or_no_local_replaces_it(harness) -> None:
    session = durable_session(harness)
    definitions = DurableDefinitions()
    definitions.define(CLIENT_ID, SubscriptionDefinition.of("orders", "n > 1"))
    same = SubscriptionDefinition.of("orders", " n > 1 ")
    assert not definitions.replaces(CLIENT_ID, session, same)
    for other in (
        SubscriptionDefinition.of("orders", "n > 2"),
        SubscriptionDefinition.of("orders", None),
        SubscriptionDefinition.of("orders", "n > 1", no_local=True),
    ):
        assert definitions.replaces(CLIENT_ID, session, other), other
    definitions.forget(CLIENT_ID)
    assert CLIENT_ID not in definitions
    # Unknown (made before a restart): the first consumer defines it.
    assert not definitions.replaces(CLIENT_ID, session, SubscriptionDefinition.of("orders", "x"))


def test_the_definition_is_stored_and_in_force_after_a_restart(harness) -> None:
    """Another selector or noLocal after a restart replaces the subscription, as before it:
    the definition is stored with its session and recovered before any publication."""
    session = durable_session(harness)
    definition = SubscriptionDefinition.of("orders", "n > 1", no_local=True)
    harness.broker.durable_definitions.define(CLIENT_ID, definition)
    harness.broker.disconnect(session, publish_will=False)
    assert harness.store.durable_definitions == {CLIENT_ID: definition}
    again = harness.restart()
    definitions = again.broker.durable_definitions
    recovered = again.broker.sessions[CLIENT_ID]
    assert definitions.get(CLIENT_ID) == definition
    assert not definitions.replaces(CLIENT_ID, recovered, definition)
    for other in (
        SubscriptionDefinition.of("orders", "n > 2", no_local=True),
        SubscriptionDefinition.of("orders", "n > 1"),
    ):
        assert definitions.replaces(CLIENT_ID, recovered, other), other


def test_the_stored_definition_goes_with_its_session(harness) -> None:
    """Unsubscribed (the session ends): nothing of the definition is left to recover."""
    session = durable_session(harness)
    harness.broker.durable_definitions.define(
        CLIENT_ID, SubscriptionDefinition.of("orders", "n > 1")
    )
    harness.broker.set_session_expiry(session, 0)
    harness.broker.disconnect(session, publish_will=False)
    assert harness.store.durable_definitions == {}
    assert harness.restart().broker.durable_definitions.get(CLIENT_ID) is None
