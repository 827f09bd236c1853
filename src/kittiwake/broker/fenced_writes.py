"""Fenced writes: publications from outside the protocols (the Spark sink) taken at most once per
(writer, batch, partition). A unit's messages and its fence go to the store in one loop turn,
so in one commit: both or neither survive a crash. Knows no protocol and no store format.

A unit is applied as a transaction is (transactions.py: staged work applied in one loop turn,
one store commit), but through the broker's publish path: topics reach MQTT sessions through
the route plans, which the Router a Transaction stages against does not hold yet.

A writer is a Spark streaming query (its id) or one batch write (an id its driver made). Its
fences are duplicate-detection keys ``<batch>/<partition>`` of producer ``spark:<writer>``; once
the writer says batch N is committed, its fences up to N give way to one key ``committed/N``
(Spark never runs a batch below its last committed one again), so a writer keeps a handful of
keys however long it runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kittiwake.broker.completion import Completion, all_of
from kittiwake.broker.message import Message
from kittiwake.broker.store import DuplicateKey

if TYPE_CHECKING:
    from kittiwake.broker.broker import Broker

log = logging.getLogger(__name__)

# The duplicate-detection producers of fenced writers (sessions use "$session/...").
PRODUCER_PREFIX = "spark:"
_COMMITTED = "committed/"


def fenced_producer_name(writer: str) -> str:
    """The producer under which the store keeps a writer's fences."""
    return PRODUCER_PREFIX + writer


def fence_key(batch: int, partition: int) -> str:
    return f"{batch}/{partition}"


@dataclass(slots=True)
class _WriterFences:
    # Every batch up to this one is committed (-1: none yet); its own fences are gone.
    committed: int = -1
    # Fences of batches above ``committed``: key -> the commit that stores it (None once
    # durable). A commit that fails takes its fence back, so a retry is applied again.
    fences: dict[str, Completion] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FencedOutcome:
    """What a fenced write did: applied now, or found already applied (nothing published),
    and when the answer may go out."""

    already_committed: bool
    completion: Completion


class FencedWrites:
    """The fences of every writer, kept in memory and in the store's duplicate table."""

    __slots__ = ("_broker", "_writers")

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._writers: dict[str, _WriterFences] = {}

    def restore(self, duplicates: Mapping[str, Iterable[DuplicateKey]]) -> None:
        """Take the fences back from a recovered store (once, before any write)."""
        for producer, keys in duplicates.items():
            if not producer.startswith(PRODUCER_PREFIX):
                continue
            state = self._writers.setdefault(producer[len(PRODUCER_PREFIX) :], _WriterFences())
            for key in keys:
                text = str(key)
                if text.startswith(_COMMITTED):
                    state.committed = max(state.committed, int(text[len(_COMMITTED) :]))
                else:
                    state.fences[text] = None

    def write(
        self, writer: str, batch: int, partition: int, messages: Sequence[Message]
    ) -> FencedOutcome:
        """Publish ``messages`` unless this (writer, batch, partition) was taken already.

        Everything happens in this call, in one loop turn: the publications (journal,
        retained, queues) and the fence are stored by one commit. A unit already taken
        publishes nothing; its answer waits for the first write's commit (a retry may arrive
        while it is pending).
        """
        broker = self._broker
        state = self._writers.get(writer)
        if state is None:
            state = self._writers[writer] = _WriterFences()
        key = fence_key(batch, partition)
        if batch <= state.committed:
            return FencedOutcome(True, None)
        if key in state.fences:
            pending = state.fences[key]
            return FencedOutcome(True, pending if pending is not None else broker.store.commit())
        completion: Completion = None
        publish = broker.publish
        for message in messages:
            # Almost always the same object (the turn's commit): all_of returns it as is.
            completion = all_of(completion, publish(message))
        broker.store.add_duplicate(fenced_producer_name(writer), key)
        commit = broker.store.commit()
        state.fences[key] = commit
        if commit is not None:
            commit.add_done_callback(lambda future: self._fence_stored(state, key, future))
        return FencedOutcome(False, all_of(commit, completion))

    def commit_batch(self, writer: str, batch: int) -> Completion:
        """The writer committed every batch up to ``batch``: their fences give way to one
        ``committed`` mark, and any later write for them is answered as already committed."""
        store = self._broker.store
        producer = fenced_producer_name(writer)
        state = self._writers.get(writer)
        if state is None:
            state = self._writers[writer] = _WriterFences()
        if batch <= state.committed:
            return store.commit()
        for key in [k for k in state.fences if int(k.split("/", 1)[0]) <= batch]:
            del state.fences[key]
            store.remove_duplicate(producer, key)
        if state.committed >= 0:
            store.remove_duplicate(producer, _COMMITTED + str(state.committed))
        store.add_duplicate(producer, _COMMITTED + str(batch))
        state.committed = batch
        return store.commit()

    def fences_of(self, writer: str) -> tuple[int, set[str]]:
        """(the last committed batch or -1, the fences above it): for tests and the console."""
        state = self._writers.get(writer)
        if state is None:
            return -1, set()
        return state.committed, set(state.fences)

    @staticmethod
    def _fence_stored(state: _WriterFences, key: str, future: asyncio.Future[None]) -> None:
        if state.fences.get(key) is not future:
            return  # committed past meanwhile, or replaced
        if future.cancelled() or future.exception() is not None:
            # Nothing of the unit was stored: a retry must apply it again.
            del state.fences[key]
            log.warning("a fenced write failed to commit; its retry will be applied again")
        else:
            state.fences[key] = None
