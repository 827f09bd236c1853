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
            self.transactions[new_id] = Staged(self.layer.queues.begin())
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
        self,
        delivery: ProtonDelivery,
        staged: Staged,
        destination: Destination,
        message: Message,
        state_data: list[Any] | None,
    ) -> None:
        """``state_data``: the transfer's transactional state as :meth:`find` read it (read
        once: each read of a delivery's remote state decodes it again)."""
        staged.transaction.send(destination, message)
        txn_id = _txn_id(state_data[0]) if state_data else None
        # Transactional state: accepted, pending the discharge.
        delivery.local.data = [txn_id, _ACCEPTED]  # type: ignore[list-item]
        delivery.update(TRANSACTIONAL_STATE)
        delivery.settle()

    def stage_settlement(self, staged: Staged, core: Delivery, settlement: Settlement) -> None:
        staged.transaction.settle(core, settlement)
        staged.deliveries.append(core)

    def connection_ended(self) -> None:
        """Undischarged transactions roll back with their connection."""
        for staged in self.transactions.values():
            self.layer.queues.rollback(staged.transaction)
        self.transactions.clear()


# The accepted outcome inside a transactional state (only encoded, never changed).
_ACCEPTED = Described(ulong(ACCEPTED_OUTCOME), [])


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
