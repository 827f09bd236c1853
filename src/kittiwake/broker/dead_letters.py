"""Where entries go when their queue gives up on them: dead letters (rejected, or delivered too
often) to the dead-letter queue, expired ones to the expiry queue. Each moves as a new message
that keeps its body and properties and gains its original destination, queue, the reason and
its delivery count (DESIGN.md section 5). Knows no protocol and no store."""

from __future__ import annotations

import dataclasses
import logging

from kittiwake.broker.destinations import Destination
from kittiwake.broker.message import Message, MessageProperties, PropertyType
from kittiwake.broker.queues import Queue, QueuedMessage, Removal
from kittiwake.broker.routing import Router
from kittiwake.config import QueuesConfig

log = logging.getLogger(__name__)

# Properties a moved message gains. JMSXDeliveryCount is the JMS-defined count of attempts.
ORIGINAL_DESTINATION = "KW_OriginalDestination"
ORIGINAL_QUEUE = "KW_OriginalQueue"
REASON = "KW_Reason"
DELIVERY_COUNT = "JMSXDeliveryCount"

DEFAULT_DEAD_LETTER_QUEUE = "DLQ"
DEFAULT_EXPIRY_QUEUE = "ExpiryQueue"


def moved_message(entry: QueuedMessage, queue: Queue, reason: Removal) -> Message:
    """The message a dead letter or expired entry becomes in its new queue."""
    message = entry.message
    if queue.destination is not None:
        origin = queue.destination
    else:  # a subscription's queue: the message was sent to its topic
        origin = Destination.topic(message.topic)
    properties = MessageProperties(message.properties.typed_items() if message.properties else ())
    properties.set(ORIGINAL_DESTINATION, str(origin))
    properties.set(ORIGINAL_QUEUE, queue.name)
    properties.set(REASON, reason.value)
    # JMS defines JMSXDeliveryCount as an int.
    properties.set(DELIVERY_COUNT, entry.delivery_count, PropertyType.INT)
    return dataclasses.replace(
        message,
        properties=properties,
        # It must not expire (or wait) all over again where it lands.
        expiry=None,
        delivery_time=None,
        message_id=0,
        encoded=None,
        awaiting_commit=False,
        retain=False,
    )


class DeadLetters:
    """Moves what queues give up on; a queue's ``on_removed`` calls it.

    Where to is the original queue's setting (``QueuesConfig.settings``: [queues], or the
    first of its patterns matching the queue's name): ``dead_letter_queue`` and
    ``expiry_queue`` are names, or patterns with ``{queue}`` for the original queue's name
    (``DLQ.{queue}``); an empty expiry queue name drops expired entries (still counted by
    their queue). Returns where the entry went and as what, for the caller that stores it.
    """

    __slots__ = ("config", "moved", "router")

    def __init__(self, router: Router, config: QueuesConfig | None = None) -> None:
        self.router = router
        self.config = QueuesConfig() if config is None else config
        # Entries moved so far, for $SYS and the console.
        self.moved = 0

    def __call__(
        self, queue: Queue, entry: QueuedMessage, reason: Removal
    ) -> tuple[Queue, QueuedMessage] | None:
        if reason is Removal.EXPIRED:
            pattern = self.config.settings(queue.name).expiry_queue
        elif reason is Removal.REJECTED or reason is Removal.DELIVERY_LIMIT:
            pattern = self.config.settings(queue.name).dead_letter_queue
        else:
            return None
        if not pattern:
            return None
        # A broker-named queue ($session/..., a subscription's) lends its name without the
        # '$': the moved entry must land in an ordinary queue, one a restart recovers.
        name = pattern.format(queue=queue.name.lstrip("$"))
        if name == queue.name:
            # A dead letter of the dead-letter queue itself has nowhere further to go.
            log.warning("queue %s: dropping an entry (%s): no further queue", name, reason.value)
            return None
        target = self.router.queue(name)
        copy = QueuedMessage.of(moved_message(entry, queue, reason), 2)
        accepted, _ = target.push(copy)
        if not accepted:
            log.warning("queue %s full: an entry from %s (%s) is lost", name, queue.name, reason)
            return None
        self.moved += 1
        return target, copy
