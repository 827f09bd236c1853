"""Users and passwords over real sockets: a password file made with `kittiwake passwd`, CONNECT
user names and passwords checked (MQTT 3.1.1 CONNACK 4 / 5.0 0x86 for bad credentials, 5 / 0x87
for anonymous clients once users exist), the file re-read on SIGHUP without dropping anyone,
anonymous access per listener, and failed logins limited per address. Clients: paho-mqtt,
mosquitto_pub and the raw test client.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kittiwake.mqtt.codec import encode
from kittiwake.mqtt.packets import ConnAck, Connect, PingResp, PubAck, Publish

from .brokerproc import BrokerProcess
from .clients import MOSQUITTO_PUB, MQTTv5, mosquitto_pub, unique, wait_until


def kittiwake_passwd(path: Path, user: str, password: str | None = None) -> None:
    """The real command, password on stdin (never on its command line); None deletes."""
    argv = [sys.executable, "-m", "kittiwake", "passwd", str(path), user]
    if password is None:
        argv.append("-D")
    result = subprocess.run(
        argv, input=(password or "") + "\n", capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "users"
    kittiwake_passwd(path, "alice", "wonderland")
    kittiwake_passwd(path, "bob", "builder")
    return path


@pytest.fixture
def users_broker(broker, password_file: Path) -> BrokerProcess:
    return broker(auth={"password_file": str(password_file)})


@pytest.mark.parametrize(("version", "bad", "anonymous"), [(4, 4, 5), (5, 0x86, 0x87)])
def test_user_names_and_passwords_are_checked(users_broker, raw, version, bad, anonymous):
    """Right password: in. Wrong password or unknown user: bad user name or password.
    No user name while users exist: not authorised (the default "auto" policy)."""
    good = raw(users_broker, version)
    assert good.connect(unique("alice"), username="alice", password=b"wonderland").reason_code == 0
    for username, password in [("alice", b"Wonderland"), ("carol", b"wonderland"), ("bob", None)]:
        client = raw(users_broker, version)
        connack = client.connect(
            unique("bad"), username=username, password=password, expect_success=False
        )
        assert connack.reason_code == bad, (username, password)
        assert client.recv_until_closed() == []
    client = raw(users_broker, version)
    assert client.connect(unique("anon"), expect_success=False).reason_code == anonymous
    assert good.is_open(within=0.05)
    log = users_broker.log_text()
    assert "login refused: user 'carol'" in log and "127.0.0.1" in log


def test_paho_logs_in_and_is_refused_with_a_wrong_password(users_broker, paho):
    for protocol in (4, MQTTv5):
        client = paho(users_broker, protocol=protocol, connect=False)
        client.connect(username="bob", password="builder")
        topic = unique("users/paho")
        client.subscribe(topic, 1)
        client.publish(topic, b"hello", 1)
        assert client.get().payload == b"hello"
        refused = paho(users_broker, protocol=protocol, connect=False)
        refused.connect(username="bob", password="wrong", expect_success=False)
        assert refused.connack is not None and refused.connack[1] == 0x86


@pytest.mark.skipif(not MOSQUITTO_PUB, reason="mosquitto-clients not installed")
def test_mosquitto_pub_with_and_without_the_right_password(users_broker, paho):
    topic = unique("users/mosquitto")
    watcher = paho(users_broker, connect=False)
    watcher.connect(username="alice", password="wonderland")
    watcher.subscribe(topic, 1)
    mosquitto_pub(users_broker.address, topic, "from mosquitto_pub", qos=1,
                  extra=["-u", "bob", "-P", "builder"])
    assert watcher.get().payload == b"from mosquitto_pub"
    for version, words in (("mqttv311", "bad user name or password"), ("mqttv5", "bad user")):
        result = subprocess.run(
            [MOSQUITTO_PUB, "-h", users_broker.host, "-p", str(users_broker.port), "-V", version,
             "-t", topic, "-m", "x", "-u", "bob", "-P", "nope"],
            capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL,
        )
        assert result.returncode != 0 and words in result.stderr.lower(), result.stderr
    result = subprocess.run(
        [MOSQUITTO_PUB, "-h", users_broker.host, "-p", str(users_broker.port), "-t", topic,
         "-m", "x"],
        capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL,
    )
    assert result.returncode != 0 and "not authori" in result.stderr.lower(), result.stderr
    watcher.no_message(0.2)


def test_sighup_reloads_users_without_dropping_connections(users_broker, password_file, paho):
    """SIGHUP re-reads the file: a new user gets in, a deleted one is refused from then on,
    and clients already connected (the deleted user's too) keep working."""
    topic = unique("users/reload")
    bob = paho(users_broker, connect=False)
    bob.connect(username="bob", password="builder")
    bob.subscribe(topic, 1)
    kittiwake_passwd(password_file, "carol", "singer")
    kittiwake_passwd(password_file, "bob", None)
    assert users_broker.proc is not None
    users_broker.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "users loaded from" in users_broker.log_text(), 10)
    carol = paho(users_broker, connect=False)
    carol.connect(username="carol", password="singer")
    carol.publish(topic, b"after reload", 1)
    assert bob.get().payload == b"after reload"
    again = paho(users_broker, connect=False)
    again.connect(username="bob", password="builder", expect_success=False)
    assert again.connack is not None and again.connack[1] == 0x86
    assert bob.client.is_connected() and users_broker.alive()


