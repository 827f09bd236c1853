"""The console's throughput graphs: a small ring of per-second samples (messages and bytes in
and out, connections) taken from the broker's counters by one timer. Reads counters only;
adds nothing to the message path."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kittiwake.broker.broker import BrokerStats
from kittiwake.broker.periodic import run_every

# Five minutes of one-second samples.
SAMPLES_KEPT = 300


@dataclass(frozen=True, slots=True)
class Sample:
    """One second: what moved during it (rates) and the connections at its end."""

    time: float  # wall-clock seconds since the epoch
    messages_in: int
    messages_out: int
    bytes_in: int
    bytes_out: int
    connections: int


class Throughput:
    """Per-second samples of the last :data:`SAMPLES_KEPT` seconds, newest last."""

    def __init__(
        self,
        stats: BrokerStats,
        connections: Callable[[], int],
        # Seconds since the epoch (the broker clock's wall time): a sample's time stamp.
        wall_clock: Callable[[], float],
        kept: int = SAMPLES_KEPT,
    ) -> None:
        self._stats = stats
        self._connections = connections
        self._wall_clock = wall_clock
        self.samples: deque[Sample] = deque(maxlen=kept)
        self._last = self._totals()
        self._cancel: Callable[[], None] | None = None

    def _totals(self) -> tuple[int, int, int, int]:
        stats = self._stats
        return (
            stats.messages_received,
            stats.messages_sent,
            stats.bytes_received,
            stats.bytes_sent,
        )

    def sample(self) -> Sample:
        """Close the current second: the counters' growth since the last sample."""
        totals = self._totals()
        messages_in, messages_out, bytes_in, bytes_out = (
            max(0, now - before) for now, before in zip(totals, self._last, strict=True)
        )
        self._last = totals
        sample = Sample(
            self._wall_clock(),
            messages_in,
            messages_out,
            bytes_in,
            bytes_out,
            self._connections(),
        )
        self.samples.append(sample)
        return sample

    def start(self, loop: asyncio.AbstractEventLoop, interval: float = 1.0) -> None:
        self._last = self._totals()
        self._cancel = run_every(loop, interval, self.sample, "throughput sample")

    def stop(self) -> None:
        if self._cancel is not None:
            self._cancel()
            self._cancel = None
