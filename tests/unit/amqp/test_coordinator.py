"""Reading outcomes inside a transactional state (AMQP 1.0 section 4.5.5)."""

from __future__ import annotations

import pytest
from proton import Data, Described, symbol, ulong

from kittiwake.amqp.coordinator import (
    _UNREAD,
    _accepted_fields,
    _read_fields,
    transactional_outcome,
)
from kittiwake.broker.consumers import Settlement


def test_outcomes_numeric_and_symbolic() -> None:
    cases = [
        (Described(ulong(0x24), []), Settlement.ACCEPTED),
        (Described(symbol("amqp:accepted:list"), []), Settlement.ACCEPTED),
        (Described(ulong(0x25), []), Settlement.REJECTED),
        (Described(ulong(0x26), []), Settlement.RELEASED),
        (Described(ulong(0x27), [True, False]), Settlement.MODIFIED),
        (Described(ulong(0x27), [False, True]), Settlement.RELEASED),
        (Described(symbol("amqp:modified:list"), [True]), Settlement.MODIFIED),
    ]
    for outcome, expected in cases:
        assert transactional_outcome([b"txn-1", outcome]) is expected


def test_no_outcome_yet() -> None:
    assert transactional_outcome([b"txn-1"]) is None
    assert transactional_outcome(None) is None
    assert transactional_outcome([b"txn-1", "not described"]) is None


def encoded(value: object) -> bytes:
    data = Data()
    data.put_object(value)
    return bytes(data.encode())


def proton_reads(raw: bytes) -> object:
    """What proton's ``Delivery.remote.data`` gives for state fields encoded as ``raw``."""
    data = Data()
    data.decode(raw)
    data.rewind()
    data.next()
    value = data.get_object()
    return normalised(value)


def normalised(value: object) -> object:
    """proton gives binaries as views; the reader gives bytes."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, list):
        return [normalised(v) for v in value]
    if isinstance(value, Described):
        return Described(value.descriptor, normalised(value.value))
    return value


STATES = [
    [b"txn-1"],
    [b"txn-1", Described(ulong(0x24), [])],
    [b"t" * 300, Described(ulong(0x24), [])],  # a vbin32 and a list32
    [b"txn-2", Described(ulong(0x27), [True, False, {symbol("k"): "v"}])],
    [b"txn-3", Described(symbol("amqp:released:list"), [])],
    [],
]


@pytest.mark.parametrize("state", STATES)
def test_state_fields_are_read_as_proton_reads_them(state: list[object]) -> None:
    """The transactional state of every transacted transfer and acknowledgement is read
    without proton's wrapper: the same fields, or left to proton."""
    raw = encoded(state)
    fields = _read_fields(raw)
    assert fields is not _UNREAD
    assert fields == proton_reads(raw)
    assert transactional_outcome(fields) is transactional_outcome(proton_reads(raw))


def test_state_fields_it_does_not_read_are_left_to_proton() -> None:
    rejected = Described(ulong(0x25), [Described(ulong(0x1D), [symbol("amqp:x"), "why"])])
    assert _read_fields(encoded([b"txn-1", rejected])) is _UNREAD
    assert _read_fields(encoded([b"txn-1"])[:-1]) is _UNREAD  # cut off
    assert _read_fields(encoded("not a list")) is _UNREAD


@pytest.mark.parametrize("txn_id", [b"txn-1", b"t" * 300])
def test_the_accepted_state_is_encoded_as_proton_encodes_it(txn_id: bytes) -> None:
    fields = _accepted_fields(txn_id)
    assert proton_reads(fields) == [txn_id, Described(ulong(0x24), [])]