def test_a_broken_password_file_on_sighup_keeps_the_users(users_broker, password_file, raw):
    password_file.write_text("garbage\n")
    assert users_broker.proc is not None
    users_broker.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "users unchanged" in users_broker.log_text(), 10)
    client = raw(users_broker, 5)
    assert client.connect(unique("a"), username="alice", password=b"wonderland").reason_code == 0


def test_a_broker_with_a_missing_password_file_does_not_start(tmp_path: Path):
    process = BrokerProcess(tmp_path / "b", auth={"password_file": str(tmp_path / "nope")})
    with pytest.raises(RuntimeError, match="password_file"):
        process.start()


def test_anonymous_access_is_set_per_listener(broker, password_file, raw):
    """Users exist, yet this listener lets anonymous clients in (say, a local one)."""
    address = broker(
        auth={"password_file": str(password_file)}, listener={"allow_anonymous": True}
    )
    assert raw(address, 5).connect(unique("anon")).reason_code == 0
    assert raw(address, 5).connect(
        unique("alice"), username="alice", password=b"wonderland"
    ).reason_code == 0
    closed = broker(auth={"allow_anonymous": True}, listener={"allow_anonymous": False})
    assert raw(closed, 4).connect(unique("anon"), expect_success=False).reason_code == 5


def test_failed_logins_are_limited_per_address(broker, password_file, raw):
    address = broker(
        auth={"password_file": str(password_file), "max_failed_logins": 3,
              "failed_login_window": 3.0}
    )
    for _ in range(3):
        client = raw(address, 5)
        assert client.connect(
            unique("guess"), username="alice", password=b"guess", expect_success=False
        ).reason_code == 0x86
    limited = raw(address, 5)
    connack = limited.connect(
        unique("right"), username="alice", password=b"wonderland", expect_success=False
    )
    assert connack.reason_code == 0x9F  # connection rate exceeded, the password unchecked

    def admitted() -> bool:
        client = raw(address, 5)
        answer = client.connect(
            unique("later"), username="alice", password=b"wonderland", expect_success=False
        )
        return answer.reason_code == 0

    assert wait_until(admitted, 15, interval=0.5), "still refused after the window"


def test_packets_pipelined_behind_a_checked_connect_wait_for_it(users_broker, raw):
    """The password is hashed off the event loop; what the client sent right behind its
    CONNECT is handled after the CONNACK, in order."""
    client = raw(users_broker, 4)
    client.send_raw(
        encode(Connect(unique("pipe"), username="bob", password=b"builder"), 4)
        + encode(Publish("users/pipe", b"x", 1, packet_id=5), 4)
        + b"\xc0\x00"
    )
    kinds = [type(client.recv()) for _ in range(3)]
    assert kinds == [ConnAck, PubAck, PingResp]


def test_acl_per_user_group_and_client_with_substitution(broker, password_file, paho):
    """alice reads and writes under devices/alice/ (%u); operators (bob) read everything but
    hr/; each client may publish to status/<client id> (%c); anything else is denied once ACL
    rules exist. A broad subscription gets only what its user may read."""
    address = broker(
        auth={
            "password_file": str(password_file),
            "groups": [{"name": "operators", "users": ["bob"]}],
            "acl": [
                {"publish": ["devices/%u/#", "status/%c"], "subscribe": ["devices/%u/#"]},
                {"groups": ["operators"], "subscribe": ["#"], "deny_subscribe": ["hr/#"]},
                {"users": ["bob"], "publish": ["hr/#", "devices/#"]},
            ],
        }
    )
    alice = paho(address, protocol=MQTTv5, connect=False)
    alice.connect(username="alice", password="wonderland")
    bob = paho(address, protocol=MQTTv5, connect=False)
    bob.connect(username="bob", password="builder")
    assert alice.subscribe("#", 1) == [1]  # granted: devices/alice/# is inside it
    assert alice.subscribe("hr/#", 1) == [0x87]  # outside every rule of hers
    assert bob.subscribe("#", 1) == [1]
    assert bob.subscribe("hr/salaries", 1) == [0x87]
    bob.publish("devices/alice/lamp", b"for alice", 1)
    bob.publish("devices/carol/lamp", b"not for alice", 1)
    bob.publish("hr/salaries", b"nobody reads this", 1)
    assert alice.get().payload == b"for alice"
    alice.no_message(0.3)
    assert {bob.get().payload for _ in range(2)} == {b"for alice", b"not for alice"}
    bob.no_message(0.3)
    denied = alice.publish("devices/carol/lamp", b"x", 1, wait=False)
    assert alice.publish_result(denied) == 0x87
    own_status = alice.publish(f"status/{alice.client_id}", b"up", 1, wait=False)
    assert alice.publish_result(own_status) == 0
    log = address.log_text()
    assert "user 'alice' by password" in log
    assert "publish to 'devices/carol/lamp' not authorised" in log
