"""Configuration: TOML in, typed frozen Config out; every mistake named by its dotted key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kittiwake.config import (
    AuthConfig,
    Config,
    ConfigError,
    LimitsConfig,
    ListenerConfig,
    SessionConfig,
    SysConfig,
    config_from_dict,
    load_config,
)

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "kittiwake.toml"
    path.write_text(text, encoding="utf-8")
    return path


# A TLS table with a CA, as client certificates need.
FLIGHT_TLS = {"certificate": "server.pem", "key": "server.key", "ca": "ca.pem"}


def test_no_file_gives_defaults() -> None:
    """load_config(None) is the all-defaults Config."""
    assert load_config(None) == Config()


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    """Every key is optional: an empty file is the defaults."""
    assert load_config(write(tmp_path, "")) == Config()


def test_example_file_loads_and_equals_defaults() -> None:
    """kittiwake.example.toml documents the defaults: it loads and equals Config()."""
    assert load_config(REPO / "kittiwake.example.toml") == Config()


def test_defaults() -> None:
    """The documented defaults (a sample of the limits users rely on)."""
    config = Config()
    assert config.listeners == (ListenerConfig("mqtt", "127.0.0.1", 1883),)
    assert config.limits.max_inflight == 100
    assert config.limits.receive_maximum == 100
    assert config.limits.max_packet_size == 16 * 1024 * 1024
    assert config.limits.queue_full_policy == "reject_new"
    assert config.sessions.max_session_expiry == 7 * 24 * 3600
    assert config.sys.interval == 10.0
    assert config.auth == AuthConfig()
    assert config.auth.publish_allow == () and config.auth.allow_anonymous == "auto"
    assert config.log_level == "info"


def test_load_values(tmp_path: Path) -> None:
    """Values from the file land in the typed config; lists become tuples."""
    path = write(
        tmp_path,
        """
log_level = "debug"
uvloop = false

[[listeners]]
host = "0.0.0.0"
port = 1884

[[listeners]]
port = 0

[limits]
max_inflight = 20
queue_full_policy = "discard_oldest"

[sessions]
max_keepalive = 0

[sys]
interval = 5

[auth]
publish_deny = ["$SYS/#", "secret/+"]
""",
    )
    config = load_config(path)
    assert config.log_level == "debug" and config.uvloop is False
    assert config.listeners == (
        ListenerConfig(host="0.0.0.0", port=1884),
        ListenerConfig(port=0),
    )
    assert config.limits == LimitsConfig(max_inflight=20, queue_full_policy="discard_oldest")
    assert config.sessions == SessionConfig(max_keepalive=0)
    assert config.sys == SysConfig(interval=5.0)
    assert isinstance(config.sys.interval, float)
    assert config.auth.publish_deny == ("$SYS/#", "secret/+")


def test_config_is_frozen() -> None:
    """A loaded config cannot be changed behind the broker's back."""
    config = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.log_level = "debug"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.limits.max_inflight = 1  # type: ignore[misc]


