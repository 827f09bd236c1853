"""Admission of new connections by client address, for every listener kind: at most
``max_connections_per_address`` open at once from one address, and new ones from it at most
``max_connection_rate`` per second (a token bucket holding one second's worth). Bookkeeping on
the loop only; knows no protocol (front ends turn a refusal into their own answer); its memory
stays bounded whatever addresses connect.
"""

from __future__ import annotations

from enum import Enum

from kittiwake.clock import Clock
from kittiwake.config import LimitsConfig

# Buckets kept before full ones (addresses quiet for a second or more) are forgotten.
_PRUNE_AT = 4096


class AdmissionRefusal(Enum):
    """Why a connection was not admitted; front ends map these to their reason codes."""

    RATE = "connection rate exceeded for this address"
    QUOTA = "too many connections from this address"


class ConnectionAdmission:
    """Open connections and recent arrivals per address."""

    __slots__ = ("_buckets", "_clock", "_open", "per_address", "rate")

    def __init__(self, limits: LimitsConfig, clock: Clock) -> None:
        self.per_address = limits.max_connections_per_address
        self.rate = limits.max_connection_rate
        self._clock = clock
        self._open: dict[str, int] = {}
        # address -> (tokens left, when last counted)
        self._buckets: dict[str, tuple[float, float]] = {}

    def admit(self, address: str) -> AdmissionRefusal | None:
        """Count a new connection from ``address`` in, or say why not (then it is not
        counted and :meth:`release` must not be called for it)."""
        rate = self.rate
        if rate:
            now = self._clock.now()
            tokens, stamp = self._buckets.get(address, (rate, now))
            tokens = min(rate, tokens + (now - stamp) * rate)
            if tokens < 1:
                self._buckets[address] = (tokens, now)
                return AdmissionRefusal.RATE
            if self.per_address and self._open.get(address, 0) >= self.per_address:
                return AdmissionRefusal.QUOTA
            if len(self._buckets) >= _PRUNE_AT and address not in self._buckets:
                self._prune(now)
            self._buckets[address] = (tokens - 1, now)
        elif self.per_address and self._open.get(address, 0) >= self.per_address:
            return AdmissionRefusal.QUOTA
        self._open[address] = self._open.get(address, 0) + 1
        return None

    def release(self, address: str) -> None:
        """An admitted connection from ``address`` ended."""
        count = self._open.get(address, 0) - 1
        if count > 0:
            self._open[address] = count
        else:
            self._open.pop(address, None)

    def open_from(self, address: str) -> int:
        return self._open.get(address, 0)

    def _prune(self, now: float) -> None:
        """Forget full buckets: an address quiet for a second is as good as new."""
        rate = self.rate
        self._buckets = {
            address: (tokens, stamp)
            for address, (tokens, stamp) in self._buckets.items()
            if tokens + (now - stamp) * rate < rate
        }
