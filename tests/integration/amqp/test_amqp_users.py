"""SASL PLAIN against the broker's users (the same password file as MQTT's), with
python-qpid-proton: the right password opens the connection, a wrong one or an anonymous client
(once users exist) is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from proton import ConnectionException, Message
from proton.utils import BlockingConnection

from ..brokerproc import BrokerProcess
from ..test_users import kittiwake_passwd


@pytest.fixture
def users_amqp_broker(tmp_path: Path):
    users = tmp_path / "users"
    kittiwake_passwd(users, "jms", "client")
    process = BrokerProcess(
        tmp_path / "broker", amqp=True, store={"backend": "memory"},
        auth={"password_file": str(users)},
    )
    process.start()
    yield process
    process.stop()


def connect(broker: BrokerProcess, **kwargs: object) -> BlockingConnection:
    return BlockingConnection(broker.amqp_url, timeout=10, **kwargs)


def test_sasl_plain_with_the_right_password_opens(users_amqp_broker: BrokerProcess) -> None:
    connection = connect(
        users_amqp_broker, user="jms", password="client", allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
    )
    try:
        sender = connection.create_sender("queue.users")
        sender.send(Message(body="hello"))
    finally:
        connection.close()


def test_sasl_plain_with_a_wrong_password_is_refused(users_amqp_broker: BrokerProcess) -> None:
    with pytest.raises(ConnectionException):
        connect(
            users_amqp_broker, user="jms", password="wrong", allowed_mechs="PLAIN",
            allow_insecure_mechs=True,
        ).close()
    assert "amqp login refused: user 'jms'" in users_amqp_broker.log_text()


def test_anonymous_is_refused_once_users_exist(users_amqp_broker: BrokerProcess) -> None:
    with pytest.raises(ConnectionException):
        connect(users_amqp_broker, allowed_mechs="ANONYMOUS").close()


def test_refusals_are_logged_with_user_client_id_address_and_destination(tmp_path: Path) -> None:
    """A refused link attach and a rejected transfer each give one log line naming the user,
    the client (container) id, the client's address and the queue or topic."""
    from proton import Delivery, byte, symbol
    from proton.utils import LinkDetached, SendException

    from ..clients import unique

    users = tmp_path / "users"
    kittiwake_passwd(users, "jms", "client")
    process = BrokerProcess(
        tmp_path / "broker", amqp=True, store={"backend": "memory"},
        auth={
            "password_file": str(users),
            "acl": [{"users": ["jms"], "send": ["allowed"], "publish": ["open/#"]}],
        },
    )
    process.start()
    container = unique("refused-container")
    try:
        connection = connect(
            process, user="jms", password="client", allowed_mechs="PLAIN",
            allow_insecure_mechs=True, container_id=container,
        )
        try:
            with pytest.raises(LinkDetached, match="unauthorized-access"):
                connection.create_sender("forbidden")
            relay = connection.create_sender(None)  # the anonymous relay: checked per transfer
            with pytest.raises(SendException) as rejected:
                relay.send(
                    Message(  # a JMS topic, as Qpid JMS marks one
                        address="closed/door", body="x",
                        annotations={symbol("x-opt-jms-dest"): byte(1)},
                    )
                )
            assert rejected.value.state == Delivery.REJECTED
        finally:
            connection.close()
    finally:
        process.stop()
    lines = process.log_text().splitlines()
    who = f"user 'jms', client id '{container}', 127.0.0.1:"
    [link] = [line for line in lines if "link " in line and "refused" in line]
    assert who in link and "to 'forbidden'" in link
    [transfer] = [line for line in lines if "transfer to" in line and "rejected" in line]
    assert who in transfer and "to 'closed/door'" in transfer and "may not publish" in transfer
