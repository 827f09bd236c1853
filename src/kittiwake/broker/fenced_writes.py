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

A batch write's commit also says the writer is finished: no batch of it will run again. Its
fences give way to one key ``finished/<wall ms>``, kept for ``journal.finished_write_retention``
(a straggling task of it, or a rerun with the same ``writeId``, still publishes nothing) and
then dropped with the writer, so finished writes leave nothing behind (the duplicate table's
rule: a key lives as long as a duplicate of what it guards may still arrive). A stream never
finishes: its query may restart from its checkpoint at any time, so its ``committed/N`` stays.

A unit comes as messages or, from a Flight put, as columns (:class:`PublicationRows`): then
the store journals every row from the columns and only the rows someone receives, or that are
retained, become messages (:meth:`FencedWrites._publish_rows`); what is stored and sent is the
same either way.

Every copy of a unit's messages waits for the unit's commit, QoS 0 included
(:func:`~kittiwake.broker.publishing.publish_held`): if that commit fails, nothing of the unit
reached anyone, and its retry is applied as the first time.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kittiwake.broker.completion import Completion, all_of
from kittiwake.broker.message import Message
from kittiwake.broker.publication_rows import PublicationRows
from kittiwake.broker.publishing import HeldCopy, publish_held, release_held
from kittiwake.broker.store import DuplicateKey

if TYPE_CHECKING:
    from kittiwake.broker.broker import Broker

log = logging.getLogger(__name__)

# The duplicate-detection producers of fenced writers (sessions use "$session/...").
PRODUCER_PREFIX = "spark:"
_COMMITTED = "committed/"
_FINISHED = "finished/"


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
    # When the writer said it was finished (wall ms); None while it may write.
    finished_at: int | None = None


@dataclass(frozen=True, slots=True)
class FencedOutcome:
    """What a fenced write did: applied now, or found already applied (nothing published),
    and when the answer may go out."""

    already_committed: bool
    completion: Completion


