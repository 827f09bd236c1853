"""MemoryStore: the reference implementation of the Store protocol (journal, references,
sessions, retained, QoS 2 state, recovery)."""

from __future__ import annotations

from kittiwake.broker.message import Message
from kittiwake.broker.queues import QueuedMessage
from kittiwake.broker.store import MemoryStore, QueuedRecord, SessionRecord, SubscriptionRecord


def stored(store: MemoryStore, payload: bytes = b"m") -> Message:
    message = Message("t", payload, qos=1, persistent=True)
    store.journal(message)
    return message


def ref(store: MemoryStore, client_id: str, message: Message, **fields) -> QueuedMessage:
    entry = QueuedMessage(message, qos=fields.pop("qos", 1), persistent=True, **fields)
    store.enqueue(client_id, entry)
    return entry


def test_journal_assigns_increasing_ids() -> None:
    """Journalling assigns each message a fresh, non-zero id."""
    store = MemoryStore()
    a, b = stored(store), stored(store)
    assert 0 < a.message_id < b.message_id


def test_journal_keeps_only_referenced_messages() -> None:
    """The memory store has no journal retention: a message is kept while a queue
    references it, so publications nobody durable subscribed to cost no memory."""
    store = MemoryStore()
    a, b = stored(store), stored(store)
    assert store.messages == {}
    ref(store, "c", a)
    assert store.messages == {a.message_id: a}
    assert b.message_id not in store.messages


def test_journal_keeps_an_existing_id() -> None:
    """A message that already has an id keeps it (journalling twice is harmless)."""
    store = MemoryStore()
    message = stored(store)
    first = message.message_id
    ref(store, "c", message)
    store.journal(message)
    assert message.message_id == first
    assert len(store.messages) == 1


def test_message_forgotten_when_its_last_entry_is_removed() -> None:
    """References are counted: the message stays until its last queue entry is removed."""
    store = MemoryStore()
    message = stored(store)
    ref(store, "a", message)
    ref(store, "b", message)
    store.remove("a", message.message_id)
    assert message.message_id in store.messages
    assert ("a", message.message_id) not in store.queued
    store.remove("b", message.message_id)
    assert message.message_id not in store.messages
    assert store.queued == {}


def test_enqueue_twice_is_one_reference() -> None:
    """Re-enqueueing the same (session, message) updates the record, not the count."""
    store = MemoryStore()
    message = stored(store)
    ref(store, "a", message)
    ref(store, "a", message, retain=True)
    assert store.queued[("a", message.message_id)].retain is True
    store.remove("a", message.message_id)
    assert message.message_id not in store.messages


def test_removing_an_unknown_entry_is_harmless() -> None:
    """Releasing something not referenced changes nothing (no negative counts)."""
    store = MemoryStore()
    message = stored(store)
    ref(store, "a", message)
    store.remove("b", message.message_id)
    store.remove("a", 999)
    assert message.message_id in store.messages
    store.remove("a", message.message_id)
    assert store.messages == {}


def test_enqueue_records_the_copy() -> None:
    """The stored reference keeps the subscriber's QoS, retain flag and subscription ids."""
    store = MemoryStore()
    message = stored(store)
    ref(store, "a", message, qos=2, retain=True, subscription_ids=(3, 4))
    assert store.queued[("a", message.message_id)] == QueuedRecord(
        "a", message.message_id, 2, True, (3, 4)
    )


def test_mark_delivery_tracks_state_and_count() -> None:
    """mark_delivery records the delivery id and state; each 'sent' counts a delivery."""
    store = MemoryStore()
    message = stored(store)
    ref(store, "a", message)
    store.mark_delivery("a", message.message_id, 17, "sent")
    record = store.queued[("a", message.message_id)]
    assert (record.delivery_id, record.state, record.delivery_count) == (17, "sent", 1)
    store.mark_delivery("a", message.message_id, 17, "received")
    assert (record.state, record.delivery_count) == ("received", 1)
    store.mark_delivery("a", message.message_id, 18, "sent")
    assert (record.delivery_id, record.delivery_count) == (18, 2)
    store.mark_delivery("zz", message.message_id, 1, "sent")  # unknown: ignored


