"""The JMS exception hierarchy, named as in javax.jms / jakarta.jms so a Java developer finds
them; each carries the AMQP condition that caused it when there was one. Raises nothing itself."""

from __future__ import annotations


class JMSException(Exception):
    """Root of every JMS error; ``error_code`` is the AMQP condition when the broker sent one."""

    def __init__(self, reason: str, error_code: str | None = None) -> None:
        super().__init__(reason)
        self.error_code = error_code


class IllegalStateException(JMSException):
    pass


class InvalidClientIDException(JMSException):
    pass


class InvalidDestinationException(JMSException):
    pass


class InvalidSelectorException(JMSException):
    pass


class JMSSecurityException(JMSException):
    pass


class MessageFormatException(JMSException):
    pass


class MessageNotReadableException(JMSException):
    pass


class MessageNotWriteableException(JMSException):
    pass


class MessageEOFException(JMSException):
    pass


class ResourceAllocationException(JMSException):
    pass


class TransactionInProgressException(JMSException):
    pass


class TransactionRolledBackException(JMSException):
    pass


class JMSRuntimeException(RuntimeError):
    """JMS 2.0's unchecked counterpart, raised by JMSContext and its producers and consumers."""

    def __init__(self, reason: str, error_code: str | None = None) -> None:
        super().__init__(reason)
        self.error_code = error_code


_BY_CONDITION: dict[str, type[JMSException]] = {
    "amqp:not-found": InvalidDestinationException,
    "amqp:unauthorized-access": JMSSecurityException,
    "amqp:invalid-field": JMSException,
    "amqp:resource-limit-exceeded": ResourceAllocationException,
    "amqp:transaction:rollback": TransactionRolledBackException,
    "amqp:transaction:unknown-id": TransactionRolledBackException,
    "amqp:illegal-state": IllegalStateException,
}


def from_condition(
    condition: str | None, description: str | None, default: type[JMSException] = JMSException
) -> JMSException:
    """The JMS exception for an AMQP error condition (what Qpid JMS maps it to)."""
    name = condition or ""
    kind = _BY_CONDITION.get(name, default)
    if name == "amqp:invalid-field" and description and "selector" in description:
        kind = InvalidSelectorException
    return kind(f"{description or 'refused'} ({name or 'no condition'})", name or None)