# -- refusals name the dotted key ------------------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("bogus = 1", "bogus"),
        ("[limits]\nmax_inflihgt = 5", "limits.max_inflihgt"),
        ("[[listeners]]\nprotocl = 'mqtt'", "listeners[0].protocl"),
        ("[auth]\nallow = []", "auth.allow"),
        ("[nosuchtable]\nx = 1", "nosuchtable"),
    ],
)
def test_unknown_key_is_refused(tmp_path: Path, toml: str, key: str) -> None:
    """A typo never silently falls back to a default: the unknown key is named."""
    path = write(tmp_path, toml)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert f"unknown key '{key}'" in message
    assert str(path) in message


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ('[limits]\nmax_inflight = "10"', "limits.max_inflight"),
        ("[limits]\nmax_inflight = 10.5", "limits.max_inflight"),
        ("[limits]\nmax_inflight = true", "limits.max_inflight"),
        ("uvloop = 1", "uvloop"),
        ('uvloop = "yes"', "uvloop"),
        ("[sys]\ninterval = true", "sys.interval"),
        ('[sys]\ninterval = "10"', "sys.interval"),
        ('[[listeners]]\nport = "1883"', "listeners[0].port"),
        ("[[listeners]]\nhost = 127", "listeners[0].host"),
        ('[auth]\npublish_allow = "a/#"', "auth.publish_allow"),
        ("[auth]\npublish_allow = ['a', 1]", "auth.publish_allow[1]"),
        ("limits = 5", "limits"),
        ('log_level = "verbose"', "log_level"),
        ('[limits]\nqueue_full_policy = "drop"', "limits.queue_full_policy"),
        ('[[listeners]]\nprotocol = "stomp"', "listeners[0].protocol"),
    ],
)
def test_wrong_type_is_refused(tmp_path: Path, toml: str, key: str) -> None:
    """A value of the wrong type (or outside a choice list) is refused, naming the key."""
    path = write(tmp_path, toml)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}: {key}:" in str(info.value)


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"limits": {"max_connections": -1}}, "limits.max_connections"),
        ({"sys": {"interval": -0.5}}, "sys.interval"),
        ({"sessions": {"max_session_expiry": -1}}, "sessions.max_session_expiry"),
        ({"listeners": [{"port": 65536}]}, "listeners[0].port"),
        ({"listeners": [{"port": -1}]}, "listeners[0].port"),
        ({"limits": {"receive_maximum": 0}}, "limits.receive_maximum"),
        ({"limits": {"receive_maximum": 65536}}, "limits.receive_maximum"),
        ({"limits": {"max_inflight": 0}}, "limits.max_inflight"),
        # Limits 0 does not turn off: it would refuse everything, so it is a config error.
        ({"limits": {"max_queued_messages": 0}}, "limits.max_queued_messages"),
        ({"limits": {"max_queued_bytes": 0}}, "limits.max_queued_bytes"),
        ({"limits": {"max_connections": 0}}, "limits.max_connections"),
        ({"limits": {"max_topic_levels": 0}}, "limits.max_topic_levels"),
        ({"limits": {"max_subscriptions_per_session": 0}}, "limits.max_subscriptions_per_session"),
        ({"amqp": {"max_message_size": 0}}, "amqp.max_message_size"),
        ({"limits": {"max_inflight": 65536}}, "limits.max_inflight"),
        ({"limits": {"topic_alias_maximum": 65536}}, "limits.topic_alias_maximum"),
        ({"limits": {"max_packet_size": 15}}, "limits.max_packet_size"),
        ({"limits": {"max_packet_size": 268_435_461}}, "limits.max_packet_size"),
        ({"sessions": {"max_keepalive": 65536}}, "sessions.max_keepalive"),
        ({"queues": {"max_delivery_attempts": -1}}, "queues.max_delivery_attempts"),
        ({"queues": {"dead_letter_queue": "DLQ.{name}"}}, "queues.dead_letter_queue"),
        ({"queues": {"expiry_queue": "Expired.{0}"}}, "queues.expiry_queue"),
        ({"queues": {"patterns": [{"match": "a/#/b"}]}}, "queues.patterns[0].match"),
        (
            {"queues": {"patterns": [{"match": "a", "dead_letter_queue": "D.{x}"}]}},
            "queues.patterns[0].dead_letter_queue",
        ),
        (
            {"queues": {"patterns": [{"match": "a", "max_delivery_attempts": -2}]}},
            "queues.patterns[0].max_delivery_attempts",
        ),
        (
            {"queues": {"patterns": [{"match": "a", "auto_create": 1}]}},
            "queues.patterns[0].auto_create",
        ),
        ({"queues": {"patterns": [{"max_delivery_attempts": 3}]}}, "queues.patterns[0]"),
        ({"limits": {"flow_control_bytes": -1}}, "limits.flow_control_bytes"),
        ({"limits": {"stalled_subscriber_timeout": -1.0}}, "limits.stalled_subscriber_timeout"),
        (
            {"limits": {"stalled_subscriber_timeout": float("inf")}},
            "limits.stalled_subscriber_timeout",
        ),
        ({"limits": {"publisher_pause_bytes": -1}}, "limits.publisher_pause_bytes"),
        ({"limits": {"max_total_queued_bytes": -1}}, "limits.max_total_queued_bytes"),
        ({"auth": {"token_lifetime": 0.5}}, "auth.token_lifetime"),
        ({"journal": {"finished_write_retention": -1}}, "journal.finished_write_retention"),
        (
            {
                "listeners": [
                    {"protocol": "flight", "tls": FLIGHT_TLS | {"certificate_user": "subject"}}
                ]
            },
            "listeners[0].tls.certificate_user",
        ),
        (
            {
                "listeners": [
                    {
                        "protocol": "flight",
                        "tls": FLIGHT_TLS
                        | {"certificate_user": "cn", "require_client_certificate": False},
                    }
                ]
            },
            "listeners[0].tls.require_client_certificate",
        ),
    ],
)
def test_out_of_range_is_refused(raw: dict, key: str) -> None:
    """Range checks refuse impossible values, naming the key."""
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw)
    assert str(info.value).startswith(f"{key}:")


