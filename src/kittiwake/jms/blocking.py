"""The blocking JMS API: a thin layer that runs the asyncio core (``kittiwake.jms.aio``) on
one I/O thread per connection and keeps JMS's threading rules: a session's listeners run one
at a time on that session's own thread; ``close()`` may be called from any thread and waits
for a running listener (from the listener itself it is refused, as JMS 2.0 says). Never does
I/O itself: a receive() that settles a message on its own thread has the engine write it
(``_IOThread.borrow``, under the lock the I/O thread holds while its loop runs)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import selectors
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar

from kittiwake.jms import aio
from kittiwake.jms.aio import AcknowledgeMode, CompletionListener, ConnectionState
from kittiwake.jms.destinations import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic
from kittiwake.jms.engine import EngineConnection
from kittiwake.jms.exceptions import (
    IllegalStateException,
    JMSException,
    JMSRuntimeException,
)
from kittiwake.jms.factories import MessageFactory, ProducerSettings
from kittiwake.jms.messages import (
    DeliveryMode,
    Message,
)

T = TypeVar("T")
Temporary = TypeVar("Temporary", TemporaryQueue, TemporaryTopic)
MessageListener = Callable[[Message], None]
# The longest a blocked receive() waits on its own thread before it re-checks the consumer.
_WAIT_SLICE = 1.0


class _UnlockingSelector(selectors.BaseSelector):
    """The I/O thread's selector: that thread holds its connection's engine lock at all
    times but while it waits here for I/O, so another thread that takes the lock touches
    the engine only while the loop is idle (``_IOThread.borrow``). That is why the loop is
    asyncio's own and not uvloop's, which has no such hook."""

    def __init__(self, lock: threading.Lock) -> None:
        self.inner = selectors.DefaultSelector()
        self.lock = lock

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self.inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self.inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self.inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self.lock.release()
        try:
            return self.inner.select(timeout)
        finally:
            self.lock.acquire()

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self.inner.get_key(fileobj)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self.inner.get_map()

    def close(self) -> None:
        self.inner.close()


class _IOThread:
    """The connection's event loop on its own daemon thread, holding ``lock`` except while
    it waits for I/O (see ``_UnlockingSelector``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loop = asyncio.SelectorEventLoop(_UnlockingSelector(self.lock))
        self.thread = threading.Thread(target=self._run, name="kittiwake-jms-io", daemon=True)
        # The thread inside borrow()'s locked region, if any (see _check_not_borrowing).
        self.borrower: int | None = None
        self.thread.start()

    def _run(self) -> None:
        with self.lock:
            self.loop.run_forever()

    def _alive(self) -> bool:
        """Whether the loop may still run what is handed to it: once its thread has left
        run_forever (stop, close from any thread), a call queued meanwhile never runs."""
        return self.thread.is_alive()

    def _check_not_borrowing(self) -> None:
        # Code run inside borrow()'s region on its thread (a __del__ the collector runs
        # there) would wait for a loop that waits for this thread's lock: refused instead.
        if self.borrower == threading.get_ident():
            raise IllegalStateException("a blocking JMS call while this thread hands over")

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self.thread:
            coroutine.close()
            raise IllegalStateException("a blocking JMS call on the connection's I/O thread")
        if self.borrower is not None:
            try:
                self._check_not_borrowing()
            except IllegalStateException:
                coroutine.close()
                raise
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        while True:
            try:
                return future.result(timeout=_WAIT_SLICE)
            except concurrent.futures.TimeoutError:
                if future.done():  # the coroutine's own TimeoutError, or done just now
                    return future.result()
                if not self._alive():
                    future.cancel()
                    raise RuntimeError("the connection's loop is closed") from None

    def call_soon(self, function: Callable[[], None]) -> None:
        """Run ``function`` on the loop and wait for it: a callback, not a task.
        RuntimeError when the loop is closed."""
        if threading.current_thread() is self.thread:
            function()
            return
        self._check_not_borrowing()
        aio.call_from_thread(self.loop, function, self._alive)

    def borrow(
        self, engine_of: Callable[[], EngineConnection], function: Callable[[], None]
    ) -> None:
        """Run ``function``'s engine work here, on the caller's thread, under the loop's lock
        instead of waking the loop and waiting for it (two thread switches each way): the
        hot path of an AUTO_ACKNOWLEDGE receive(), whose acknowledgement is written to the
        socket before this returns. When the socket does not take it all (or there is
        none: vm://), the loop writes the rest and this waits for it, as the loop's own
        write would have been waited for. RuntimeError when the loop is closed.

        ``engine_of`` gives the engine of the moment, read under the lock (a reconnection
        replaces it on the loop). The main thread hands its work to the loop instead, as
        every thread did before borrowing: Python runs a signal handler there between any
        two bytecodes, whatever the thread's signal mask (another thread may take the
        signal for it), and one that called the JMS API inside the region (``close()`` on
        SIGTERM) would wait for the loop, which waits for this thread's lock, while one
        that raised (KeyboardInterrupt) would leave a write or a settlement half done."""
        if threading.current_thread() is self.thread:
            function()
            engine_of().flush()
            return
        self._check_not_borrowing()
        if self.loop.is_closed():
            raise RuntimeError("the connection's loop is closed")
        if threading.current_thread() is threading.main_thread():

            def on_loop() -> None:
                function()
                engine_of().flush()

            aio.call_from_thread(self.loop, on_loop, self._alive)
            return
        with self.lock:
            self.borrower = threading.get_ident()
            try:
                engine = engine_of()
                written = engine.borrowed(function)
            finally:
                self.borrower = None
        if not written:
            aio.call_from_thread(self.loop, engine.flush, self._alive)

    def call(self, function: Callable[[], T]) -> T:
        """Run plain engine-touching code on the loop (the engine is not thread-safe)."""

        async def wrapper() -> T:
            return function()

        return self.run(wrapper())

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=10)
            self.loop.close()


