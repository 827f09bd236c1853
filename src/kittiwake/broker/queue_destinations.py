"""Queue destinations (JMS queues, point to point): named queues created on first use, fed by
senders, drained by competing consumers that pull by credit; what a queue gives up on moves
to the dead-letter or expiry queue (DESIGN.md section 5). Persistent entries are stored and
a sender's completion is their commit. Outside a transaction they may reach a consumer while
that commit is pending (store-and-dispatch, DESIGN.md section 3; ``store.store_and_dispatch``):
a crash may then lose an entry a consumer saw, only ever one whose sender was not answered.
Knows no protocol: front ends attach consumers and settle their deliveries here.

The crash rule (DESIGN.md section 2): an in-flight mark is written lazily, so a crash may lose
it. Each queue's in-flight window (what its consumers could hold at once) is stored before
it grows, and recovery counts that many waiting entries as possibly delivered.

Not yet here: configured (declared) queues.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from kittiwake.broker.broker import Broker
from kittiwake.broker.completion import Completion, all_of
from kittiwake.broker.consumers import Consumer, Delivery, Settlement
from kittiwake.broker.dead_letters import DeadLetters
from kittiwake.broker.destinations import Destination
from kittiwake.broker.message import Message
from kittiwake.broker.periodic import run_every
from kittiwake.broker.publishing import HeldCopy, publish_held, release_held
from kittiwake.broker.queues import Queue, QueuedMessage, Removal
from kittiwake.broker.routing import Router
from kittiwake.broker.store import RecoveredState
from kittiwake.broker.transactions import Transaction

log = logging.getLogger(__name__)


class QueueDestinations:
    """Every queue destination of one broker, and the pumping that moves their entries to
    consumers."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.store = broker.store
        self.clock = broker.clock
        self.router = Router(self._new_queue)
        self.dead_letters = DeadLetters(self.router, broker.config.queues)
        for name in broker.config.queues.declared:
            self.queue(name)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: dict[Queue, None] = {}
        broker.recovery_hooks.append(self.recover)
        # Dead-lettering subscriptions' queues (JMS topic subscriptions) give up on entries
        # to the same dead-letter and expiry queues.
        broker.dead_letters = self._move_given_up
        # Stored entries the commit in progress enqueued, to hold until the store commit.
        self._committing: list[tuple[Queue, Message]] = []
        # Each queue's in-flight window as stored (see _window_grew); absent = 0.
        self._windows: dict[str, int] = {}
        # Each queue's window commit in progress: nothing goes out until it is durable.
        self._window_commits: dict[str, asyncio.Future[None]] = {}

    # -- queues -----------------------------------------------------------------------------

    def queue(self, name: str) -> Queue:
        """The queue of this name, created on first use."""
        return self.router.queue(name)

    def exists(self, name: str) -> bool:
        """Whether the queue exists or may be created by using it (DESIGN.md section 5: on
        first use, unless the configuration requires declaring it)."""
        return name in self.router.queues or self.broker.config.queues.settings(name).auto_create

    def _new_queue(self, name: str) -> Queue:
        limits = self.broker.config.limits
        return Queue(
            name,
            max_messages=limits.max_queued_messages,
            max_bytes=limits.max_queued_bytes,
            policy=limits.queue_full_policy,
            # JMS: higher priority first, FIFO within a priority.
            ordering="priority",
            max_delivery_attempts=self.broker.config.queues.settings(name).max_delivery_attempts,
            durable=True,
            on_removed=self._removed,
            destination=Destination.queue(name),
            totals=self.broker.queue_totals,
            max_groups=limits.max_message_groups,
        )

    def delete(self, name: str) -> bool:
        """Delete a queue and what waits in it (a temporary queue's end, an admin command);
        its consumers are detached, their unsettled entries dropped with it."""
        queue = self.router.delete_queue(name)
        if queue is None:
            return False
        for consumer in list(queue.consumers):
            consumer.receiver = None
            queue.detach(consumer)
        for entry in queue.drain():
            self._forget(queue, entry)
        queue.end_drop_report()
        if self._windows.pop(name, 0):
            self.store.save_queue_window(name, 0)
        return True

    def purge(self, name: str) -> int | None:
        """An operator empties a queue: every waiting entry goes (in-flight ones stay with
        their consumers), stored ones from the store too. How many went; None: no such queue
        (a purge never creates one)."""
        queue = self.router.queues.get(name)
        if queue is None:
            return None
        entries = queue.drain()
        for entry in entries:
            self._forget(queue, entry)
        if entries:
            log.info("queue %s purged by an operator: %d messages", name, len(entries))
        return len(entries)

    def _forget(self, queue: Queue, entry: QueuedMessage) -> None:
        if entry.persistent:
            self.store.remove(queue.name, entry.message.message_id)

    def recover(self, state: RecoveredState) -> None:
        """Rebuild queue destinations from the store (the broker's recovery calls this).

        Names starting with ``$`` are the broker's own queues (sessions, shared groups). An
        entry marked in flight comes back counted as possibly delivered (its stored count
        includes that attempt). So do as many unmarked entries, first in dispatch order, as
        the queue's stored window leaves room for beside the marked ones: a crash may have
        lost their marks (DESIGN.md section 2: never under-counted)."""
        recovered = 0
        marked: dict[str, int] = {}
        unmarked: dict[str, list[QueuedMessage]] = {}
        for record in state.queued:
            if record.queue.startswith("$"):
                continue
            message = state.messages.get(record.message_id)
            if message is None:
                continue
            entry = QueuedMessage.restored(
                message,
                record.qos,
                record.retain,
                record.subscription_ids,
                record.delivery_count,
            )
            if record.state != "queued":
                marked[record.queue] = marked.get(record.queue, 0) + 1
            else:
                unmarked.setdefault(record.queue, []).append(entry)
            self.queue(record.queue).push(entry)
            recovered += 1
        for name, window in state.queue_windows.items():
            room = window - marked.get(name, 0)
            if room <= 0 or name not in unmarked:
                continue
            # Dispatch order: higher priority first, then arrival (message id) order.
            waiting = sorted(unmarked[name], key=lambda e: -e.message.priority)
            for entry in waiting[:room]:
                entry.delivery_count += 1
                self.broker.store.count_possible_delivery(name, entry.message.message_id)
        if recovered:
            log.info("recovered %d queue destination entries", recovered)

    def mark_sent(self, delivery: Delivery) -> None:
        """A stored entry went out: its mark (written lazily) lets a restart count the attempt."""
        entry = delivery.entry
        queue = delivery.consumer.queue
        if entry.persistent and queue is not None:
            self.store.mark_delivery(
                queue.name, entry.message.message_id, delivery.id, "sent", lazy=True
            )

    # -- sending ----------------------------------------------------------------------------

    def send(self, name: str, message: Message) -> tuple[bool, Completion]:
        """Put a message on a queue: (accepted, completion). Refused when the queue is full
        (its policy said so); the completion says when a persistent one is safe: its commit, or
        (store-and-dispatch) a consumer's acceptance."""
        if not message.created:
            message.created = self.clock.now()
        stats = self.broker.stats
        stats.messages_received += 1
        queue = self.queue(name)
        entry = QueuedMessage.of(message, 2)
        if not queue.push(entry)[0]:
            stats.messages_dropped += 1
            return False, None
        if entry.persistent:
            if not message.message_id:
                self.store.journal(message)
            self.store.enqueue(queue.name, entry)
            if self.broker.store_and_dispatch:
                return True, self._send_dispatching(queue, entry)
            commit = self.store.commit()
            if commit is not None:
                # Persist -> acknowledge -> dispatch: the entry waits for its commit.
                message.awaiting_commit = True
                commit.add_done_callback(lambda done: self._committed(done, queue, message))
                return True, commit
        self.pump_soon(queue)
        return True, None

    def _send_dispatching(self, queue: Queue, entry: QueuedMessage) -> Completion:
        """Store-and-dispatch (outside a transaction, DESIGN.md section 3): consumers may have
        the entry before its commit, and an acceptance before the writer takes it spares the
        write. The sender is answered at the commit or once a consumer accepted the entry,
        whichever comes first (as an MQTT QoS 1 publisher is: broker.publishing.Acceptances).
        While a consumer is keeping up (it has credit and has settled everything it was sent)
        the store may hold the batch back for its acceptance (``store.acceptance_window``);
        a consumer behind on its deliveries would not accept this one in time, so its sender
        is answered at the commit as before, not a window later. A failed commit refuses a
        sender not answered yet, who may send again: a copy delivered meanwhile is then a
        duplicate."""
        store = self.store
        message = entry.message
        early = not store.keeps_in_journal(message) and any(
            consumer.credit.available > 0 and not consumer.unsettled
            for consumer in queue.consumers
        )
        commit = store.commit_unhurried() if early else store.commit()
        self.pump_soon(queue)
        if early and commit is not None and not commit.done():
            return self.broker.acceptances.watch(commit, [entry])
        return commit

    def _after(self, queue: Queue, message: Message, done: asyncio.Future[None]) -> None:
        self._committed(done, queue, message)

    def _committed(self, done: asyncio.Future[None], queue: Queue, message: Message) -> None:
        message.awaiting_commit = False
        if done.cancelled() or done.exception() is not None:
            # Not stored, and its sender is told so: it must not be delivered.
            queue.remove_message(message)
            return
        self.pump_soon(queue)

    # -- consuming --------------------------------------------------------------------------

    def attach(self, name: str, consumer: Consumer) -> Queue:
        queue = self.queue(name)
        queue.attach(consumer)
        self.pump_soon(queue)
        return queue

    def detach(self, consumer: Consumer) -> None:
        """The consumer is gone: what it did not settle comes back, possibly delivered."""
        queue = consumer.queue
        if queue is None:
            return
        queue.detach(consumer)
        if not queue.consumers and self._windows.pop(queue.name, 0):
            self.store.save_queue_window(queue.name, 0)  # nothing can be in flight now
        if queue.count:
            self.pump_soon(queue)

    def settle(
        self, delivery: Delivery, settlement: Settlement, *, undeliverable_here: bool = False
    ) -> Completion:
        """End a delivery attempt; the completion says when a removal is durable."""
        queue = delivery.consumer.queue
        if queue is None or not queue.settle(
            delivery, settlement, undeliverable_here=undeliverable_here
        ):
            return None
        if queue.count:
            self.pump_soon(queue)
        if delivery.entry.persistent and settlement is not Settlement.RELEASED:
            # Nobody waits for an acceptance's removal to be durable (a crash before it
            # delivers the entry again, as the crash rule allows): the store may hold it back
            # with the entries still awaiting acceptance (see _send_dispatching).
            if settlement is Settlement.ACCEPTED:
                return self.store.commit_unhurried()
            return self.store.commit()
        return None

    def _removed(self, queue: Queue, entry: QueuedMessage, reason: Removal) -> None:
        """An entry left its queue for good: the store forgets it; dead letters and expired
        entries move on."""
        if reason is not Removal.ACCEPTED:
            self.broker.stats.messages_dropped += 1
        self._forget(queue, entry)
        if reason is Removal.ACCEPTED and entry.persistent:
            self.broker.acceptances.accepted(entry)
        if self.router.queues.get(queue.name) is not queue:
            return  # a deleted queue's entries go nowhere
        self._move(queue, entry, reason)

    def _move(self, queue: Queue, entry: QueuedMessage, reason: Removal) -> bool:
        """A dead letter or expired entry moves to its queue (stored when persistent);
        False when it goes nowhere."""
        moved = self.dead_letters(queue, entry, reason)
        if moved is None:
            return False
        target, copy = moved
        if copy.persistent:
            self.store.journal(copy.message)
            self.store.enqueue(target.name, copy)
        self.pump_soon(target)
        return True

    def _move_given_up(self, queue: Queue, entry: QueuedMessage, reason: Removal) -> None:
        """What a dead-lettering subscription's queue gave up on (the broker has removed it
        from the store already): moved like a queue destination's, and written without
        waiting for another operation to ask for a commit."""
        if self._move(queue, entry, reason) and entry.persistent:
            self.store.commit()

    # -- transactions ---------------------------------------------------------------------

    def begin(self) -> Transaction:
        """A new local transaction: sends and settlements staged until commit."""
        return Transaction(self.router, on_enqueued=self._enqueued_by_commit)

    def commit(self, transaction: Transaction) -> Completion:
        """Apply a transaction in this loop turn, so in one store commit: its queue sends and
        staged settlements through the core Transaction, its topic sends through the broker's
        publish. Raises TransactionRolledBack (having rolled back) when it cannot apply all.
        Entries it enqueues are dispatched only after the commit (transactions keep the
        strict order)."""
        topic_sends = [(d, m) for d, m in transaction.sends if d.is_topic]
        transaction.sends[:] = [(d, m) for d, m in transaction.sends if not d.is_topic]
        now = self.clock.now()
        for _, message in transaction.sends:
            if not message.created:
                message.created = now
        self._committing = []
        try:
            touched = transaction.commit()
        finally:
            staged, self._committing = self._committing, []
        completion: Completion = None
        for _, message in topic_sends:
            if message.persistent and not message.message_id:
                # Journalled before routing, so that the turn's commit exists by then.
                self.store.journal(message)
        commit = self.store.commit()
        if commit is None:
            # Durable already (nothing persistent, or a store durable at once).
            for _, message in topic_sends:
                completion = all_of(completion, self.broker.publish(message))
        elif topic_sends:
            # Every topic copy, NON_PERSISTENT ones too, waits for the commit: a crash before
            # it shows none of the transaction, after it all.
            held: list[HeldCopy] = []
            for _, message in topic_sends:
                completion = all_of(
                    completion, publish_held(self.broker, message, commit, held)
                )
            if held:
                commit.add_done_callback(functools.partial(release_held, self.broker, held))
        if commit is not None and staged:
            for queue, message in staged:
                message.awaiting_commit = True
                commit.add_done_callback(functools.partial(self._after, queue, message))
        for queue in touched:
            self.pump_soon(queue)
        return all_of(commit, completion)

    def rollback(self, transaction: Transaction) -> None:
        """Drop the staged sends; staged settlements' entries come back, possibly seen."""
        for queue in transaction.rollback():
            self.pump_soon(queue)

    def _enqueued_by_commit(self, queue: Queue, entry: QueuedMessage) -> None:
        self.broker.stats.messages_received += 1
        if entry.persistent:
            message = entry.message
            if not message.message_id:
                self.store.journal(message)
            self.store.enqueue(queue.name, entry)
            self._committing.append((queue, message))

    # -- pumping ----------------------------------------------------------------------------

    def pump(self, queue: Queue) -> int:
        if not queue.count:
            return 0
        if self._window_grew(queue):
            return 0  # pumped once the larger window is stored
        sent = queue.dispatch(self.clock.now())
        self.broker.stats.messages_sent += sent
        return sent

    def _window_grew(self, queue: Queue) -> bool:
        """Store the queue's in-flight window (its consumers' unsettled deliveries and
        credit) when it outgrows the stored one; True when dispatch must wait for that
        commit (until it is done, every pump waits), so nothing beyond the stored window is
        ever in flight. It grows rarely (a consumer's first credit), so nearly every pump
        only adds it up."""
        name = queue.name
        pending = self._window_commits.get(name)
        if pending is not None and not pending.done():
            return True
        window = 0
        for consumer in queue.consumers:
            window += len(consumer.unsettled) + max(0, consumer.credit.available)
        if window <= self._windows.get(name, 0):
            return False
        self._windows[name] = window
        self.store.save_queue_window(name, window)
        commit = self.store.commit()
        if commit is None:
            return False
        self._window_commits[name] = commit
        commit.add_done_callback(functools.partial(self._window_stored, queue))
        return True

    def _window_stored(self, queue: Queue, done: asyncio.Future[None]) -> None:
        if self._window_commits.get(queue.name) is done:
            del self._window_commits[queue.name]
        self.pump_soon(queue)

    def pump_then(self, queue: Queue, then: Callable[[], None]) -> None:
        """Pump now, then call ``then``; when dispatch waits for the queue's window to be
        stored, only after the pump that follows that commit. A drain answers after this, so
        it never reports an empty queue while entries wait for the window's commit."""
        self.pump(queue)
        pending = self._window_commits.get(queue.name)
        if pending is None or pending.done():
            then()
            return
        pending.add_done_callback(lambda _: self.pump_then(queue, then))

    def pump_soon(self, queue: Queue) -> None:
        """Pump once the current loop turn has done its reading (one pump per turn)."""
        if self._loop is None:
            self.pump(queue)
            return
        if not self._pending:
            self._loop.call_soon(self._run_pumps)
        self._pending[queue] = None

    def _run_pumps(self) -> None:
        queues = list(self._pending)
        self._pending.clear()
        for queue in queues:
            self.pump(queue)

    def tick(self) -> None:
        """Make due delayed entries visible and sweep expired ones."""
        now = self.clock.now()
        for queue in list(self.router.queues.values()):
            if not queue.count:
                continue
            due = queue.next_visible_time()
            if due is not None and due <= now:
                self.pump(queue)
            if not queue.consumers:
                queue.expire(now)

    def schedule_ticks(
        self, loop: asyncio.AbstractEventLoop, interval: float = 0.5
    ) -> Callable[[], None]:
        """Run :meth:`tick` every ``interval`` seconds and batch pumps per loop turn from now
        on; returns a canceller."""
        self._loop = loop
        return run_every(loop, interval, self.tick, "queue destinations tick")