class FencedWrites:
    """The fences of every writer, kept in memory and in the store's duplicate table."""

    __slots__ = ("_broker", "_finished", "_writers", "retention_ms")

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._writers: dict[str, _WriterFences] = {}
        # Finished writers by the time they finished (wall ms): the next to drop on top.
        self._finished: list[tuple[int, str]] = []
        self.retention_ms = round(broker.config.journal.finished_write_retention * 1000)

    def restore(self, duplicates: Mapping[str, Iterable[DuplicateKey]]) -> None:
        """Take the fences back from a recovered store (once, before any write)."""
        for producer, keys in duplicates.items():
            if not producer.startswith(PRODUCER_PREFIX):
                continue
            writer = producer[len(PRODUCER_PREFIX) :]
            state = self._writers.setdefault(writer, _WriterFences())
            for key in keys:
                text = str(key)
                if text.startswith(_COMMITTED):
                    state.committed = max(state.committed, int(text[len(_COMMITTED) :]))
                elif text.startswith(_FINISHED):
                    state.finished_at = int(text[len(_FINISHED) :])
                else:
                    state.fences[text] = None
            if state.finished_at is not None:
                heapq.heappush(self._finished, (state.finished_at, writer))

    def write(
        self,
        writer: str,
        batch: int,
        partition: int,
        messages: Sequence[Message] | PublicationRows,
    ) -> FencedOutcome:
        """Publish ``messages`` unless this (writer, batch, partition) was taken already.

        Everything happens in this call, in one loop turn: the publications (journal,
        retained, queues) and the fence are stored by one commit, and no copy of them is sent
        before it (persist -> acknowledge -> dispatch, QoS 0 included). A unit already taken
        publishes nothing; its answer waits for the first write's commit (a retry may arrive
        while it is pending).
        """
        broker = self._broker
        state = self._writers.get(writer)
        if state is None:
            state = self._writers[writer] = _WriterFences()
        key = fence_key(batch, partition)
        if batch <= state.committed or state.finished_at is not None:
            return FencedOutcome(True, None)
        if key in state.fences:
            pending = state.fences[key]
            return FencedOutcome(True, pending if pending is not None else broker.store.commit())
        store = broker.store
        store.add_duplicate(fenced_producer_name(writer), key)
        # The turn's batch: one future for every operation of this turn (Store.commit), so
        # the messages published below are stored by this commit too.
        commit = store.commit()
        completion: Completion = None
        if commit is None:
            # A store durable at once (the memory store): nothing can fail, nothing waits.
            if isinstance(messages, PublicationRows):
                messages = messages.messages()
            for message in messages:
                completion = all_of(completion, broker.publish(message))
            state.fences[key] = None
            return FencedOutcome(False, completion)
        held: list[HeldCopy] = []
        if isinstance(messages, PublicationRows):
            completion = self._publish_rows(messages, commit, held)
        else:
            for message in messages:
                completion = all_of(completion, publish_held(broker, message, commit, held))
        if held:
            commit.add_done_callback(functools.partial(release_held, broker, held))
        state.fences[key] = commit
        commit.add_done_callback(lambda future: self._fence_stored(state, key, future))
        return FencedOutcome(False, all_of(commit, completion))

    def _publish_rows(
        self, rows: PublicationRows, commit: asyncio.Future[None], held: list[HeldCopy]
    ) -> Completion:
        """:func:`publish_held` for every row, the rows nobody receives taken as columns.

        The store numbers and journals every row at once (the ids :func:`publish_held` would
        have given them, in row order); only a row whose topic some session or group
        receives (its route plan, looked up once per topic), or that is retained, becomes a
        message and goes through the publish path, its id already given (so its journal row
        is not written twice). The rest need nothing else: no retained change, no copy.
        """
        broker = self._broker
        created = broker.clock.now()
        ids = broker.store.journal_rows(rows, created)
        plan = broker.routes.plan
        receiving = set()
        for topic in rows.distinct_topics or dict.fromkeys(rows.topics):
            route = plan(topic)
            if route.copies or route.groups:
                receiving.add(topic)
        if rows.any_retained:
            retain = rows.retain
            chosen = [
                index
                for index, topic in enumerate(rows.topics)
                if retain[index] or topic in receiving
            ]
        elif receiving:
            chosen = [index for index, topic in enumerate(rows.topics) if topic in receiving]
        else:
            chosen = []
        broker.stats.messages_received += len(rows) - len(chosen)
        completion: Completion = None
        for index in chosen:
            message = rows.message(index)
            message.created = created
            message.message_id = ids[index]
            completion = all_of(completion, publish_held(broker, message, commit, held))
        return completion

    def commit_batch(self, writer: str, batch: int, *, finished: bool = False) -> Completion:
        """The writer committed every batch up to ``batch``: their fences give way to one
        ``committed`` mark, and any later write for them is answered as already committed.

        ``finished``: the writer will never write again (a batch write's driver committed
        it): all its fences give way to one ``finished`` mark, dropped with the writer after
        ``journal.finished_write_retention`` (:meth:`drop_finished`)."""
        store = self._broker.store
        producer = fenced_producer_name(writer)
        state = self._writers.get(writer)
        if state is None:
            state = self._writers[writer] = _WriterFences()
        if state.finished_at is not None or (batch <= state.committed and not finished):
            return store.commit()
        for key in [k for k in state.fences if finished or int(k.split("/", 1)[0]) <= batch]:
            del state.fences[key]
            store.remove_duplicate(producer, key)
        if state.committed >= 0:
            store.remove_duplicate(producer, _COMMITTED + str(state.committed))
        state.committed = max(state.committed, batch)
        if finished:
            state.finished_at = self._broker.clock.wall_ms()
            store.add_duplicate(producer, _FINISHED + str(state.finished_at))
            heapq.heappush(self._finished, (state.finished_at, writer))
        else:
            store.add_duplicate(producer, _COMMITTED + str(batch))
        return store.commit()

    def drop_finished(self) -> None:
        """Forget the writers that finished longer than the retention ago, their last key
        included (the tick calls it; cheap when none is due)."""
        finished = self._finished
        if not finished:
            return
        due = self._broker.clock.wall_ms() - self.retention_ms
        store = self._broker.store
        while finished and finished[0][0] <= due:
            finished_at, writer = heapq.heappop(finished)
            state = self._writers.get(writer)
            if state is None or state.finished_at != finished_at:
                continue
            del self._writers[writer]
            store.remove_duplicate(fenced_producer_name(writer), _FINISHED + str(finished_at))
            log.info("fenced writer %s finished long ago: its last fence is dropped", writer)

    def fences_of(self, writer: str) -> tuple[int, set[str]]:
        """(the last committed batch or -1, the fences above it): for tests and the console."""
        state = self._writers.get(writer)
        if state is None:
            return -1, set()
        return state.committed, set(state.fences)

    def finished(self, writer: str) -> bool:
        """Whether the writer said it was finished and is still remembered."""
        state = self._writers.get(writer)
        return state is not None and state.finished_at is not None

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
