"""The SQLite schema, version by version, and the steps that upgrade a database an older
Kittiwake wrote. Runs only at start-up, before the writer thread exists; never on the loop.

Each step runs in one transaction with the version bump, so a crash mid-upgrade leaves the
older version intact. A step is a list of SQL statements or a function of the connection.
"""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Callable
from typing import Any

from kittiwake.broker.message import Message, MessageProperties, MQTT5Fields
from kittiwake.broker.sessions import session_producer_name, session_queue_name
from kittiwake.store.codec import encode_properties, message_row

SCHEMA_VERSION = 9

Step = list[str] | Callable[[sqlite3.Connection], None]

# The message columns of the one message encoding (see kittiwake.store.codec.MESSAGE_COLUMNS),
# after message_id; nullable where a queue entry may leave the message to the journal.
_MESSAGE_COLUMNS_DDL = """
        topic TEXT{null},
        payload BLOB{null},
        qos INTEGER{null},
        retain INTEGER{null},
        persistent INTEGER{null},
        priority INTEGER{null},
        timestamp INTEGER{null},
        expiry INTEGER,
        delivery_time INTEGER,
        origin TEXT,
        properties BLOB"""
_MESSAGE = _MESSAGE_COLUMNS_DDL.format(null=" NOT NULL")
_OPTIONAL_MESSAGE = _MESSAGE_COLUMNS_DDL.format(null="")
_RETAINED_MESSAGE = _MESSAGE.replace("topic TEXT NOT NULL", "topic TEXT PRIMARY KEY", 1)

# Version 4: rows keyed by queue name; one message encoding everywhere; an append-only journal;
# one duplicate-detection table.
_VERSION_4_TABLES = [
    # Every persistent publication a retention keeps, or that several queues reference;
    # message_id is its sequence number: never reused, assigned in commit order.
    f"""CREATE TABLE journal (
        message_id INTEGER PRIMARY KEY,{_MESSAGE},
        stored_at INTEGER NOT NULL
    )""",
    "CREATE INDEX journal_by_age ON journal (stored_at)",
    # A queue's entries. The message rides inline (topic NOT NULL) when this entry is its only
    # reference; otherwise it is in the journal, which this row then keeps alive.
    f"""CREATE TABLE queue_entries (
        queue TEXT NOT NULL,
        message_id INTEGER NOT NULL,
        delivery_qos INTEGER NOT NULL,
        delivery_retain INTEGER NOT NULL,
        subscription_ids TEXT NOT NULL,
        delivery_count INTEGER NOT NULL,
        delivery_id INTEGER NOT NULL,
        state TEXT NOT NULL,{_OPTIONAL_MESSAGE},
        PRIMARY KEY (queue, message_id)
    ) WITHOUT ROWID""",
    "CREATE INDEX queue_entries_by_message ON queue_entries (message_id) WHERE topic IS NULL",
    """CREATE TABLE sessions (
        client_id TEXT PRIMARY KEY,
        expiry_interval INTEGER NOT NULL,
        will_delay INTEGER NOT NULL,
        will_expiry INTEGER
    )""",
    # In rowid order: a session's subscriptions come back in the order they were saved.
    """CREATE TABLE subscriptions (
        client_id TEXT NOT NULL,
        topic_filter TEXT NOT NULL,
        max_qos INTEGER NOT NULL,
        no_local INTEGER NOT NULL,
        retain_as_published INTEGER NOT NULL,
        retain_handling INTEGER NOT NULL,
        subscription_id INTEGER,
        UNIQUE (client_id, topic_filter)
    )""",
    f"""CREATE TABLE wills (
        client_id TEXT PRIMARY KEY,
        message_id INTEGER NOT NULL,{_MESSAGE}
    )""",
    # Columns in message order, so a row decodes like any other message row.
    f"""CREATE TABLE retained (
        message_id INTEGER NOT NULL,{_RETAINED_MESSAGE}
    )""",
    # Keys a producer must not have taken twice: MQTT QoS 2 packet ids not yet released, JMS
    # duplicate ids, the Spark sink's fences. ``key`` has no type: an int or a text.
    """CREATE TABLE duplicates (
        producer TEXT NOT NULL,
        key NOT NULL,
        PRIMARY KEY (producer, key)
    ) WITHOUT ROWID""",
]


def _ms(column: str) -> str:
    """SQL turning a v3 wall time in seconds (REAL, maybe NULL) into milliseconds."""
    return f"CAST(ROUND({column} * 1000) AS INTEGER)"


