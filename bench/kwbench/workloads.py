"""The workloads: what is published, by how many, to how many, how fast.

Counts are per publisher connection; every workload is bounded in count and in time. The full
sizes keep a whole three-broker run under ten minutes on two cores; ``--scale`` multiplies the
counts, ``--smoke`` swaps in a few hundred messages per workload.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    # "flow": publish/subscribe; "idle": many idle connections; "retained": ``count``
    # retained messages, then a new subscriber to all of them
    kind: str = "flow"
    qos: int = 0
    pubs: int = 1
    subs: int = 1
    count: int = 0  # messages per publisher
    rate: float = 0.0  # messages/s per publisher; 0 = as fast as the broker accepts them
    clean: bool = True  # False: persistent sessions (clean session = 0)
    durable: bool = False  # brokers run with their durable store (restarted for it)
    conns: int = 0  # idle: connections to hold
    hold_s: float = 5.0  # idle: how long to hold them after all answered a PINGREQ
    pending: str = ""  # non-empty: skipped unless --include-pending, with this reason
    # A fleet (see wire.fleet_filter): this many filters over subscriber connections of
    # wire.FLEET_FILTERS_PER_CONN each, publications cycling over ``topics`` distinct topics
    # that each match one filter (so ``subs`` is derived). 0 = one topic, ``subs`` subscribers.
    filters: int = 0
    topics: int = 0

    @property
    def deliveries(self) -> int:
        if self.filters:
            return self.pubs * self.count
        return self.pubs * self.count * self.subs


FULL: list[Workload] = [
    Workload("qos0-1to1", "QoS 0, 1 publisher -> 1 subscriber", qos=0, count=200_000),
    Workload("qos1-1to1", "QoS 1, 1 publisher -> 1 subscriber", qos=1, count=50_000),
    Workload("qos0-10to1", "QoS 0 fan-in, 10 publishers -> 1 subscriber", qos=0, pubs=10,
             count=20_000),
    Workload("qos1-10to1", "QoS 1 fan-in, 10 publishers -> 1 subscriber", qos=1, pubs=10,
             count=5_000),
    Workload("qos0-1to50", "QoS 0 fan-out, 1 publisher -> 50 subscribers", qos=0, subs=50,
             count=4_000),
    Workload("qos1-1to50", "QoS 1 fan-out, 1 publisher -> 50 subscribers", qos=1, subs=50,
             count=1_000),
    Workload("paced-qos0", "latency: QoS 0 paced at 5,000 msg/s, 1 -> 1", qos=0,
             count=25_000, rate=5000.0),
    Workload("paced-qos1", "latency: QoS 1 paced at 5,000 msg/s, 1 -> 1", qos=1,
             count=25_000, rate=5000.0),
    # Persistent sessions (clean session 0) at QoS 1 with each broker's durable store on
    # (brokers.*.write_config with durable=True): kittiwake's SQLite store (fsync per group
    # commit), mosquitto's `persistence true` (periodic snapshots, not per message); amqtt has
    # no durable store and is skipped.
    Workload("qos1-persistent-1to1", "QoS 1, persistent sessions + durable store, 1 -> 1",
             qos=1, count=20_000, clean=False, durable=True),
    Workload("qos1-persistent-10to1",
             "QoS 1 fan-in, persistent sessions + durable store, 10 -> 1",
             qos=1, pubs=10, count=2_000, clean=False, durable=True),
    # Issue 17's fleet: a cached route for each topic is not a given (10,000 and 100,000
    # distinct topics), and a million filters report the broker's memory (broker_rss_kb).
    Workload("topics-10k", "QoS 0 over 10,000 filters and as many topics, 1 publisher",
             qos=0, count=200_000, filters=10_000, topics=10_000),
    Workload("topics-100k", "QoS 0 over 100,000 filters and as many topics, 1 publisher",
             qos=0, count=200_000, filters=100_000, topics=100_000),
    Workload("topics-1m", "QoS 0 over 1,000,000 filters, 200,000 topics, 1 publisher",
             qos=0, count=200_000, filters=1_000_000, topics=200_000,
             pending="a million subscriptions take minutes per broker: name it to run it"),
    # Retained messages served to a new subscriber as its window opens (issue 16): the time
    # to the first must not grow with how many there are.
    Workload("retained-100k", "100,000 retained QoS 0 messages on distinct topics, then a "
             "new subscriber to `#` over them", kind="retained", count=100_000),
    Workload("idle-conns", "idle connections with keepalive 60 s", kind="idle",
             conns=10_000, hold_s=5.0),
]

SMOKE_COUNTS = {
    "qos0-1to1": 300, "qos1-1to1": 300, "qos0-10to1": 30, "qos1-10to1": 30,
    "qos0-1to50": 6, "qos1-1to50": 6, "paced-qos0": 300, "paced-qos1": 300,
    "qos1-persistent-1to1": 300, "qos1-persistent-10to1": 30,
    "topics-10k": 2_000, "topics-100k": 2_000, "topics-1m": 2_000, "retained-100k": 2_000,
}


def select(names: list[str] | None, *, smoke: bool, scale: float, idle_conns: int | None,
           include_pending: bool) -> list[Workload]:
    chosen = []
    known = {w.name for w in FULL}
    for name in names or []:
        if name not in known:
            raise SystemExit(f"unknown workload {name!r}; known: {', '.join(sorted(known))}")
    for w in FULL:
        if names and w.name not in names:
            continue
        if w.pending and not include_pending and not (names and w.name in names):
            continue
        if smoke:
            w = replace(w, count=SMOKE_COUNTS.get(w.name, w.count),
                        conns=min(w.conns, 200) if w.kind == "idle" else 0, hold_s=0.5,
                        filters=min(w.filters, 10_000), topics=min(w.topics, 10_000))
        elif w.kind in ("flow", "retained"):
            w = replace(w, count=max(1, int(w.count * scale)))
        if w.kind == "idle" and idle_conns is not None:
            w = replace(w, conns=idle_conns)
        chosen.append(w)
    return chosen
