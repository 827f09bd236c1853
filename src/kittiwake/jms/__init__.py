"""kittiwake.jms: a JMS 2.0-shaped Python API over AMQP 1.0 (the AMQP JMS mapping, as Qpid
JMS speaks it). ``kittiwake.jms.aio`` is the asyncio core; the names here are the blocking
API a Java developer recognises, a thin layer over it."""

from kittiwake.jms import aio
from kittiwake.jms.aio import AcknowledgeMode, ConnectionState
from kittiwake.jms.blocking import (
    Connection,
    ConnectionFactory,
    JMSConsumer,
    JMSContext,
    JMSProducer,
    MessageConsumer,
    MessageListener,
    MessageProducer,
    QueueBrowser,
    Session,
)
from kittiwake.jms.destinations import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic
from kittiwake.jms.exceptions import (
    IllegalStateException,
    InvalidClientIDException,
    InvalidDestinationException,
    InvalidSelectorException,
    JMSException,
    JMSRuntimeException,
    JMSSecurityException,
    MessageEOFException,
    MessageFormatException,
    MessageNotReadableException,
    MessageNotWriteableException,
    ResourceAllocationException,
    TransactionInProgressException,
    TransactionRolledBackException,
)
from kittiwake.jms.messages import (
    BytesMessage,
    DeliveryMode,
    MapMessage,
    Message,
    ObjectMessage,
    StreamMessage,
    TextMessage,
)

AUTO_ACKNOWLEDGE = AcknowledgeMode.AUTO_ACKNOWLEDGE
CLIENT_ACKNOWLEDGE = AcknowledgeMode.CLIENT_ACKNOWLEDGE
DUPS_OK_ACKNOWLEDGE = AcknowledgeMode.DUPS_OK_ACKNOWLEDGE
SESSION_TRANSACTED = AcknowledgeMode.SESSION_TRANSACTED
INDIVIDUAL_ACKNOWLEDGE = AcknowledgeMode.INDIVIDUAL_ACKNOWLEDGE
NO_ACKNOWLEDGE = AcknowledgeMode.NO_ACKNOWLEDGE
PRE_ACKNOWLEDGE = AcknowledgeMode.PRE_ACKNOWLEDGE
PERSISTENT = DeliveryMode.PERSISTENT
NON_PERSISTENT = DeliveryMode.NON_PERSISTENT

__all__ = [
    "AUTO_ACKNOWLEDGE",
    "CLIENT_ACKNOWLEDGE",
    "DUPS_OK_ACKNOWLEDGE",
    "INDIVIDUAL_ACKNOWLEDGE",
    "NON_PERSISTENT",
    "NO_ACKNOWLEDGE",
    "PERSISTENT",
    "PRE_ACKNOWLEDGE",
    "SESSION_TRANSACTED",
    "AcknowledgeMode",
    "BytesMessage",
    "Connection",
    "ConnectionFactory",
    "ConnectionState",
    "DeliveryMode",
    "Destination",
    "IllegalStateException",
    "InvalidClientIDException",
    "InvalidDestinationException",
    "InvalidSelectorException",
    "JMSConsumer",
    "JMSContext",
    "JMSException",
    "JMSProducer",
    "JMSRuntimeException",
    "JMSSecurityException",
    "MapMessage",
    "Message",
    "MessageConsumer",
    "MessageEOFException",
    "MessageFormatException",
    "MessageListener",
    "MessageNotReadableException",
    "MessageNotWriteableException",
    "MessageProducer",
    "ObjectMessage",
    "Queue",
    "QueueBrowser",
    "ResourceAllocationException",
    "Session",
    "StreamMessage",
    "TemporaryQueue",
    "TemporaryTopic",
    "TextMessage",
    "Topic",
    "TransactionInProgressException",
    "TransactionRolledBackException",
    "aio",
]