def _to_version_4(connection: sqlite3.Connection) -> None:
    """v3 → v4: queue rows keyed by queue name instead of client id; JSON (with base64, and
    JSON inside JSON) replaced by columns and one property blob; wall times in ms; retained
    messages get a message id; incoming QoS 2 ids move to the duplicates table."""
    connection.create_function("v3_properties", 1, _v3_properties_blob, deterministic=True)
    connection.create_function("session_queue_name", 1, session_queue_name, deterministic=True)
    connection.create_function(
        "session_producer_name", 1, session_producer_name, deterministic=True
    )
    for table in ("messages", "queued", "sessions", "retained", "incoming_qos2"):
        connection.execute(f"ALTER TABLE {table} RENAME TO v3_{table}")
    for statement in _VERSION_4_TABLES:
        connection.execute(statement)
    connection.execute(
        "INSERT INTO journal SELECT id, topic, payload, qos, retain, 1, priority, "
        f"{_ms('created')}, {_ms('expiry')}, {_ms('delivery_time')}, origin, "
        f"v3_properties(extra), {_ms('stored_at')} FROM v3_messages"
    )
    connection.execute(
        "INSERT INTO queue_entries SELECT session_queue_name(client_id), message_id, qos, retain, "
        "subscription_ids, delivery_count, delivery_id, state, topic, payload, message_qos, "
        "message_retain, CASE WHEN topic IS NULL THEN NULL ELSE 1 END, priority, "
        f"{_ms('created')}, {_ms('expiry')}, {_ms('delivery_time')}, origin, "
        "CASE WHEN topic IS NULL THEN NULL ELSE v3_properties(extra) END FROM v3_queued"
    )
    connection.execute(
        "INSERT INTO duplicates SELECT session_producer_name(client_id), packet_id "
        "FROM v3_incoming_qos2"
    )
    for client_id, text in connection.execute("SELECT client_id, record FROM v3_sessions"):
        record = json.loads(text)
        connection.execute(
            "INSERT INTO sessions VALUES (?, ?, ?, ?)",
            (client_id, record["e"], record["wd"], record["we"]),
        )
        connection.executemany(
            "INSERT INTO subscriptions VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (client_id, f, q, int(nl), int(rap), rh, sid)
                for f, q, nl, rap, rh, sid in record["s"]
            ],
        )
        if record["w"] is not None:
            will = _v3_message(record["w"])
            will.created = 0.0  # v3 stored a time for a will never published: it has none
            connection.execute(
                "INSERT INTO wills VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (client_id, *message_row(will, 0.0)),
            )
    # v3 dropped the id of a retained message: give each a fresh one, above every id in use.
    last_id = int(
        connection.execute(
            "SELECT MAX(m) FROM (SELECT CAST(value AS INTEGER) AS m FROM meta "
            "WHERE key='last_message_id' UNION ALL SELECT MAX(message_id) FROM journal "
            "UNION ALL SELECT MAX(message_id) FROM queue_entries)"
        ).fetchone()[0]
        or 0
    )
    for (text,) in connection.execute("SELECT message FROM v3_retained ORDER BY topic"):
        last_id += 1
        retained = _v3_message(text)
        retained.message_id = last_id
        connection.execute(
            "INSERT INTO retained VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            message_row(retained, 0.0),
        )
    connection.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES ('last_message_id', ?)", (str(last_id),)
    )
    for table in ("messages", "queued", "sessions", "retained", "incoming_qos2"):
        connection.execute(f"DROP TABLE v3_{table}")


def _v3_properties_blob(text: str | None) -> bytes | None:
    """The v3 ``extra`` JSON as a property blob."""
    if not text:
        return None
    return encode_properties(*_v3_optional_fields(json.loads(text)))


def _v3_optional_fields(doc: dict[str, Any]) -> tuple[MessageProperties | None, MQTT5Fields | None]:
    """Application properties and MQTT 5 fields from v3's ``extra`` JSON. v3 kept no property
    types: each value gets its natural one."""
    properties = MessageProperties.of(doc["p"]) if doc.get("p") else None
    mqtt5 = None
    if doc.keys() - {"p"}:
        mqtt5 = MQTT5Fields(
            doc.get("pf"),
            doc.get("ct"),
            doc.get("rt"),
            base64.b64decode(doc["cd"]) if "cd" in doc else None,
            [(name, value) for name, value in doc.get("u", [])],
        )
    return properties, mqtt5


def _v3_message(text: str) -> Message:
    """A whole message from v3's JSON (wills and retained copies)."""
    doc = json.loads(text)
    properties, mqtt5 = _v3_optional_fields(json.loads(doc["x"])) if doc["x"] else (None, None)
    return Message(
        topic=doc["t"],
        payload=base64.b64decode(doc["b"]),
        qos=doc["q"],
        retain=doc["r"],
        persistent=doc["s"],
        priority=doc["pr"],
        # Wall seconds, as if from a clock whose zero is the epoch: message_row(m, 0.0) then
        # stores them as wall ms.
        expiry=doc["e"],
        delivery_time=doc["d"],
        created=doc["c"] or 0.0,
        origin=doc["o"],
        properties=properties,
        mqtt5=mqtt5,
    )