class ConnectionFactory:
    """``ConnectionFactory("amqp://127.0.0.1:5672", client_id=..., disable_ack=...,
    prefetch=...)``. ``allow_pickle`` enables ObjectMessage (pickle: unsafe with untrusted
    peers)."""

    def __init__(
        self,
        url: str = "amqp://127.0.0.1:5672",
        client_id: str | None = None,
        username: str | None = None,
        password: str | None = None,
        disable_ack: bool = False,
        prefetch: int = aio.DEFAULT_PREFETCH,
        *,
        allow_pickle: bool = False,
        timeout: float = 15.0,
        reconnect: bool = False,
        reconnect_attempts: int = 20,
        reconnect_delay: float = 0.1,
    ) -> None:
        self.core = aio.ConnectionFactory(
            url,
            client_id,
            username,
            password,
            disable_ack,
            prefetch,
            allow_pickle=allow_pickle,
            timeout=timeout,
            reconnect=reconnect,
            reconnect_attempts=reconnect_attempts,
            reconnect_delay=reconnect_delay,
        )

    def create_connection(
        self, username: str | None = None, password: str | None = None
    ) -> Connection:
        io = _IOThread()
        try:
            core = io.run(self.core.create_connection(username, password))
        except BaseException:
            io.stop()
            raise
        return Connection(io, core)

    def create_context(
        self, session_mode: AcknowledgeMode = AcknowledgeMode.AUTO_ACKNOWLEDGE
    ) -> JMSContext:
        try:
            connection = self.create_connection()
        except JMSException as exc:
            raise JMSRuntimeException(str(exc), exc.error_code) from exc
        try:
            session = connection.create_session(
                session_mode == AcknowledgeMode.SESSION_TRANSACTED, session_mode
            )
        except BaseException:
            connection.close()
            raise
        return JMSContext(connection, session)


