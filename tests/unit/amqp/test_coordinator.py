"""Reading outcomes inside a transactional state (AMQP 1.0 section 4.5.5)."""

from __future__ import annotations

from proton import Described, symbol, ulong

from kittiwake.amqp.coordinator import transactional_outcome
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
