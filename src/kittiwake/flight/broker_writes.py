"""The crossing from the Flight service's gRPC threads to the broker's event loop: a put's
messages and a writer's commit are handed to the loop, applied there by the core in one loop
turn, and waited for until durable. The one place a gRPC thread reaches the core; it never
touches the broker's state or the store itself. Imports no pyarrow.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from kittiwake.broker.completion import Completion
from kittiwake.broker.fenced_writes import FencedWrites
from kittiwake.broker.message import Message
from kittiwake.broker.publication_rows import PublicationRows

# How long a gRPC thread waits for the core's answer before giving up on the call (the
# caller retries; the unit is fenced, so a retry never publishes twice).
DEFAULT_ANSWER_TIMEOUT = 60.0

T = TypeVar("T")


class WriteUnanswered(Exception):
    """The core did not confirm a write in time (it may still be applied: retry the unit)."""


class WriteFailed(Exception):
    """The store could not commit a write: nothing of it was kept (retry the unit)."""


class BrokerWrites:
    """Fenced writes and commits, applied on ``loop``; called from any other thread."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        fenced: FencedWrites,
        answer_timeout: float = DEFAULT_ANSWER_TIMEOUT,
    ) -> None:
        self._loop = loop
        self._fenced = fenced
        self.answer_timeout = answer_timeout

    def write(
        self,
        writer: str,
        batch: int,
        partition: int,
        messages: Sequence[Message] | PublicationRows,
    ) -> bool:
        """Publish the unit once; True when it had been taken before (nothing published)."""

        async def apply() -> bool:
            # Runs whole in the task's first step: one loop turn, so one store commit.
            outcome = self._fenced.write(writer, batch, partition, messages)
            await _durable(outcome.completion)
            return outcome.already_committed

        return self._wait(apply())

    def commit(self, writer: str, batch: int, *, finished: bool = False) -> None:
        """Every batch of ``writer`` up to ``batch`` is committed (``finished``: and the
        writer never writes again)."""

        async def apply() -> None:
            await _durable(self._fenced.commit_batch(writer, batch, finished=finished))

        self._wait(apply())

    def _wait(self, work: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(work, self._loop)
        try:
            return future.result(self.answer_timeout)
        except concurrent.futures.TimeoutError:
            raise WriteUnanswered(
                f"the broker did not confirm the write within {self.answer_timeout:g}s"
            ) from None


async def _durable(completion: Completion) -> None:
    if completion is None:
        return
    try:
        # Shielded: the commit future is shared by every operation of its batch, and a
        # cancelled wait here must not cancel it for them.
        await asyncio.shield(completion)
    except Exception as exc:
        raise WriteFailed(f"the broker could not store the write: {exc}") from exc