class Connection:
    def __init__(self, io: _IOThread, core: aio.Connection) -> None:
        self.io = io
        self.core = core
        self.sessions: list[Session] = []

    def get_client_id(self) -> str | None:
        return self.core.client_id

    def get_state(self) -> ConnectionState:
        return self.core.state

    def set_state_listener(self, listener: Callable[[ConnectionState], None] | None) -> None:
        """Told of every state change (CONNECTED, RECONNECTING, FAILED), on the I/O thread:
        it must not block."""
        self.core.set_state_listener(listener)

    def set_exception_listener(self, listener: Callable[[JMSException], None] | None) -> None:
        """Called on a thread of its own when the connection fails."""

        def notify(error: JMSException) -> None:
            if listener is not None:
                threading.Thread(target=listener, args=(error,), daemon=True).start()

        self.core.set_exception_listener(notify if listener is not None else None)

    def create_session(
        self,
        transacted: bool = False,
        acknowledge_mode: AcknowledgeMode = AcknowledgeMode.AUTO_ACKNOWLEDGE,
    ) -> Session:
        session = Session(self, self.io.run(self.core.create_session(transacted, acknowledge_mode)))
        self.sessions.append(session)
        return session

    def start(self) -> None:
        self.io.run(self.core.start())

    def stop(self) -> None:
        """Returns once no listener is running; refused from a listener (JMS 2.0)."""
        for session in self.sessions:
            session._refuse_from_listener("Connection.stop()")
        self.io.run(self.core.stop())

    def close(self) -> None:
        for session in self.sessions:
            session._refuse_from_listener("Connection.close()")
        if not self.io.loop.is_closed():
            self.io.run(self.core.close())
        for session in self.sessions:
            session._shutdown()
        self.io.stop()

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Session(MessageFactory):
    """Single-threaded, as in JMS; its listeners run one at a time on its own thread."""

    def __init__(self, connection: Connection, core: aio.Session) -> None:
        self.connection = connection
        self.io = connection.io
        self.core = core
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._listener_thread: int | None = None

    def _listener_executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="kittiwake-jms-listener"
            )
        return self._executor

    def _in_listener(self) -> bool:
        return self._listener_thread == threading.get_ident()

    def _refuse_from_listener(self, what: str) -> None:
        if self._in_listener():
            raise IllegalStateException(f"{what} from this session's own message listener")

    def _shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def _allows_pickle(self) -> bool:
        return self.core._allows_pickle()

    def get_acknowledge_mode(self) -> AcknowledgeMode:
        return self.core.mode

    def get_transacted(self) -> bool:
        return self.core.transacted

    def create_producer(self, destination: Destination | None = None) -> MessageProducer:
        return MessageProducer(self, self.io.run(self.core.create_producer(destination)))

    def create_consumer(
        self,
        destination: Destination,
        message_selector: str | None = None,
        no_local: bool = False,
    ) -> MessageConsumer:
        core = self.io.run(self.core.create_consumer(destination, message_selector, no_local))
        return MessageConsumer(self, core)

    def create_durable_consumer(
        self,
        topic: Topic,
        name: str,
        message_selector: str | None = None,
        no_local: bool = False,
    ) -> MessageConsumer:
        core = self.io.run(
            self.core.create_durable_consumer(topic, name, message_selector, no_local)
        )
        return MessageConsumer(self, core)

    create_durable_subscriber = create_durable_consumer

    def create_shared_consumer(
        self, topic: Topic, name: str, message_selector: str | None = None
    ) -> MessageConsumer:
        core = self.io.run(self.core.create_shared_consumer(topic, name, message_selector))
        return MessageConsumer(self, core)

    def create_shared_durable_consumer(
        self, topic: Topic, name: str, message_selector: str | None = None
    ) -> MessageConsumer:
        core = self.io.run(self.core.create_shared_durable_consumer(topic, name, message_selector))
        return MessageConsumer(self, core)

    def create_browser(self, queue: Queue, message_selector: str | None = None) -> QueueBrowser:
        return QueueBrowser(self, self.io.run(self.core.create_browser(queue, message_selector)))

    def create_temporary_queue(self) -> TemporaryQueue:
        return self._blocking_delete(self.io.run(self.core.create_temporary_queue()))

    def create_temporary_topic(self) -> TemporaryTopic:
        return self._blocking_delete(self.io.run(self.core.create_temporary_topic()))

    def _blocking_delete(self, destination: Temporary) -> Temporary:
        """Its ``delete()`` runs on the connection's I/O thread."""
        lifetime = destination.lifetime
        if isinstance(lifetime, aio.TemporaryNode):
            lifetime.run = self.io.run
        return destination

    def delete_temporary(self, destination: TemporaryQueue | TemporaryTopic) -> None:
        """The same as ``destination.delete()`` (kept for earlier callers)."""
        destination.delete()

    def unsubscribe(self, name: str) -> None:
        self.io.run(self.core.unsubscribe(name))

    def commit(self) -> None:
        self.io.run(self.core.commit())

    def rollback(self) -> None:
        self.io.run(self.core.rollback())

    def recover(self) -> None:
        self.io.run(self.core.recover())

    def acknowledge(self) -> None:
        self.io.call(self.core.acknowledge)

    def close(self) -> None:
        self._refuse_from_listener("Session.close()")
        if not self.io.loop.is_closed():
            self.io.run(self.core.close())
        self._shutdown()

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()



