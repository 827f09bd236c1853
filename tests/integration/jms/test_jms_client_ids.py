"""One client-id registry across protocols (DESIGN.md section 5): the newcomer's protocol
decides. A JMS connection with an id an MQTT client holds is refused
(InvalidClientIDException); an MQTT client connecting with an id a JMS connection holds takes
it over, as MQTT's own rule says (MQTT-3.1.4-3), and the JMS connection's ExceptionListener
hears that it was closed."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from kittiwake.jms import (
    Connection,
    ConnectionFactory,
    InvalidClientIDException,
    JMSException,
)

from ..brokerproc import BrokerProcess
from ..clients import PahoClient, unique

Connect = Callable[..., Connection]


def test_jms_is_refused_an_id_an_mqtt_client_holds(
    jms_url: str, paho: Callable[..., PahoClient], jms_broker: BrokerProcess
) -> None:
    client_id = unique("held-by-mqtt")
    mqtt = paho(jms_broker.address, client_id)
    with pytest.raises(InvalidClientIDException):
        ConnectionFactory(jms_url, client_id=client_id).create_connection()
    # The MQTT client is unharmed, and once it is gone the id is free for JMS.
    assert mqtt.subscribe(unique("t"), 1) == [1]
    mqtt.disconnect()
    ConnectionFactory(jms_url, client_id=client_id).create_connection().close()


def test_an_mqtt_connect_takes_the_id_over_from_jms(
    connect: Connect, paho: Callable[..., PahoClient], jms_broker: BrokerProcess
) -> None:
    client_id = unique("held-by-jms")
    jms = connect(client_id=client_id)
    heard: list[JMSException] = []
    closed = threading.Event()

    def listener(error: JMSException) -> None:
        heard.append(error)
        closed.set()

    jms.set_exception_listener(listener)
    mqtt = paho(jms_broker.address, client_id)
    assert mqtt.subscribe(unique("t"), 1) == [1], "the MQTT client has the id"
    assert closed.wait(10), "the JMS connection was told"
    assert "taken over" in str(heard[0])
    with pytest.raises(JMSException, match="taken over"):
        jms.create_session()  # the connection failed, and says why
    # Now held by MQTT: a JMS connection with it is refused.
    with pytest.raises(InvalidClientIDException):
        connect(client_id=client_id)

