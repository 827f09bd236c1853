"""The JMS scenarios (issues 11 and 12): what is sent, how, to how many consumers. Every
scenario is bounded in count and in time; ``--smoke`` swaps in a few hundred messages.

Messages are 100-byte text messages (TextMessage; an AMQP string body through proton) whose
first 16 characters carry the send time (``time.monotonic_ns()`` in hex; Java's
``System.nanoTime()`` reads the same clock on Linux).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

BODY_CHARS = 100
COMMIT_EVERY = 100  # the transacted scenario's batch, on both sides


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    kind: str  # "queue" or "topic"
    persistent: bool
    # Each send waits for the broker's acknowledgement (JMS PERSISTENT outside a transaction;
    # proton: one unsettled delivery at a time).
    sync_send: bool = False
    transacted: bool = False  # producer and consumer commit every COMMIT_EVERY messages
    consumers: int = 1
    count: int = 0  # messages the one producer sends

    @property
    def deliveries(self) -> int:
        return self.count * self.consumers


FULL: list[Scenario] = [
    Scenario("queue-persistent-sync", "queue, PERSISTENT, synchronous sends, 1 -> 1",
             kind="queue", persistent=True, sync_send=True, count=10_000),
    Scenario("queue-nonpersistent", "queue, NON_PERSISTENT, 1 -> 1",
             kind="queue", persistent=False, count=100_000),
    Scenario("queue-persistent-tx", f"queue, PERSISTENT, transacted (commit every "
             f"{COMMIT_EVERY}, producer and consumer), 1 -> 1",
             kind="queue", persistent=True, transacted=True, count=50_000),
    Scenario("topic-nonpersistent-1to10", "topic, NON_PERSISTENT, 1 -> 10 consumers",
             kind="topic", persistent=False, consumers=10, count=20_000),
]

SMOKE_COUNTS = {
    "queue-persistent-sync": 200, "queue-nonpersistent": 500, "queue-persistent-tx": 250,
    "topic-nonpersistent-1to10": 100,
}


def select(names: list[str] | None, *, smoke: bool, scale: float) -> list[Scenario]:
    known = {s.name for s in FULL}
    for name in names or []:
        if name not in known:
            raise SystemExit(f"unknown scenario {name!r}; known: {', '.join(sorted(known))}")
    chosen = []
    for s in FULL:
        if names and s.name not in names:
            continue
        count = SMOKE_COUNTS[s.name] if smoke else max(1, int(s.count * scale))
        chosen.append(replace(s, count=count))
    return chosen


def body(send_ns: int) -> str:
    """A 100-character text body stamped with its send time."""
    return f"{send_ns:016x}" + "x" * (BODY_CHARS - 16)


def sent_ns(text: str) -> int:
    try:
        return int(text[:16], 16)
    except (TypeError, ValueError):
        return 0
