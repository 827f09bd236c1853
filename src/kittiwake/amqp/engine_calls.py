"""python-qpid-proton's C engine calls, reached without its Python wrappers, for the few
operations every message goes through.

proton's Python layer wraps every engine event in an ``Event`` that builds a wrapper for its
delivery, link, session, connection and transport (each looking up and reference-counting its
C object), and wraps every new delivery the same way: measured, that was most of the broker's
CPU per AMQP message. The hot paths (an event's type, a transfer's bytes, a delivery sent)
call the C functions here directly; everything else keeps using proton's classes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cproton_ffi import ffi as _ffi  # type: ignore[import-not-found]
from cproton_ffi import lib as _lib
from proton import Delivery, Event, Link

from kittiwake.proton_calls import remote_state_fields as remote_state_fields
from kittiwake.proton_calls import scratch as _scratch

# Event types (pn_event_type_t).
DELIVERY: int = _lib.PN_DELIVERY
LINK_FLOW: int = _lib.PN_LINK_FLOW
# The event types the connection handles beyond those two (the rest are only counted by the
# engine: init, bound, local open, transport...).
HANDLED: frozenset[int] = frozenset(
    (
        _lib.PN_LINK_REMOTE_OPEN,
        _lib.PN_LINK_REMOTE_CLOSE,
        _lib.PN_LINK_REMOTE_DETACH,
        _lib.PN_SESSION_REMOTE_OPEN,
        _lib.PN_SESSION_REMOTE_CLOSE,
        _lib.PN_CONNECTION_REMOTE_OPEN,
        _lib.PN_CONNECTION_REMOTE_CLOSE,
    )
)
LOCAL_ACTIVE: int = _lib.PN_LOCAL_ACTIVE

# proton's wrappers of a C object, for when one is needed after all (untyped in proton).
wrap_delivery: Callable[[Any], Delivery] = Delivery.wrap
wrap_link: Callable[[Any], Link] = Link.wrap
wrap_event: Callable[[Any], Event] = Event.wrap

connection_state: Callable[[Any], int] = _lib.pn_connection_state
transport_pending: Callable[[Any], int] = _lib.pn_transport_pending
transport_capacity: Callable[[Any], int] = _lib.pn_transport_capacity
transport_closed: Callable[[Any], bool] = _lib.pn_transport_closed
REMOTE_CLOSED: int = _lib.PN_REMOTE_CLOSED
EOS: int = _lib.PN_EOS
# Delivery states (outcomes) as the C engine numbers them.
ACCEPTED: int = _lib.PN_ACCEPTED
REJECTED: int = _lib.PN_REJECTED
RELEASED: int = _lib.PN_RELEASED
MODIFIED: int = _lib.PN_MODIFIED
collector_peek: Callable[[Any], Any] = _lib.pn_collector_peek
collector_pop: Callable[[Any], Any] = _lib.pn_collector_pop
event_type: Callable[[Any], int] = _lib.pn_event_type
event_delivery: Callable[[Any], Any] = _lib.pn_event_delivery
event_link: Callable[[Any], Any] = _lib.pn_event_link
delivery_link: Callable[[Any], Any] = _lib.pn_delivery_link
delivery_settle: Callable[[Any], None] = _lib.pn_delivery_settle
delivery_update: Callable[[Any, int], None] = _lib.pn_delivery_update
delivery_readable: Callable[[Any], bool] = _lib.pn_delivery_readable
delivery_partial: Callable[[Any], bool] = _lib.pn_delivery_partial
delivery_pending: Callable[[Any], int] = _lib.pn_delivery_pending
delivery_settled: Callable[[Any], bool] = _lib.pn_delivery_settled
delivery_remote_state: Callable[[Any], int] = _lib.pn_delivery_remote_state
delivery_remote: Callable[[Any], Any] = _lib.pn_delivery_remote
disposition_is_failed: Callable[[Any], bool] = _lib.pn_disposition_is_failed
disposition_is_undeliverable: Callable[[Any], bool] = _lib.pn_disposition_is_undeliverable
_unpack = _ffi.unpack
link_state: Callable[[Any], int] = _lib.pn_link_state
link_advance: Callable[[Any], bool] = _lib.pn_link_advance
link_credit: Callable[[Any], int] = _lib.pn_link_credit
link_get_drain: Callable[[Any], bool] = _lib.pn_link_get_drain
link_flow: Callable[[Any, int], None] = _lib.pn_link_flow
_link_recv = _lib.pn_link_recv
_link_send = _lib.pn_link_send
_new_delivery = _lib.pn_delivery
_transport_pending = _lib.pn_transport_pending
_transport_peek = _lib.pn_transport_peek
_transport_pop = _lib.pn_transport_pop
_transport_push = _lib.pn_transport_push
_from_buffer = _ffi.from_buffer
_cast = _ffi.cast


def address(impl: Any) -> int:
    """A C object's address: the key of its Python-side state (proton's wrappers hash so)."""
    return int(_cast("uint64_t", impl))


def receive(link: Any, size: int) -> bytes:
    """The current incoming delivery's bytes (``size``: what it has pending)."""
    buffer = _scratch.at_least(size)
    got = _link_recv(link, buffer, size)
    if got < 0:
        return b""
    return bytes(_unpack(buffer, got))


def send(link: Any, tag: bytes, encoded: bytes) -> Any:
    """A new outgoing delivery with ``tag`` holding ``encoded``, the link advanced past it;
    returns the delivery's C object. (A bytes argument is passed to C as it is.)"""
    delivery = _new_delivery(link, (len(tag), _from_buffer(tag)))
    _link_send(link, _c_bytes(encoded), len(encoded))
    _lib.pn_link_advance(link)
    return delivery


# pn_transport_push itself, for a caller holding a bytes object (passed to C as it is): one
# Python call fewer than transport_push on every read.
transport_push_bytes: Callable[[Any, bytes, int], int] = _lib.pn_transport_push


def transport_push(transport: Any, data: bytes | bytearray | memoryview) -> int:
    """Hand ``data`` to the engine (not copied by Python); what it took, or an error code."""
    return int(_transport_push(transport, _c_bytes(data), len(data)))


def _c_bytes(data: bytes | bytearray | memoryview) -> Any:
    """``data`` as a C call takes it: a bytes object as it is (cffi passes its own buffer),
    any other buffer (a bytearray, a view) through ``ffi.from_buffer``."""
    return data if type(data) is bytes else _from_buffer(data)


_delivery_local = _lib.pn_delivery_local
_disposition_data = _lib.pn_disposition_data
_data_decode = _lib.pn_data_decode
_data_clear = _lib.pn_data_clear


def update_with_fields(delivery: Any, state: int, fields: bytes) -> None:
    """Set a delivery's local state to ``state`` with the fields encoded in ``fields`` (a
    transactional state's list), as proton's ``Delivery.update`` does with its local data."""
    data = _disposition_data(_delivery_local(delivery))
    _data_clear(data)
    if _data_decode(data, fields, len(fields)) != len(fields):
        raise ValueError("undecodable state fields")
    _lib.pn_delivery_update(delivery, state)


def take_output(transport: Any, pending: int | None = None) -> bytes | None:
    """The bytes the engine has ready to write, taken out of it; None when there are none.
    ``pending``: the engine's pending count, when the caller has just read it."""
    if pending is None:
        pending = _transport_pending(transport)
    if pending <= 0:
        return None
    buffer = _scratch.at_least(pending)
    got = _transport_peek(transport, buffer, pending)
    if got < 0:
        return None
    _transport_pop(transport, got)
    return bytes(_unpack(buffer, got))