def test_delete_session_forgets_the_record_only() -> None:
    """A session record is keyed by client id; its queue and keys are deleted by name."""
    store = MemoryStore()
    message = stored(store)
    ref(store, "queue-of-a", message)
    store.save_session(SessionRecord("a", 60))
    store.save_session(SessionRecord("b", 60))
    store.delete_session("a")
    assert set(store.sessions) == {"b"}
    assert set(store.queued) == {("queue-of-a", message.message_id)}
    store.delete_session("nobody")  # harmless


def test_delete_queue_drops_its_entries_and_frees_messages_only_it_held() -> None:
    store = MemoryStore()
    shared, only_a = stored(store), stored(store)
    ref(store, "a", shared)
    ref(store, "a", only_a)
    ref(store, "b", shared)
    store.delete_queue("a")
    assert set(store.queued) == {("b", shared.message_id)}
    assert only_a.message_id not in store.messages
    assert shared.message_id in store.messages
    store.delete_queue("nobody")  # harmless


def test_duplicate_keys_are_kept_per_producer_until_removed() -> None:
    store = MemoryStore()
    store.add_duplicate("a", 1)
    store.add_duplicate("a", 2)
    store.add_duplicate("b", "batch-7/partition-0")
    store.remove_duplicate("a", 1)
    store.remove_duplicate("nobody", 1)
    assert store.recover().duplicates == {"a": {2}, "b": {"batch-7/partition-0"}}
    store.delete_duplicates("a")
    store.delete_duplicates("nobody")
    assert store.recover().duplicates == {"b": {"batch-7/partition-0"}}


def test_retained_set_and_clear() -> None:
    """set_retained stores one message per topic; None clears it."""
    store = MemoryStore()
    first = Message("t", b"1", retain=True, persistent=True)
    second = Message("t", b"2", retain=True, persistent=True)
    store.set_retained("t", first)
    store.set_retained("t", second)
    assert store.retained == {"t": second}
    store.set_retained("t", None)
    store.set_retained("absent", None)
    assert store.retained == {}


def test_save_session_replaces_the_record() -> None:
    """The newest saved record of a client is the one kept."""
    store = MemoryStore()
    store.save_session(SessionRecord("a", 60))
    newer = SessionRecord("a", 120, [SubscriptionRecord("t", 1)])
    store.save_session(newer)
    assert store.sessions == {"a": newer}


def test_commit_is_immediate() -> None:
    """The memory store has nothing to wait for: commit returns None."""
    assert MemoryStore().commit() is None


def test_recover_returns_everything() -> None:
    """recover hands back messages, sessions, references (in message order), retained
    messages and duplicate-detection keys."""
    store = MemoryStore()
    m1, m2 = stored(store, b"1"), stored(store, b"2")
    ref(store, "b", m2)
    ref(store, "a", m1)
    store.mark_delivery("a", m1.message_id, 9, "sent")
    session = SessionRecord("a", 60, [SubscriptionRecord("$share/g/t", 2, subscription_id=1)])
    store.save_session(session)
    retained = Message("r", b"keep", retain=True, persistent=True)
    store.set_retained("r", retained)
    store.add_duplicate("a", 3)
    state = store.recover()
    assert state.messages == {m1.message_id: m1, m2.message_id: m2}
    assert state.sessions == {"a": session}
    assert [(q.queue, q.message_id, q.delivery_id, q.state) for q in state.queued] == [
        ("a", m1.message_id, 9, "sent"),
        ("b", m2.message_id, 0, "queued"),
    ]
    assert state.retained == {"r": retained}
    assert state.duplicates == {"a": {3}}


def test_recover_is_a_snapshot() -> None:
    """Changing the recovered collections does not change the store."""
    store = MemoryStore()
    message = stored(store)
    ref(store, "c", message)
    store.add_duplicate("a", 1)
    state = store.recover()
    state.messages.clear()
    state.duplicates["a"].add(2)
    assert message.message_id in store.messages
    assert store.duplicates == {"a": {1}}
