"""The ``kittiwake`` data source's options, parsed and checked once (named and behaving like the
Kafka source's where one exists), for reading and for writing; and the split of an offset range
into Spark partitions.

Pure: no Spark, no network; unit tests drive it with dictionaries.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from kittiwake.flight.protocol import (
    DEFAULT_WRITE_QOS,
    PARTITION,
    RequestError,
    check_writer_id,
    parse_topics,
)

# Kafka's markers inside a JSON offsets document.
EARLIEST = -2
LATEST = -1
DEFAULT_URL = "grpc://127.0.0.1:8815"
# How long a read or an offset query keeps retrying while the broker cannot be reached (a
# restart): then the query fails. Ranges are exact, so a retried read resumes where it stopped.
DEFAULT_RETRY_TIMEOUT_MS = 60_000

_KNOWN = {
    "url",
    "topics",
    "startingoffsets",
    "endingoffsets",
    "startingtimestamp",
    "maxoffsetspertrigger",
    "minpartitions",
    "failondataloss",
    "includeheaders",
    "retrytimeoutms",
    "token",
    "username",
    "password",
}


# A sink's options: the connection's, and the defaults of rows without a qos or retain column.
_SINK_KNOWN = {
    "url",
    "retrytimeoutms",
    "token",
    "username",
    "password",
    "qos",
    "retain",
    "writeid",
}
# Options Spark itself hands a streaming sink along with the user's: not ours to check.
_SPARK_SINK_OPTIONS = {"checkpointlocation", "queryname", "path"}


class OptionError(ValueError):
    """An option the data source cannot use; the message names it and says what is allowed."""


class ConnectionOptions(Protocol):
    """Where the flight listener is and who is calling (reads and writes alike)."""

    @property
    def url(self) -> str: ...
    @property
    def retry_timeout_ms(self) -> int: ...
    @property
    def token(self) -> str | None: ...
    @property
    def username(self) -> str | None: ...
    @property
    def password(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class SourceOptions:
    url: str = DEFAULT_URL
    topics: tuple[str, ...] = ("#",)
    # "earliest", "latest" or the offset of partition 0 (None: the mode's default).
    starting: str | int | None = None
    ending: str | int = "latest"
    # endingOffsets was given: a batch read's end; a stream refuses it (as Kafka's does).
    ending_given: bool = False
    starting_timestamp_ms: int | None = None
    max_offsets_per_trigger: int | None = None
    min_partitions: int = 1
    fail_on_data_loss: bool = True
    include_headers: bool = False
    retry_timeout_ms: int = DEFAULT_RETRY_TIMEOUT_MS
    token: str | None = None
    username: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        # Spark hands options over case-insensitively (keys may arrive lower-cased).
        lowered = {key.lower(): value for key, value in options.items()}
        unknown = sorted(set(lowered) - _KNOWN - {"path"})
        if unknown:
            raise OptionError(
                f"unknown option {unknown[0]!r} for format kittiwake; known: {sorted(_KNOWN)}"
            )
        url = _url(lowered)
        try:
            topics = parse_topics(lowered.get("topics", "#"))
        except RequestError as exc:
            raise OptionError(f"topics: {exc}") from None
        return cls(
            url=url,
            topics=topics,
            starting=_offset_spec(lowered.get("startingoffsets"), "startingOffsets", None),
            ending=_offset_spec(lowered.get("endingoffsets"), "endingOffsets", "latest")
            or "latest",
            ending_given="endingoffsets" in lowered,
            starting_timestamp_ms=_optional_int(lowered, "startingtimestamp", "startingTimestamp"),
            max_offsets_per_trigger=_optional_int(
                lowered, "maxoffsetspertrigger", "maxOffsetsPerTrigger", minimum=1
            ),
            min_partitions=_optional_int(lowered, "minpartitions", "minPartitions", minimum=1) or 1,
            fail_on_data_loss=_bool(lowered, "failondataloss", "failOnDataLoss", True),
            include_headers=_bool(lowered, "includeheaders", "includeHeaders", False),
            retry_timeout_ms=_optional_int(lowered, "retrytimeoutms", "retryTimeoutMs")
            or DEFAULT_RETRY_TIMEOUT_MS,
            token=lowered.get("token"),
            username=lowered.get("username"),
            password=lowered.get("password"),
        )


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """``df.write`` / ``df.writeStream.format("kittiwake")``."""

    url: str = DEFAULT_URL
    retry_timeout_ms: int = DEFAULT_RETRY_TIMEOUT_MS
    token: str | None = None
    username: str | None = None
    password: str | None = None
    # What a row without a qos / retain column (or with a null in it) gets.
    qos: int = DEFAULT_WRITE_QOS
    retain: bool = False
    # A batch write's writer id (None: a fresh one per write); streams use their query id.
    write_id: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        lowered = {key.lower(): value for key, value in options.items()}
        unknown = sorted(set(lowered) - _SINK_KNOWN - _SPARK_SINK_OPTIONS)
        if unknown:
            raise OptionError(
                f"unknown option {unknown[0]!r} for writing format kittiwake; "
                f"known: {sorted(_SINK_KNOWN)}"
            )
        qos = _optional_int(lowered, "qos", "qos")
        if qos is not None and qos > 2:
            raise OptionError(f"qos must be 0, 1 or 2, got {qos}")
        write_id = lowered.get("writeid")
        if write_id is not None:
            try:
                check_writer_id(write_id)
            except RequestError as exc:
                raise OptionError(f"writeId: {exc}") from None
        return cls(
            url=_url(lowered),
            retry_timeout_ms=_optional_int(lowered, "retrytimeoutms", "retryTimeoutMs")
            or DEFAULT_RETRY_TIMEOUT_MS,
            token=lowered.get("token"),
            username=lowered.get("username"),
            password=lowered.get("password"),
            qos=DEFAULT_WRITE_QOS if qos is None else qos,
            retain=_bool(lowered, "retain", "retain", False),
            write_id=write_id,
        )


def _url(options: Mapping[str, str]) -> str:
    url = options.get("url", DEFAULT_URL)
    if not url.startswith(("grpc://", "grpc+tcp://", "grpc+tls://")):
        raise OptionError(f"url {url!r} must be grpc://host:port (the flight listener)")
    return url


def split_range(start: int, end: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) in ``parts`` consecutive ranges of near-equal width (fewer when the range
    is narrower). Depends on its arguments alone, so a replayed batch splits the same way."""
    width = end - start
    if width <= 0:
        return []
    parts = max(1, min(parts, width))
    bounds = [start + (width * i) // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts)]


def _offset_spec(value: str | None, name: str, default: str | None) -> str | int | None:
    """'earliest', 'latest', or a JSON document {"0": offset} (-2 earliest, -1 latest)."""
    if value is None:
        return default
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict) or set(doc) != {str(PARTITION)}:
        raise OptionError(
            f'{name} must be "earliest", "latest" or JSON like {{"{PARTITION}": 42}} '
            f"(one journal, partition {PARTITION}); got {value!r}"
        )
    offset = doc[str(PARTITION)]
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
        raise OptionError(f"{name}: {offset!r} is not an offset (-2 earliest, -1 latest, >= 0)")
    if offset == EARLIEST:
        return "earliest"
    if offset == LATEST:
        return "latest"
    return offset


def _optional_int(options: Mapping[str, str], key: str, name: str, minimum: int = 0) -> int | None:
    value = options.get(key)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise OptionError(f"{name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise OptionError(f"{name} must be at least {minimum}, got {number}")
    return number


def _bool(options: Mapping[str, str], key: str, name: str, default: bool) -> bool:
    value = options.get(key)
    if value is None:
        return default
    lowered = str(value).strip().lower()
    if lowered not in ("true", "false"):
        raise OptionError(f"{name} must be true or false, got {value!r}")
    return lowered == "true"
