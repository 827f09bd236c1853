"""How long the store's commits take, as a fixed-bucket histogram the writer thread fills
(one plain update per committed group, never per message) and /metrics reads at scrape time.

Written by one thread only; a scrape may see a group's count before its sum (harmless)."""

from __future__ import annotations

# Upper bounds in seconds: an fsync on a good disk takes about a millisecond, a busy or
# networked one tens to hundreds.
COMMIT_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


class CommitTimes:
    """Commit durations: a count per bucket (the last one is +Inf), their sum and count."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...] = COMMIT_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.total = 0.0

    def record(self, seconds: float) -> None:
        index = 0
        for bound in self.bounds:
            if seconds <= bound:
                break
            index += 1
        self.counts[index] += 1
        self.total += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, commits at or below it) per bucket, +Inf last: Prometheus's shape."""
        result = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            result.append((bound, running))
        return result
