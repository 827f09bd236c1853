"""The AMQP transaction coordinator (AMQP 1.0 section 4): a link whose target is the
coordinator takes declare and discharge messages; transfers and dispositions that carry a
transactional state are staged in the core Transaction they name. Translation only: what a
commit or rollback does is the core's (broker/transactions.py, QueueDestinations.commit).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proton import Condition, Described, symbol, ulong
from proton import Delivery as ProtonDelivery
from proton import Message as ProtonMessage

from kittiwake.amqp import engine_calls
from kittiwake.amqp import values as values_codec
from kittiwake.broker.completion import Completion
from kittiwake.broker.consumers import Delivery, Settlement
from kittiwake.broker.destinations import Destination
from kittiwake.broker.message import Message
from kittiwake.broker.transactions import Transaction, TransactionRolledBack

if TYPE_CHECKING:
    from kittiwake.amqp.links import LinkLayer

log = logging.getLogger(__name__)

DECLARE = (ulong(0x31), symbol("amqp:declare:list"))
DISCHARGE = (ulong(0x32), symbol("amqp:discharge:list"))
DECLARED = 0x33
TRANSACTIONAL_STATE = 0x34
ACCEPTED_OUTCOME = 0x24

UNKNOWN_ID = "amqp:transaction:unknown-id"
ROLLBACK = "amqp:transaction:rollback"

_ids = itertools.count(1)


@dataclass(slots=True)
class Staged:
    """One declared transaction of a connection."""

    transaction: Transaction
    # Consumer links whose settlements it holds, to tell them when it ends.
    deliveries: list[Delivery] = field(default_factory=list)
    # The fields of the state a staged transfer is answered with ([txn-id, accepted]),
    # encoded once for the transaction.
    accepted_fields: bytes = b""


class Coordinator:
    """The transactions of one connection."""

    def __init__(self, layer: LinkLayer) -> None:
        self.layer = layer
        self.transactions: dict[bytes, Staged] = {}

    # -- the coordinator link -----------------------------------------------------------------

    def control(self, delivery: ProtonDelivery, data: bytes) -> None:
        """A declare or discharge arrived on a coordinator link."""
        message = ProtonMessage()
        try:
            message.decode(data)
        except Exception:
            self._reject(delivery, "amqp:decode-error", "undecodable coordinator message")
            return
        body = message.body
        if not isinstance(body, Described):
            self._reject(delivery, "amqp:decode-error", "expected a declare or discharge")
            return
        fields = body.value if isinstance(body.value, list) else []
        if body.descriptor in DECLARE:
            new_id = b"txn-%d" % next(_ids)
            self.transactions[new_id] = Staged(
                self.layer.queues.begin(), accepted_fields=_accepted_fields(new_id)
            )
            # proton types the data as a list of ints; it is the state's fields.
            delivery.local.data = [new_id]  # type: ignore[list-item]
            delivery.update(DECLARED)
            delivery.settle()
        elif body.descriptor in DISCHARGE:
            txn_id = _txn_id(fields[0] if fields else None)
            fail = bool(fields[1]) if len(fields) > 1 else False
            self._discharge(delivery, txn_id, fail)
        else:
            self._reject(delivery, "amqp:not-implemented", f"unknown control {body.descriptor!r}")

    def _discharge(self, delivery: ProtonDelivery, txn_id: bytes | None, fail: bool) -> None:
        staged = self.transactions.pop(txn_id, None) if txn_id is not None else None
        if staged is None:
            self._reject(delivery, UNKNOWN_ID, f"no transaction {txn_id!r}")
            return
        queues = self.layer.queues
        if fail:
            queues.rollback(staged.transaction)
            self._answer(delivery, None)
            return
        try:
            completion = queues.commit(staged.transaction)
        except TransactionRolledBack as exc:
            self._reject(delivery, ROLLBACK, str(exc))
            return
        if completion is None or completion.done():
            self._answer(delivery, completion)
        else:
            completion.add_done_callback(lambda done: self._answer(delivery, done))

    def _answer(self, delivery: ProtonDelivery, completion: Completion) -> None:
        if self.layer.ended:
            return
        if completion is not None and (
            completion.cancelled() or completion.exception() is not None
        ):
            delivery.local.condition = Condition(ROLLBACK, "the commit could not be stored")
            delivery.update(ProtonDelivery.REJECTED)
        else:
            delivery.update(ProtonDelivery.ACCEPTED)
        delivery.settle()
        self.layer.connection.wake()

    @staticmethod
    def _reject(delivery: ProtonDelivery, condition: str, description: str) -> None:
        delivery.local.condition = Condition(condition, description)
        delivery.update(ProtonDelivery.REJECTED)
        delivery.settle()

    # -- transactional work -------------------------------------------------------------------

    def find(self, state_data: Any) -> Staged | None:
        """The transaction a transactional state names (its first field), or None."""
        if not isinstance(state_data, list) or not state_data:
            return None
        txn_id = _txn_id(state_data[0])
        return self.transactions.get(txn_id) if txn_id is not None else None

    def stage_send(
        self, delivery: Any, staged: Staged, destination: Destination, message: Message
    ) -> None:
        """``delivery``: the transfer's engine C object (answered through the C calls, not
        proton's wrapper: this is every message of a transacted producer)."""
        staged.transaction.send(destination, message)
        # Transactional state: accepted, pending the discharge.
        engine_calls.update_with_fields(delivery, TRANSACTIONAL_STATE, staged.accepted_fields)
        engine_calls.delivery_settle(delivery)

    def stage_settlement(self, staged: Staged, core: Delivery, settlement: Settlement) -> None:
        staged.transaction.settle(core, settlement)
        staged.deliveries.append(core)

    def connection_ended(self) -> None:
        """Undischarged transactions roll back with their connection."""
        for staged in self.transactions.values():
            self.layer.queues.rollback(staged.transaction)
        self.transactions.clear()