@pytest.mark.parametrize(
    "raw",
    [
        {"listeners": [{"port": 0}, {"port": 65535}]},
        {"limits": {"receive_maximum": 1, "max_inflight": 65535}},
        {"limits": {"max_packet_size": 16}},
        {"limits": {"max_packet_size": 268_435_460}},
        {"limits": {"topic_alias_maximum": 0}},
        {
            "limits": {
                "max_queued_messages": 1,
                "max_queued_bytes": 1,
                "max_connections": 1,
                "max_topic_levels": 1,
                "max_subscriptions_per_session": 1,
            },
            "amqp": {"max_message_size": 1},
        },
        {"sessions": {"max_keepalive": 65535}},
        {"sys": {"interval": 0}},
        {"queues": {"dead_letter_queue": "DLQ.{queue}", "expiry_queue": ""}},
        {
            "limits": {
                "flow_control_bytes": 0,
                "stalled_subscriber_timeout": 0,
                "publisher_pause_bytes": 0,
                "max_total_queued_bytes": 0,
            }
        },
        {"auth": {"token_lifetime": 1}, "journal": {"finished_write_retention": 0}},
        # A flight listener names users by a certificate's cn when it requires certificates;
        # the MQTT listener's "subject" stays its own.
        {
            "listeners": [
                {
                    "protocol": "flight",
                    "tls": FLIGHT_TLS
                    | {"certificate_user": "cn", "require_client_certificate": True},
                },
                {"tls": FLIGHT_TLS | {"certificate_user": "subject"}},
            ]
        },
    ],
)
def test_range_edges_are_accepted(raw: dict) -> None:
    """The limits of each range are themselves allowed."""
    config_from_dict(raw)


def test_unreadable_file(tmp_path: Path) -> None:
    """A missing file is a ConfigError naming the file, not an OSError."""
    missing = tmp_path / "absent.toml"
    with pytest.raises(ConfigError, match=r"absent\.toml"):
        load_config(missing)


def test_invalid_toml(tmp_path: Path) -> None:
    """Broken TOML is a ConfigError naming the file."""
    path = write(tmp_path, "[limits\nmax_inflight = ")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value) and "not valid TOML" in str(info.value)


def test_config_error_is_a_value_error() -> None:
    """Callers that only know 'bad value' still catch configuration errors."""
    assert issubclass(ConfigError, ValueError)


def test_an_amqp_listener_defaults_to_port_5672() -> None:
    config = config_from_dict({"listeners": [{"protocol": "amqp"}, {"protocol": "mqtt"}]})
    assert [(lst.protocol, lst.host, lst.port) for lst in config.listeners] == [
        ("amqp", "127.0.0.1", 5672),
        ("mqtt", "127.0.0.1", 1883),
    ]