class MessageProducer:
    def __init__(self, session: Session, core: aio.MessageProducer) -> None:
        self.session = session
        self.core = core

    def get_destination(self) -> Destination | None:
        return self.core.destination

    def set_delivery_mode(self, mode: DeliveryMode) -> None:
        self.core.set_delivery_mode(mode)

    def get_delivery_mode(self) -> DeliveryMode:
        return self.core.delivery_mode

    def set_priority(self, priority: int) -> None:
        self.core.set_priority(priority)

    def get_priority(self) -> int:
        return self.core.priority

    def set_time_to_live(self, milliseconds: int) -> None:
        self.core.set_time_to_live(milliseconds)

    def get_time_to_live(self) -> int:
        return self.core.time_to_live

    def set_delivery_delay(self, milliseconds: int) -> None:
        self.core.set_delivery_delay(milliseconds)

    def get_delivery_delay(self) -> int:
        return self.core.delivery_delay

    def set_disable_message_id(self, value: bool) -> None:
        self.core.set_disable_message_id(value)

    def set_disable_message_timestamp(self, value: bool) -> None:
        self.core.set_disable_message_timestamp(value)

    def send(
        self,
        message: Message,
        destination: Destination | None = None,
        *,
        delivery_mode: DeliveryMode | None = None,
        priority: int | None = None,
        time_to_live: int | None = None,
        completion_listener: CompletionListener | None = None,
    ) -> None:
        """Returns once the broker has accepted a PERSISTENT message outside a transaction;
        in a transacted session at once (as Qpid JMS: ``commit()`` waits for every send, and
        rolls back with TransactionRolledBackException when one failed); with a
        ``completion_listener`` at once, the listener told later (on the I/O thread: it must
        not block)."""
        if completion_listener is None and self.core._post_send(
            message, destination, delivery_mode, priority, time_to_live
        ):
            return  # asynchronous anyway: stamped and queued here, sent by the I/O thread
        self.io_run(
            self.core.send(
                message,
                destination,
                delivery_mode=delivery_mode,
                priority=priority,
                time_to_live=time_to_live,
                completion_listener=completion_listener,
            )
        )

    def io_run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.session.io.run(coroutine)

    def close(self) -> None:
        self.io_run(self.core.close())


class MessageConsumer:
    """``receive(timeout)`` takes seconds (Python's unit; JMS's is milliseconds)."""

    def __init__(self, session: Session, core: aio.MessageConsumer) -> None:
        self.session = session
        self.core = core
        self.listener: MessageListener | None = None
        self._waiter = threading.Event()
        io = session.io
        core_session = core.session

        def engine_of() -> EngineConnection:
            return core_session.engine  # the engine of the moment (reconnection)

        def hand_over(function: Callable[[], None]) -> None:
            io.borrow(engine_of, function)

        self._hand_over = hand_over

    def get_message_selector(self) -> str | None:
        return self.core.get_message_selector()

    def receive(self, timeout: float | None = None) -> Message | None:
        # A prefetched message is taken here, on the caller's thread, its acknowledgement
        # posted to the I/O thread in a batch (or, AUTO and PRE, settled and written here,
        # under the loop's lock, before this returns: _IOThread.borrow); with prefetch, an
        # empty buffer is waited for here
        # too (the I/O thread sets the waiter as a message arrives or anything changes).
        # The round trip to the I/O thread is left for what the loop must judge: no prefetch
        # (a pull), a timeout that ran out, stop, close, failure, reconnection.
        core = self.core
        message = core._take_ready(self._hand_over)
        if message is not None:
            return message
        if core.prefetch > 0 and (timeout is None or timeout > 0):
            deadline = None if timeout is None else time.monotonic() + timeout
            waiter = self._waiter
            waited = False
            while core._ready_here():
                waiter.clear()
                endpoint = core.endpoint
                endpoint.waiter = waiter
                try:
                    message = core._take_ready(self._hand_over)
                    if message is not None:
                        return message
                    remaining = _WAIT_SLICE if deadline is None else deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    waiter.wait(min(remaining, _WAIT_SLICE))  # bounded: the loop re-checks
                    waited = True
                finally:
                    endpoint.waiter = None
                message = core._take_ready(self._hand_over)
                if message is not None:
                    return message
            if waited and core.closed:
                return None  # closed (from another thread) while this receive waited
            if deadline is not None:
                timeout = max(0.0, deadline - time.monotonic())
        return self.session.io.run(core.receive(timeout))

    def receive_no_wait(self) -> Message | None:
        message = self.core._take_ready(self._hand_over)
        if message is not None:
            return message
        return self.session.io.run(self.core.receive_no_wait())

    def __iter__(self) -> Iterator[Message]:
        while True:
            message = self.receive()
            if message is None:
                return
            yield message

    def get_message_listener(self) -> MessageListener | None:
        return self.listener

    def set_message_listener(self, listener: MessageListener | None) -> None:
        """The listener runs on the session's listener thread; AUTO_ACKNOWLEDGE acknowledges
        after it returns, and a listener that raises gets the message again."""
        self.listener = listener
        session = self.session
        loop = session.io.loop
        if listener is None:
            session.io.call(lambda: self.core.set_message_listener(None))
            return
        executor = session._listener_executor()

        def run(message: Message) -> None:
            session._listener_thread = threading.get_ident()
            listener(message)

        async def on_message(message: Message) -> None:
            await loop.run_in_executor(executor, run, message)

        session.io.call(lambda: self.core.set_message_listener(on_message))

    def close(self) -> None:
        """Waits for a running listener; from the listener itself it closes once it returns."""
        if self.session._in_listener():
            asyncio.run_coroutine_threadsafe(self.core.close(), self.session.io.loop)
            return
        self.session.io.run(self.core.close())


