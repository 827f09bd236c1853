"""Topic rules (MQTT 5 §4.7, §4.8.2): what a topic name or filter may be, and what a filter matches.

Pure string functions; must never import a protocol (no MQTT packets) or hold any state.
"""

from __future__ import annotations

__all__ = [
    "MAX_CACHED_TOPIC_CHARS",
    "MAX_TOPIC_BYTES",
    "TopicError",
    "is_wildcard",
    "parse_shared",
    "topic_matches",
    "validate_topic_filter",
    "validate_topic_name",
]

# The wire carries topics behind a two-byte length, so no topic can be longer than this.
MAX_TOPIC_BYTES = 65535
# Per-topic caches (matches, verdicts, receivers) skip longer topics: answered, not remembered,
# so thousands of hostile 64 KiB topics cannot pin hundreds of MiB.
MAX_CACHED_TOPIC_CHARS = 1024

_SHARE_PREFIX = "$share/"
# Error messages quote the offending topic; a 64 KiB topic would drown the sentence.
_SHOW_CHARS = 80


class TopicError(ValueError):
    """A topic name, filter or shared-subscription filter the rules refuse.

    A ValueError so callers that only know "bad input" still catch it; the message is a whole
    sentence naming the rule broken, so front ends can pass it to users unchanged.
    """


def quoted_topic(text: str) -> str:
    """A topic for a log line or an error message: its repr, cut after a few dozen
    characters."""
    if len(text) > _SHOW_CHARS:
        return repr(text[:_SHOW_CHARS]) + "..."
    return repr(text)


_show = quoted_topic


def _check_common(text: str, kind: str, max_levels: int | None) -> None:
    """The rules names and filters share: non-empty, no NUL, well-formed UTF-8, bounded size."""
    if not text:
        raise TopicError(f"A {kind} must be at least one character long.")
    if "\0" in text:
        raise TopicError(f"The {kind} {_show(text)} contains the null character U+0000; remove it.")
    # ASCII: one byte a character and no surrogate, so nothing to encode.
    size = len(text) if text.isascii() else _utf8_size(text, kind)
    if size > MAX_TOPIC_BYTES:
        raise TopicError(
            f"The {kind} {_show(text)} is {size} bytes of UTF-8; the limit is {MAX_TOPIC_BYTES}."
        )
    if max_levels is not None:
        levels = text.count("/") + 1
        if levels > max_levels:
            raise TopicError(
                f"The {kind} {_show(text)} has {levels} levels; this broker allows at most "
                f"{max_levels}."
            )


def _utf8_size(text: str, kind: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        # Only lone surrogates fail to encode; the spec forbids U+D800..U+DFFF outright (§1.5.4).
        raise TopicError(
            f"The {kind} {_show(text)} is not well-formed UTF-8 (it holds a lone surrogate)."
        ) from None


def validate_topic_name(name: str, max_levels: int | None = None) -> None:
    """Refuse a topic name a publisher may not use; raises TopicError saying why.

    Topic names address one topic, so wildcards, which only make sense for subscribers, are out.
    """
    if (
        name.isascii()
        and 0 < len(name) <= MAX_TOPIC_BYTES
        and "\0" not in name
        and "+" not in name
        and "#" not in name
        and (max_levels is None or name.count("/") < max_levels)
    ):
        # The common case in one expression: a publisher on many topics validates on every
        # publication (its per-topic verdicts cannot hold them all), so the call is worth
        # saving. Any doubt takes the checks below, which say what is wrong.
        return
    _check_common(name, "topic name", max_levels)
    if "+" in name or "#" in name:
        raise TopicError(
            f"The topic name {_show(name)} contains a wildcard ('+' or '#'); wildcards are "
            "allowed in subscription filters only."
        )


def validate_topic_filter(topic_filter: str, max_levels: int | None = None) -> None:
    """Refuse a subscription filter the rules forbid; raises TopicError saying why.

    "$share/..." is an ordinary filter here: split it with :func:`parse_shared` first, so a
    shared filter's group is checked by its own rules and its filter by these.
    """
    if not (
        topic_filter.isascii()
        and 0 < len(topic_filter) <= MAX_TOPIC_BYTES
        and "\0" not in topic_filter
        and (max_levels is None or topic_filter.count("/") < max_levels)
    ):
        # The common checks in one expression first, as for topic names: a fleet subscribes
        # filter after filter. Any doubt takes the checks, which say what is wrong.
        _check_common(topic_filter, "topic filter", max_levels)
    if "#" not in topic_filter:
        if "+" not in topic_filter:
            return
        # Every '+' a whole level ("s/<device>/+", half a fleet's filters): as many "/+/" as
        # '+' once the filter has a '/' each side. Non-overlapping counts may miss one of
        # "+/+" (checked below, then), never count a '+' that is not a whole level.
        if f"/{topic_filter}/".count("/+/") == topic_filter.count("+"):
            return
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level:
            if level != "#":
                raise TopicError(
                    f"The topic filter {_show(topic_filter)} has '#' inside the level "
                    f"{_show(level)}; '#' must be a whole level on its own, as in 'a/#'."
                )
            if i != last:
                raise TopicError(
                    f"The topic filter {_show(topic_filter)} has '#' before its last level; "
                    "'#' may only be the last level, as in 'a/#'."
                )
        elif "+" in level and level != "+":
            raise TopicError(
                f"The topic filter {_show(topic_filter)} has '+' inside the level "
                f"{_show(level)}; '+' must be a whole level on its own, as in 'a/+/b'."
            )


def parse_shared(topic_filter: str) -> tuple[str | None, str]:
    """Split "$share/{group}/{filter}" into (group, filter); other filters give (None, filter).

    Only the group is checked here; the returned filter still needs validate_topic_filter.
    """
    if not topic_filter.startswith(_SHARE_PREFIX):
        # "$share" alone and "$sharefoo/x" are ordinary filters that merely start with '$'.
        return None, topic_filter
    group, slash, inner = topic_filter[len(_SHARE_PREFIX) :].partition("/")
    if not group:
        raise TopicError(
            f"The shared subscription {_show(topic_filter)} has an empty group name; write "
            "'$share/{group}/{filter}' with a non-empty group."
        )
    if "+" in group or "#" in group or "\0" in group:
        raise TopicError(
            f"The shared subscription group name {_show(group)} contains '+', '#' or U+0000; "
            "choose a group name without them."
        )
    if not slash or not inner:
        raise TopicError(
            f"The shared subscription {_show(topic_filter)} has no topic filter after its group; "
            "write '$share/{group}/{filter}'."
        )
    return group, inner


def topic_matches(topic_filter: str, topic_name: str) -> bool:
    """The reference matcher: slow and plainly correct, the oracle the topic tree is tested against.

    Assumes both arguments are valid. '+' is exactly one level, '#' is its parent level and
    everything below, levels may be empty, and a topic starting with '$' is invisible to a
    filter whose first level is a wildcard (§4.7.2) so "#" never sees "$SYS/...".
    """
    filter_levels = topic_filter.split("/")
    name_levels = topic_name.split("/")
    if topic_name.startswith("$") and filter_levels[0] in ("+", "#"):
        return False
    for i, level in enumerate(filter_levels):
        if level == "#":
            return True
        if i >= len(name_levels):
            return False
        if level != "+" and level != name_levels[i]:
            return False
    return len(filter_levels) == len(name_levels)


def is_wildcard(topic_filter: str) -> bool:
    """True when a (valid) filter can match more than the one topic spelled like it."""
    return "+" in topic_filter or "#" in topic_filter
