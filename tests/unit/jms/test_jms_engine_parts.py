"""Pure parts of the client's engine glue and message stamping: the message id source, the
retired-wrapper sweep, the transactional state written by C calls (objects and an unconnected
proton engine, no socket)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from cproton_ffi import lib as _lib  # type: ignore[import-not-found]
from proton import Connection, Data, Described, symbol, ulong

from kittiwake.jms import messages
from kittiwake.jms.aio import _send_error
from kittiwake.jms.engine import (
    TRANSACTIONAL_STATE,
    _held_elsewhere,
    _outcome,
    transactional_update,
)
from kittiwake.jms.exceptions import TransactionRolledBackException


def test_message_ids_are_jms_ids_and_unique() -> None:
    ids = [messages.new_message_id() for _ in range(10_000)]
    assert all(i.startswith("ID:") for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_draws_ids_of_its_own() -> None:
    before = messages.new_message_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next id and leave at once
        os.write(write, messages.new_message_id().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 1000).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert child.startswith("ID:")
    assert child.rsplit(":", 1)[0] != before.rsplit(":", 1)[0]


class _Wrapper:
    pass


def test_the_sweep_keeps_what_something_else_holds() -> None:
    held = _Wrapper()
    retired = _held_elsewhere([_Wrapper(), held, _Wrapper()])
    assert retired == [held]
    del held  # now only the list holds it
    assert _held_elsewhere(retired) == []


def _local_state(delivery: Any) -> bytes:
    return bytes(Data(_lib.pn_disposition_data(_lib.pn_delivery_local(delivery))).encode())


@pytest.mark.parametrize("accepted", [False, True])
@pytest.mark.parametrize("txn_id", [b"txn-1", b"", "a text id"])
def test_the_transactional_state_is_what_protons_wrapper_writes(
    accepted: bool, txn_id: Any
) -> None:
    link = Connection().session().sender("s")
    by_proton, by_c_calls = link.delivery("1"), link.delivery("2")
    value: list[Any] = [txn_id]
    if accepted:
        value.append(Described(ulong(0x24), []))
    by_proton.local.data = value
    by_proton.update(TRANSACTIONAL_STATE)
    transactional_update(by_c_calls._impl, txn_id, accepted=accepted)
    assert by_c_calls.local_state == by_proton.local_state == TRANSACTIONAL_STATE
    assert _local_state(by_c_calls._impl) == _local_state(by_proton._impl)


def _normalised(value: object) -> object:
    """proton gives binaries as views; the client's reader gives bytes."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, list):
        return [_normalised(v) for v in value]
    if isinstance(value, Described):
        return Described(value.descriptor, _normalised(value.value))
    return value


@pytest.mark.parametrize(
    "fields",
    [
        [b"txn-1", Described(ulong(0x24), [])],
        [b"t" * 300, Described(ulong(0x24), [])],
        [b"txn-2", Described(ulong(0x25), [Described(ulong(0x1D), [symbol("amqp:x"), "why"])])],
        [b"txn-3", Described(symbol("amqp:released:list"), [])],
        [b"txn-4"],
    ],
)
def test_a_transactional_sends_outcome_is_read_as_protons_data_reads_it(
    fields: list[Any],
) -> None:
    """Every transacted send's outcome is read through the C calls and the shared reader
    (proton's Data where that reader does not read it): the same fields either way, and the
    same verdict on the send."""
    delivery = Connection().session().sender("s").delivery("1")
    Data(_lib.pn_disposition_data(_lib.pn_delivery_remote(delivery._impl))).put_object(fields)
    outcome = _outcome(delivery._impl, TRANSACTIONAL_STATE)
    assert outcome.state == TRANSACTIONAL_STATE
    assert _normalised(outcome.data) == _normalised(fields)
    error = _send_error(outcome)
    accepted = len(fields) > 1 and fields[1] == Described(ulong(0x24), [])
    assert (error is None) is accepted
    if not accepted:
        assert isinstance(error, TransactionRolledBackException)