class QueueBrowser:
    def __init__(self, session: Session, core: aio.QueueBrowser) -> None:
        self.session = session
        self.core = core

    def get_queue(self) -> Destination:
        return self.core.get_queue()

    def get_enumeration(self) -> list[Message]:
        return self.session.io.run(self.core.get_enumeration())

    def __iter__(self) -> Iterator[Message]:
        return iter(self.get_enumeration())

    def close(self) -> None:
        self.session.io.run(self.core.close())


def _runtime(function: Callable[[], T]) -> T:
    try:
        return function()
    except JMSException as exc:
        raise JMSRuntimeException(str(exc), exc.error_code) from exc


class JMSContext(MessageFactory):
    """JMS 2.0's simplified API; its methods raise JMSRuntimeException."""

    def __init__(self, connection: Connection, session: Session) -> None:
        self.connection = connection
        self.session = session
        self.auto_start = True
        self._producer: MessageProducer | None = None

    def _allows_pickle(self) -> bool:
        return self.session._allows_pickle()

    def create_producer(self) -> JMSProducer:
        if self._producer is None:
            self._producer = _runtime(lambda: self.session.create_producer(None))
        return JMSProducer(self._producer)

    def create_consumer(
        self, destination: Destination, message_selector: str | None = None, no_local: bool = False
    ) -> JMSConsumer:
        consumer = _runtime(
            lambda: self.session.create_consumer(destination, message_selector, no_local)
        )
        if self.auto_start:
            _runtime(self.connection.start)
        return JMSConsumer(consumer)

    def create_browser(self, queue: Queue, message_selector: str | None = None) -> QueueBrowser:
        return _runtime(lambda: self.session.create_browser(queue, message_selector))

    def create_temporary_queue(self) -> TemporaryQueue:
        return _runtime(self.session.create_temporary_queue)

    def create_temporary_topic(self) -> TemporaryTopic:
        return _runtime(self.session.create_temporary_topic)

    def commit(self) -> None:
        _runtime(self.session.commit)

    def rollback(self) -> None:
        _runtime(self.session.rollback)

    def recover(self) -> None:
        _runtime(self.session.recover)

    def acknowledge(self) -> None:
        _runtime(self.session.acknowledge)

    def get_client_id(self) -> str | None:
        return self.connection.get_client_id()

    def close(self) -> None:
        _runtime(self.connection.close)

    def __enter__(self) -> JMSContext:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class JMSProducer(ProducerSettings):
    """Settings chain; ``send(destination, body)`` takes a Message, str, bytes or dict."""

    def __init__(self, producer: MessageProducer) -> None:
        super().__init__()
        self.producer = producer

    def send(
        self, destination: Destination, body: Message | str | bytes | dict[str, Any] | None
    ) -> JMSProducer:
        message = self.message_of(body)
        self.producer.set_delivery_delay(self.delivery_delay)
        _runtime(
            lambda: self.producer.send(
                message,
                destination,
                delivery_mode=self.delivery_mode,
                priority=self.priority,
                time_to_live=self.time_to_live,
            )
        )
        return self


class JMSConsumer:
    def __init__(self, consumer: MessageConsumer) -> None:
        self.consumer = consumer

    def receive(self, timeout: float | None = None) -> Message | None:
        return _runtime(lambda: self.consumer.receive(timeout))

    def receive_no_wait(self) -> Message | None:
        return _runtime(self.consumer.receive_no_wait)

    def receive_body(self, timeout: float | None = None) -> Any:
        message = self.receive(timeout)
        return None if message is None else message.get_body()

    def set_message_listener(self, listener: MessageListener | None) -> None:
        _runtime(lambda: self.consumer.set_message_listener(listener))

    def close(self) -> None:
        _runtime(self.consumer.close)