def test_amqp_limits_are_checked() -> None:
    assert config_from_dict({"amqp": {"max_frame_size": 4096}}).amqp.max_frame_size == 4096
    for bad in ({"max_frame_size": 100}, {"max_sessions": 0}, {"max_links_per_session": 0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            config_from_dict({"amqp": bad})


def test_a_flight_listener_defaults_to_port_8815_on_loopback() -> None:
    config = config_from_dict({"listeners": [{"protocol": "mqtt"}, {"protocol": "flight"}]})
    assert config.listeners == (
        ListenerConfig("mqtt", "127.0.0.1", 1883),
        ListenerConfig("flight", "127.0.0.1", 8815),
    )
    assert config_from_dict({"listeners": [{"protocol": "flight", "port": 0}]}).listeners[
        0
    ].port == 0


def test_journal_selection_defaults_and_values() -> None:
    """Persistent publications on every topic, QoS 0 on none, nothing kept without a
    retention."""
    journal = Config().journal
    assert journal.persistent_topics == ("#",) and journal.qos0_topics == ()
    assert not journal.enabled
    journal = config_from_dict(
        {"journal": {"retention_seconds": 60, "qos0_topics": ["sensors/+/reading"]}}
    ).journal
    assert journal.enabled and journal.qos0_topics == ("sensors/+/reading",)


def test_a_bad_journal_filter_is_refused_with_its_key() -> None:
    with pytest.raises(ConfigError, match=r"^journal\.qos0_topics\[1\]: .*'#'"):
        config_from_dict({"journal": {"qos0_topics": ["ok/#", "bad/#/x"]}})


def test_renamed_retention_keys_still_work_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """store.journal_retention_* (before the [journal] table) keep working; the warning names
    the replacement."""
    path = write(
        tmp_path,
        """
[store]
journal_retention_seconds = 30
journal_retention_bytes = 1000
""",
    )
    with caplog.at_level("WARNING", logger="kittiwake.config"):
        config = load_config(path)
    assert config.journal.retention_seconds == 30.0
    assert config.journal.retention_bytes == 1000
    assert "journal.retention_seconds" in caplog.text
    assert "journal.retention_bytes" in caplog.text


def test_a_renamed_key_beside_its_replacement_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"journal\.retention_seconds"):
        config_from_dict(
            {"store": {"journal_retention_seconds": 1}, "journal": {"retention_seconds": 2}}
        )


def test_allowed_origins_are_websocket_origins() -> None:
    config = config_from_dict(
        {
            "listeners": [
                {
                    "protocol": "websockets",
                    "allowed_origins": ["https://app.example.com", "http://[::1]:3000", "null"],
                }
            ]
        }
    )
    assert config.listeners[0].allowed_origins[0] == "https://app.example.com"
    for bad in ("app.example.com", "https://app.example.com/", "https://a.example/path", "*"):
        with pytest.raises(ConfigError, match=r"listeners\[0\].allowed_origins\[0\]"):
            config_from_dict(
                {"listeners": [{"protocol": "websockets", "allowed_origins": [bad]}]}
            )
    with pytest.raises(ConfigError, match="only a websockets listener"):
        config_from_dict({"listeners": [{"protocol": "mqtt", "allowed_origins": ["null"]}]})


def test_queue_settings_come_from_the_first_matching_pattern(tmp_path: Path) -> None:
    """DESIGN.md section 5: max_delivery_attempts, dead-letter and expiry queues and whether a
    queue is created on first use, per queue name pattern; what a pattern leaves out, and
    every queue no pattern matches, keeps the [queues] value."""
    config = load_config(
        write(
            tmp_path,
            """
[queues]
max_delivery_attempts = 5
auto_create = false
declared = ["orders/eu", "billing"]

[[queues.patterns]]
match = "orders/#"
max_delivery_attempts = 2
dead_letter_queue = "DLQ.{queue}"

[[queues.patterns]]
match = "scratch/+"
auto_create = true
expiry_queue = ""

[[queues.patterns]]
match = "#"
max_delivery_attempts = 7
""",
        )
    )
    queues = config.queues
    assert queues.declared == ("orders/eu", "billing")
    orders = queues.settings("orders/eu")
    assert (orders.max_delivery_attempts, orders.dead_letter_queue) == (2, "DLQ.{queue}")
    assert (orders.expiry_queue, orders.auto_create) == ("ExpiryQueue", False)
    scratch = queues.settings("scratch/1")
    # The first matching pattern alone applies: what it leaves out is the [queues] value.
    assert (scratch.auto_create, scratch.expiry_queue, scratch.max_delivery_attempts) == (
        True,
        "",
        5,
    )
    assert queues.settings("billing").max_delivery_attempts == 7
    # A subscription's queue (the broker's "$session/..." name) is matched without its '$'.
    assert queues.settings("$session/$durable/app/audit").max_delivery_attempts == 7
    assert config_from_dict({}).queues.settings("anything").auto_create is True