def _accepted_fields(txn_id: bytes) -> bytes:
    """The encoded fields of a transactional state [txn-id, accepted] (AMQP 1.0 section
    4.5.5): a list of the id's binary and the accepted outcome (described, no fields)."""
    binary = (
        b"\xa0" + bytes((len(txn_id),)) + txn_id
        if len(txn_id) < 256
        else b"\xb0" + len(txn_id).to_bytes(4, "big") + txn_id
    )
    items = binary + b"\x00\x53" + bytes((ACCEPTED_OUTCOME,)) + b"\x45"
    if len(items) + 1 < 256:
        return b"\xc0" + bytes((len(items) + 1, 2)) + items
    return b"\xd0" + (len(items) + 4).to_bytes(4, "big") + (2).to_bytes(4, "big") + items


def state_fields(delivery: Any) -> Any:
    """The fields of a delivery's remote transactional state ([txn-id] or [txn-id, outcome],
    as proton's ``Delivery.remote.data`` reads them: None when there are none), read through
    the C calls and :mod:`kittiwake.amqp.values`; through proton's wrapper when that reader
    does not read them."""
    encoded = engine_calls.remote_state_fields(delivery)
    if encoded is None:
        return None
    fields = _read_fields(encoded)
    if fields is _UNREAD:
        return engine_calls.wrap_delivery(delivery).remote.data
    return fields or None


_UNREAD: Any = object()


def _read_fields(encoded: bytes) -> Any:
    """A list of values, each plain or described (an outcome); _UNREAD when this reader
    does not read it (the caller then asks proton)."""
    try:
        return values_codec.decode_fields(encoded)
    except values_codec.Unsupported:
        return _UNREAD


def _txn_id(value: object) -> bytes | None:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return None


def transactional_outcome(state_data: Any) -> Settlement | None:
    """The outcome inside a transactional state ([txn-id, outcome]); None when absent."""
    if not isinstance(state_data, list) or len(state_data) < 2:
        return None
    outcome = state_data[1]
    if not isinstance(outcome, Described):
        return None
    code = int(outcome.descriptor) if isinstance(outcome.descriptor, int) else None
    if code == ACCEPTED_OUTCOME or outcome.descriptor == symbol("amqp:accepted:list"):
        return Settlement.ACCEPTED
    if code == 0x25 or outcome.descriptor == symbol("amqp:rejected:list"):
        return Settlement.REJECTED
    if code == 0x26 or outcome.descriptor == symbol("amqp:released:list"):
        return Settlement.RELEASED
    if code == 0x27 or outcome.descriptor == symbol("amqp:modified:list"):
        fields = outcome.value if isinstance(outcome.value, list) else []
        failed = bool(fields[0]) if fields else False
        return Settlement.MODIFIED if failed else Settlement.RELEASED
    return None