MIGRATIONS: dict[int, Step] = {
    # 0 → 1: the first schema.
    1: [
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            topic TEXT NOT NULL,
            payload BLOB NOT NULL,
            qos INTEGER NOT NULL,
            retain INTEGER NOT NULL,
            priority INTEGER NOT NULL,
            expiry REAL,
            delivery_time REAL,
            created REAL NOT NULL,
            origin TEXT,
            extra TEXT NOT NULL,
            stored_at REAL NOT NULL
        )""",
        """CREATE TABLE sessions (
            client_id TEXT PRIMARY KEY,
            record TEXT NOT NULL
        )""",
        """CREATE TABLE queued (
            client_id TEXT NOT NULL,
            message_id INTEGER NOT NULL,
            qos INTEGER NOT NULL,
            retain INTEGER NOT NULL,
            subscription_ids TEXT NOT NULL,
            delivery_count INTEGER NOT NULL,
            delivery_id INTEGER NOT NULL,
            state TEXT NOT NULL,
            PRIMARY KEY (client_id, message_id)
        ) WITHOUT ROWID""",
        "CREATE INDEX queued_by_message ON queued (message_id)",
        """CREATE TABLE retained (
            topic TEXT PRIMARY KEY,
            message TEXT NOT NULL
        )""",
        """CREATE TABLE incoming_qos2 (
            client_id TEXT NOT NULL,
            packet_id INTEGER NOT NULL,
            PRIMARY KEY (client_id, packet_id)
        ) WITHOUT ROWID""",
        "INSERT INTO meta (key, value) VALUES ('last_message_id', '0')",
    ],
    # 1 → 2: the journal sweep finds messages past their retention by age.
    2: ["CREATE INDEX messages_by_age ON messages (stored_at)"],
    # 2 → 3: a queue row may carry its message inline (a message one queue references and no
    # journal retention keeps): one row written and deleted per message instead of two. Only
    # rows without a message (topic IS NULL) keep a journal row alive.
    3: [
        *(
            f"ALTER TABLE queued ADD COLUMN {column}"
            for column in (
                "topic TEXT",
                "payload BLOB",
                "message_qos INTEGER",
                "message_retain INTEGER",
                "priority INTEGER",
                "expiry REAL",
                "delivery_time REAL",
                "created REAL",
                "origin TEXT",
                "extra TEXT",
            )
        ),
        "DROP INDEX queued_by_message",
        "CREATE INDEX queued_by_message ON queued (message_id) WHERE topic IS NULL",
    ],
    4: _to_version_4,
    # 4 → 5: a session remembers the in-flight window of the connection attached when it was
    # saved (0 = none), so recovery after a crash knows what may have been in flight.
    5: ["ALTER TABLE sessions ADD COLUMN in_flight_window INTEGER NOT NULL DEFAULT 0"],
    # 5 → 6: a queue destination (JMS queue) remembers the in-flight window of its consumers
    # (0 = none: no row), so recovery after a crash knows what may have been in flight.
    6: [
        """CREATE TABLE queue_windows (
            queue TEXT PRIMARY KEY,
            in_flight_window INTEGER NOT NULL
        ) WITHOUT ROWID"""
    ],
    # 6 → 7: a session remembers the user its client connected as (NULL: anonymous), so
    # recovery filters what it may read before the client is back. A session stored before
    # is recovered as anonymous until its client reconnects: it may be sent less, never more.
    7: ["ALTER TABLE sessions ADD COLUMN principal TEXT"],
    # 7 → 8: a session remembers the rules its front end asked for its queue (order, and
    # whether what it gives up on is dead-lettered), so a JMS durable subscription comes back
    # in priority order and dead-lettering. Before, only the JMS front end named sessions
    # $durable/... (durable subscriptions, shared or not): those get the JMS rules.
    8: [
        "ALTER TABLE sessions ADD COLUMN queue_ordering TEXT NOT NULL DEFAULT 'fifo'",
        "ALTER TABLE sessions ADD COLUMN dead_letters INTEGER NOT NULL DEFAULT 0",
        "UPDATE sessions SET queue_ordering='priority', dead_letters=1"
        " WHERE substr(client_id, 1, 9) = '$durable/'",
    ],
    # 8 → 9: a JMS durable subscription's session keeps what the subscription was made as
    # (topic, selector, noLocal; rows deleted with the session), so after a restart a consumer
    # asking for another selector or noLocal replaces it (JMS) instead of redefining what it
    # collected. One stored before has no row: its first consumer after the upgrade defines it,
    # as every consumer after a restart did before.
    9: [
        """CREATE TABLE durable_definitions (
            client_id TEXT PRIMARY KEY,
            topic TEXT NOT NULL,
            selector TEXT,
            no_local INTEGER NOT NULL
        ) WITHOUT ROWID"""
    ],
}


def migrate(connection: sqlite3.Connection, version: int, log: Callable[[int], None]) -> None:
    """Bring a database at ``version`` to :data:`SCHEMA_VERSION`, one transaction per step."""
    while version < SCHEMA_VERSION:
        version += 1
        log(version)
        connection.execute("BEGIN IMMEDIATE")
        try:
            step = MIGRATIONS[version]
            if callable(step):
                step(connection)
            else:
                for statement in step:
                    connection.execute(statement)
            connection.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                (str(version),),
            )
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")
