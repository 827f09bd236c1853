"""Completions: what a core operation returns to say when the state it announces is durable.

None when nothing needs to wait; else a future that completes once it is (and fails if the
store failed). Only the core decides which operation waits for what; a front end waits on the
completion before it answers and never asks the store itself. Nothing here may create a task,
or a future per message: a completion is the store's commit future (``Store.commit()``), shared by
every operation of its batch.
"""

from __future__ import annotations

import asyncio
from typing import TypeAlias

Completion: TypeAlias = "asyncio.Future[None] | None"

# What a settlement (acknowledge, received, an incoming QoS 2 release) or an unsubscribe
# returns: whether there was such a delivery, id or subscription, and when the change is
# durable (None when there was none: nothing changed, nothing to wait for).
Outcome: TypeAlias = "tuple[bool, Completion]"
NOT_FOUND: Outcome = (False, None)


def all_of(first: Completion, second: Completion) -> Completion:
    """A completion for both: the same object when they are (the common case, one batch), a
    new future only when two different ones are both still pending."""
    if second is None or second is first:
        return first
    if first is None or (first.done() and not first.cancelled() and first.exception() is None):
        return second
    if second.done() and not second.cancelled() and second.exception() is None:
        return first
    both: asyncio.Future[None] = first.get_loop().create_future()

    def settle(_: object) -> None:
        if both.done() or not (first.done() and second.done()):
            return
        for source in (first, second):
            if source.cancelled():
                both.cancel()
                return
            error = source.exception()
            if error is not None:
                both.set_exception(error)
                return
        both.set_result(None)

    first.add_done_callback(settle)
    second.add_done_callback(settle)
    return both
