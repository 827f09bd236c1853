"""Which publications the journal keeps for the data pipeline: the operator's topic filters.

Pure and thread-safe to share (its cache only ever gains entries); must never touch disk.
"""

from __future__ import annotations

from kittiwake.broker.topics import MAX_CACHED_TOPIC_CHARS, topic_matches

# Topics remembered per cache before it starts over (a topic's answer is cheap to recompute).
_CACHE_SIZE = 4096


class JournalSelection:
    """The journal's choice: persistent publications (MQTT QoS 1/2, JMS PERSISTENT) on
    ``persistent_topics`` and non-persistent ones (MQTT QoS 0, JMS NON_PERSISTENT, which
    arrives at QoS 1 but is never written toward the store) on ``qos0_topics``, while
    ``enabled`` (a retention is set); nothing otherwise.

    One rule, :meth:`keeps`, by persistence and never by QoS: the writer asks it per
    publication; the reader asks it again per row (by the row's ``persistent`` column), so a
    row another reason wrote (a message two queues share, or one an earlier selection kept) is
    never served as journal content, and every row the writer kept for the current selection
    is.
    """

    def __init__(
        self,
        *,
        enabled: bool,
        persistent_topics: tuple[str, ...] = ("#",),
        qos0_topics: tuple[str, ...] = (),
    ) -> None:
        self.enabled = enabled
        self.persistent_topics = persistent_topics if enabled else ()
        self.qos0_topics = qos0_topics if enabled else ()
        # "#" is the default: answer without matching (the writer asks once per publication).
        self._every_persistent = "#" in self.persistent_topics
        # The broker's QoS 0 path consults the store only when this is true.
        self.keeps_qos0 = bool(self.qos0_topics)
        # The default selection: readers may then filter rows in SQL (by their persistent
        # column) instead of one by one.
        self.keeps_every_persistent_only = set(self.persistent_topics) == {"#"} and not (
            self.keeps_qos0
        )
        self._persistent_cache: dict[str, bool] = {}
        self._qos0_cache: dict[str, bool] = {}

    def keeps(self, topic: str, persistent: bool) -> bool:
        """Whether a publication on ``topic`` belongs in the journal: ``persistent`` is the
        message's persistence (a journal row's ``persistent`` column), not its QoS."""
        if persistent:
            if self._every_persistent and not topic.startswith("$"):
                return True
            return _matches(self._persistent_cache, self.persistent_topics, topic)
        return self.keeps_qos0 and _matches(self._qos0_cache, self.qos0_topics, topic)


def _matches(cache: dict[str, bool], filters: tuple[str, ...], topic: str) -> bool:
    answer = cache.get(topic)
    if answer is None:
        answer = any(topic_matches(topic_filter, topic) for topic_filter in filters)
        if len(topic) <= MAX_CACHED_TOPIC_CHARS:
            if len(cache) >= _CACHE_SIZE:
                cache.clear()
            cache[topic] = answer
    return answer
