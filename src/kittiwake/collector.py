"""The garbage collector's policy for a serving process: what the broker builds to keep (its
subscriptions, sessions) is moved out of the collector's sight as it grows. Reads the broker's
size only; never changes broker state.

A full collection walks every tracked object. A broker subscribing a million filters holds
millions of them, and while it grows CPython's rule (a full pass once a quarter more objects
have survived) runs passes over the whole heap, each stopping the loop for its duration.
``gc.freeze()`` moves every tracked object to the permanent generation in constant time, so
later passes walk only what was built since. Its price: a cycle frozen alive and broken later
is never collected. The broker's per-subscription structures hold no cycles once removed
(only a connection's objects do, a few dozen per connection), and freezes are spaced by
growth of the high-water mark (at least ``STEP`` and a tenth of the size), so their number
grows with the logarithm of the largest size ever reached, never with churn.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

# Growth in long-lived items (subscriptions, sessions) that triggers a freeze, at the least.
STEP = 50_000
# ... and at the least this fraction of the size frozen last time.
GROWTH = 0.10


class CollectorPolicy:
    """Freezes the heap each time ``size()`` has grown a step past its last freeze."""

    __slots__ = ("_frozen_at", "_size", "freezes")

    def __init__(self, size: Callable[[], int]) -> None:
        self._size = size
        # The size at the last freeze: the high-water mark that growth is counted from.
        self._frozen_at = 0
        self.freezes = 0

    def check(self) -> None:
        """Called periodically (a second or so): freeze if the broker grew enough."""
        size = self._size()
        frozen_at = self._frozen_at
        if size - frozen_at < max(STEP, int(frozen_at * GROWTH)):
            return
        # The young generations' garbage first (cheap): what is frozen should be alive.
        gc.collect(1)
        gc.freeze()
        self._frozen_at = size
        self.freezes += 1
