"""Micro-benchmark of TopicTree.match: prints matches/s for an IoT-shaped set of filters.

A standalone script, not a test: `python3 bench/bench_topic_tree.py [--filters 10000]`.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

# Run from a checkout without installing: make src/ importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from kittiwake.broker.topic_tree import TopicTree

METRICS = ("temp", "humidity", "co2", "battery", "status")


def build_filters(count: int, rng: random.Random) -> list[str]:
    """Mostly literal per-device filters, some '+' and '#', a few catch-alls: a realistic mix."""
    sites, devices = 100, max(1, count // 50)
    out: list[str] = ["#", "+/+/temp", "$SYS/#"]
    while len(out) < count:
        site, dev, metric = rng.randrange(sites), rng.randrange(devices), rng.choice(METRICS)
        roll = rng.random()
        if roll < 0.70:
            out.append(f"site{site}/dev{dev}/{metric}")
        elif roll < 0.90:
            out.append(f"site{site}/dev{dev}/+")
        elif roll < 0.99:
            out.append(f"site{site}/+/{metric}")
        else:
            out.append(f"site{site}/#")
    return out


def build_topics(count: int, filters: int, rng: random.Random) -> list[str]:
    devices = max(1, filters // 50)
    return [
        f"site{rng.randrange(100)}/dev{rng.randrange(devices)}/{rng.choice(METRICS)}"
        for _ in range(count)
    ]


def rate(tree: TopicTree[int], topics: list[str], seconds: float) -> tuple[float, float]:
    """Matches per second over at least `seconds`, and the mean number of values returned."""
    done = fanout = 0
    start = time.perf_counter()
    while True:
        for topic in topics:
            fanout += len(tree.match(topic))
        done += len(topics)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return done / elapsed, fanout / done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--filters", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    filters = build_filters(args.filters, rng)
    # Cold: 50k distinct topics against no cache, so every match walks the trie.
    cold_topics = build_topics(50_000, args.filters, rng)
    # Hot: 1k distinct topics repeated, which fit the default 4096-entry cache.
    hot_topics = build_topics(1_000, args.filters, rng)

    uncached: TopicTree[int] = TopicTree(cache_size=0)
    cached: TopicTree[int] = TopicTree()
    start = time.perf_counter()
    for i, topic_filter in enumerate(filters):
        uncached.insert(topic_filter, i)
        cached.insert(topic_filter, i)
    build_s = (time.perf_counter() - start) / 2

    walk_rate, walk_fanout = rate(uncached, cold_topics, args.seconds)
    hot_rate, hot_fanout = rate(cached, hot_topics, args.seconds)

    # Churn: a literal and a wildcard subscribe/unsubscribe between every 100 publishes.
    churn_done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        for i in range(0, len(hot_topics), 100):
            cached.insert(f"site{i}/dev{i}/temp", -1)
            cached.insert(f"site{i}/+/temp", -2)
            for topic in hot_topics[i : i + 100]:
                cached.match(topic)
            cached.remove(f"site{i}/dev{i}/temp", -1)
            cached.remove(f"site{i}/+/temp", -2)
        churn_done += len(hot_topics)
    churn_rate = churn_done / (time.perf_counter() - start)

    print(f"python {sys.version.split()[0]}, {len(filters)} filters, built in {build_s:.3f} s")
    print(f"trie walk, no cache : {walk_rate:>12,.0f} matches/s (mean fan-out {walk_fanout:.2f})")
    print(f"hot topics, cached  : {hot_rate:>12,.0f} matches/s (mean fan-out {hot_fanout:.2f})")
    print(f"cached + sub churn  : {churn_rate:>12,.0f} matches/s")


if __name__ == "__main__":
    main()
