"""A put's rows as the broker's messages, without a server: the descriptor and answer, the
schema a put may have, its bounds, topic checks and publish rights, and the defaults of rows
that leave qos, retain or properties out.
"""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")

from kittiwake.flight.protocol import (  # noqa: E402
    PROPERTIES_TYPE,
    RequestError,
    WriteAnswer,
    WriteRequest,
    check_write_schema,
    commit_writes_body,
    parse_commit_writes,
)
from kittiwake.flight.writes import (  # noqa: E402
    WriteRefused,
    WriteTooLarge,
    read_rows,
    rows_of,
)


def batch(**columns: object) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(columns)


def allow_all(topic: str) -> bool:
    return True


def test_descriptor_and_answer_round_trip() -> None:
    request = WriteRequest("0b7c0b2e-6b1a-4b0e-9a51-1d8f4f7c2d11", 12, 3)
    assert WriteRequest.from_descriptor(request.to_descriptor()) == request
    answer = WriteAnswer(40, True)
    assert WriteAnswer.from_bytes(answer.to_bytes()) == answer
    # A body without "finished" (an older sender's) commits batches; it finishes nothing.
    assert parse_commit_writes(b'{"writer": "q", "batch": 4}') == ("q", 4, False)
    assert parse_commit_writes(commit_writes_body("q", 0, True)) == ("q", 0, True)
    assert parse_commit_writes(commit_writes_body("q", 7)) == ("q", 7, False)
    with pytest.raises(RequestError, match="finished must be true or false"):
        parse_commit_writes(b'{"writer": "q", "batch": 4, "finished": 1}')


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (b"nope", "not a JSON document"),
        (b'{"writer": "q", "batch": 0}', "partition must be an integer"),
        (b'{"writer": "q", "batch": -1, "partition": 0}', "batch must be an integer >= 0"),
        (b'{"writer": "", "batch": 0, "partition": 0}', "writer id"),
        (b'{"writer": "a/b", "batch": 0, "partition": 0}', "writer id"),
        (b'{"writer": "q", "batch": 0, "partition": 0, "x": 1}', "unknown fields"),
    ],
)
def test_a_malformed_descriptor_is_refused(command: bytes, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        WriteRequest.from_descriptor(command)


def test_rows_become_messages_with_defaults() -> None:
    rows = batch(topic=["a/1", "a/2"], payload=[b"x", None])
    got = rows_of(rows, allow_all).messages()
    assert [(m.topic, m.payload, m.qos, m.retain, m.persistent, m.mqtt5) for m in got] == [
        ("a/1", b"x", 1, False, True, None),
        ("a/2", b"", 1, False, True, None),
    ]


def test_qos_retain_and_properties_are_taken_per_row() -> None:
    rows = pa.RecordBatch.from_arrays(
        [
            pa.array(["s/1", "s/2", "s/3"]),
            pa.array(["text", "é", ""]),
            pa.array([0, 2, None], pa.int64()),
            pa.array([True, None, False]),
            pa.array([[("k", "v")], None, []], PROPERTIES_TYPE),
        ],
        names=["topic", "payload", "qos", "retain", "properties"],
    )
    got = rows_of(rows, allow_all).messages()
    assert [(m.payload, m.qos, m.persistent, m.retain) for m in got] == [
        (b"text", 0, False, True),
        ("é".encode(), 2, True, False),
        (b"", 1, True, False),
    ]
    assert got[0].mqtt5 is not None and got[0].mqtt5.user_properties == [("k", "v")]
    assert got[1].mqtt5 is None and got[2].mqtt5 is None


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"payload": [b"x"]}, "needs a 'topic' column"),
        ({"topic": ["a"]}, "needs a 'payload' column"),
        ({"topic": ["a"], "payload": [b"x"], "qoss": [1]}, "takes the columns"),
        ({"topic": [1], "payload": [b"x"]}, "column 'topic' has type int64"),
        ({"topic": ["a"], "payload": [b"x"], "retain": [1]}, "column 'retain'"),
    ],
)
def test_a_schema_a_write_cannot_take_is_refused(
    columns: dict[str, list[object]], message: str
) -> None:
    with pytest.raises(RequestError, match=message):
        check_write_schema(batch(**columns).schema)
    with pytest.raises(RequestError, match=message):
        read_rows([], batch(**columns).schema, allow_all, max_rows=10, max_bytes=10_000)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (batch(topic=["a/+"], payload=[b"x"]), "cannot publish to 'a/\\+'"),
        (batch(topic=[""], payload=[b"x"]), "cannot publish to ''"),
        (batch(topic=[None], payload=[b"x"]), "must not be null"),
        (batch(topic=["a"], payload=[b"x"], qos=[3]), "qos must be 0, 1 or 2"),
    ],
)
def test_bad_rows_are_refused(rows: pa.RecordBatch, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        rows_of(rows, allow_all).messages()


def test_a_topic_the_caller_may_not_publish_to_is_refused() -> None:
    rows = batch(topic=["open/1", "secret/1"], payload=[b"x", b"y"])
    with pytest.raises(WriteRefused, match="'secret/1' is not authorised"):
        rows_of(rows, lambda topic: not topic.startswith("secret/"))


def test_a_put_is_read_whole_and_past_its_bounds_refused_with_what_to_do() -> None:
    rows = batch(topic=["a/1", "a/2"] * 5, payload=[b"x" * 10] * 10)
    checked: list[str] = []

    def may_publish(topic: str) -> bool:
        checked.append(topic)
        return True

    got = read_rows([rows, rows], rows.schema, may_publish, max_rows=20, max_bytes=10_000)
    assert got.topics == ["a/1", "a/2"] * 10
    assert sorted(checked) == ["a/1", "a/2"], "each topic is checked once per put"
    with pytest.raises(WriteTooLarge, match=r"at most 15 rows.*repartition"):
        read_rows([rows, rows], rows.schema, allow_all, max_rows=15, max_bytes=10_000)
    with pytest.raises(WriteTooLarge, match="max_put_bytes"):
        read_rows(
            [rows, rows], rows.schema, allow_all, max_rows=100, max_bytes=rows.nbytes + 1
        )


def test_the_bound_stops_reading_at_the_first_batch_past_it() -> None:
    rows = batch(topic=["a"] * 10, payload=[b"x"] * 10)
    taken: list[int] = []

    def stream() -> object:
        for n in range(1000):
            taken.append(n)
            yield rows

    with pytest.raises(WriteTooLarge):
        read_rows(stream(), rows.schema, allow_all, max_rows=25, max_bytes=10**9)  # type: ignore[arg-type]
    assert taken == [0, 1, 2]


def test_a_put_of_several_batches_becomes_one_unit_of_columns_summarised_right() -> None:
    """The columns of every batch in order; the unit's QoS is uniform only if every batch's
    is; retained and properties are noticed in any batch, the properties column padded."""
    plain = batch(topic=["a/1", "a/2"], payload=[b"x", b"y"])
    other_qos = pa.RecordBatch.from_arrays(
        [pa.array(["a/2", "a/3"]), pa.array([b"z", b"w"]), pa.array([2, 2], pa.int32())],
        names=["topic", "payload", "qos"],
    )
    retained_with_pairs = pa.RecordBatch.from_arrays(
        [
            pa.array(["a/1"]),
            pa.array([b"r"]),
            pa.array([True]),
            pa.array([[("k", "v")]], PROPERTIES_TYPE),
        ],
        names=["topic", "payload", "retain", "properties"],
    )
    same = read_rows([plain, plain], plain.schema, allow_all, 100, 10_000)
    assert same.uniform_qos == 1 and not same.any_retained and same.user_properties is None
    assert same.topics == ["a/1", "a/2", "a/1", "a/2"] and same.retain == [False] * 4
    assert list(same.distinct_topics) == ["a/1", "a/2"]

    mixed = read_rows([plain, other_qos], plain.schema, allow_all, 100, 10_000)
    assert mixed.uniform_qos is None and mixed.qos == [1, 1, 2, 2]
    assert mixed.payloads == [b"x", b"y", b"z", b"w"]
    assert list(mixed.distinct_topics) == ["a/1", "a/2", "a/3"]

    last = read_rows([plain, retained_with_pairs], plain.schema, allow_all, 100, 10_000)
    assert last.any_retained and last.retain == [False, False, True]
    assert last.user_properties == [None, None, [("k", "v")]]
    assert [(m.topic, m.payload, m.retain) for m in last.messages()] == [
        ("a/1", b"x", False),
        ("a/2", b"y", False),
        ("a/1", b"r", True),
    ]
    assert last.messages()[2].mqtt5 is not None
