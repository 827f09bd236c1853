"""Per-user ACLs for JMS over AMQP, through kittiwake.jms: queue rules (send, receive, browse)
and the topic rules MQTT clients have (publish, subscribe, filtered at delivery), applied to
the user the connection authenticated as; a refusal is a JMSSecurityException."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kittiwake.jms import (
    Connection,
    ConnectionFactory,
    JMSSecurityException,
    Queue,
    Topic,
    TransactionRolledBackException,
)

from ..brokerproc import BrokerProcess
from ..test_rules_reload import RELOADED, sighup
from ..test_users import kittiwake_passwd


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = Path(tmp_path_factory.mktemp("jms-acl"))
    passwords = base / "passwd"
    kittiwake_passwd(passwords, "alice", "wonderland")
    kittiwake_passwd(passwords, "bob", "builder")
    process = BrokerProcess(
        base / "broker",
        amqp=True,
        store={"backend": "memory"},
        auth={
            "password_file": str(passwords),
            "acl": [
                # alice places orders and may look at them; her own queue is hers.
                {
                    "users": ["alice"],
                    "send": ["orders"],
                    "browse": ["orders"],
                    "receive": ["inbox/%u"],
                    "subscribe": ["news/#"],
                    "deny_subscribe": ["news/hr/#"],
                },
                # bob processes orders and publishes the news.
                {"users": ["bob"], "receive": ["orders"], "send": ["inbox/#"],
                 "publish": ["news/#"]},
            ],
        },
    )
    process.start()
    yield process
    process.stop()


def connect(broker: BrokerProcess, user: str, password: str) -> Connection:
    connection = ConnectionFactory(broker.amqp_url, username=user, password=password,
                                   timeout=10).create_connection()
    connection.start()
    return connection


def test_queue_rules_per_user(acl_broker: BrokerProcess) -> None:
    alice = connect(acl_broker, "alice", "wonderland")
    bob = connect(acl_broker, "bob", "builder")
    try:
        alice_session = alice.create_session()
        alice_session.create_producer(Queue("orders")).send(
            alice_session.create_text_message("one lamp"))
        with pytest.raises(JMSSecurityException):
            alice_session.create_consumer(Queue("orders"))  # she may not take orders
        with pytest.raises(JMSSecurityException):
            alice_session.create_producer(Queue("payroll"))  # no rule: denied
        # An anonymous producer is checked per message.
        anonymous = alice_session.create_producer(None)
        with pytest.raises(JMSSecurityException):
            anonymous.send(alice_session.create_text_message("raise"), Queue("payroll"))
        assert [m.get_body() for m in alice_session.create_browser(Queue("orders"))] == [
            "one lamp"
        ]

        bob_session = bob.create_session()
        with pytest.raises(JMSSecurityException):
            bob_session.create_browser(Queue("orders")).get_enumeration()  # no browse rule
        received = bob_session.create_consumer(Queue("orders")).receive(10)
        assert received is not None and received.get_body() == "one lamp"
        bob_session.create_producer(None).send(
            bob_session.create_text_message("shipped"), Queue("inbox/alice"))
        reply = alice_session.create_consumer(Queue("inbox/alice")).receive(10)
        assert reply is not None and reply.get_body() == "shipped"
    finally:
        alice.close()
        bob.close()


def test_a_refused_send_in_a_transaction_rolls_the_commit_back(acl_broker: BrokerProcess) -> None:
    """A transacted send returns without waiting for the broker (as Qpid JMS's): the refused
    one surfaces at commit(), which rolls the whole transaction back; the next one commits."""
    alice = connect(acl_broker, "alice", "wonderland")
    try:
        session = alice.create_session(True)
        anonymous = session.create_producer(None)
        anonymous.send(session.create_text_message("tx lamp"), Queue("orders"))
        anonymous.send(session.create_text_message("raise"), Queue("payroll"))  # denied
        with pytest.raises(TransactionRolledBackException):
            session.commit()
        anonymous.send(session.create_text_message("tx chair"), Queue("orders"))
        session.commit()
        browsed = [m.get_body() for m in alice.create_session().create_browser(Queue("orders"))]
        assert "tx lamp" not in browsed and "tx chair" in browsed
    finally:
        alice.close()


def test_topic_rules_filter_a_jms_subscriber_by_its_user(acl_broker: BrokerProcess) -> None:
    alice = connect(acl_broker, "alice", "wonderland")
    bob = connect(acl_broker, "bob", "builder")
    try:
        alice_session = alice.create_session()
        consumer = alice_session.create_consumer(Topic("news/#"))  # granted: news/ is hers
        with pytest.raises(JMSSecurityException):
            alice_session.create_consumer(Topic("news/hr/#"))  # wholly denied
        bob_session = bob.create_session()
        producer = bob_session.create_producer(None)
        producer.send(bob_session.create_text_message("pay rise"), Topic("news/hr/pay"))
        producer.send(bob_session.create_text_message("new lamps"), Topic("news/shop"))
        got = consumer.receive(10)
        assert got is not None and got.get_body() == "new lamps"
        assert consumer.receive(0.5) is None  # news/hr/pay never reached her
        with pytest.raises(JMSSecurityException):
            alice_session.create_producer(None).send(
                alice_session.create_text_message("fake"), Topic("news/shop"))
    finally:
        alice.close()
        bob.close()


def test_sighup_applies_new_queue_rules_to_a_connected_jms_client(broker) -> None:
    """alice stays connected through the reload; her next send to a queue she may no
    longer send to is refused, and the queue she now may use is open to her. (Without a
    password file the user name is taken on trust.)"""
    process = broker(
        amqp=True,
        store={"backend": "memory"},
        auth={"acl": [{"users": ["alice"], "send": ["orders"]}]},
    )
    alice = connect(process, "alice", "any")
    try:
        session = alice.create_session()
        anonymous = session.create_producer(None)
        anonymous.send(session.create_text_message("before"), Queue("orders"))
        with pytest.raises(JMSSecurityException):
            anonymous.send(session.create_text_message("not yet"), Queue("returns"))
        process.rewrite_config(auth={"acl": [{"users": ["alice"], "send": ["returns"]}]})
        sighup(process, RELOADED, 1)
        with pytest.raises(JMSSecurityException):
            anonymous.send(session.create_text_message("after"), Queue("orders"))
        anonymous.send(session.create_text_message("after"), Queue("returns"))
        with pytest.raises(JMSSecurityException):
            session.create_producer(Queue("orders"))
    finally:
        alice.close()
