"""python-qpid-proton's C engine calls, reached without its Python wrappers: what the
broker's AMQP front end (``kittiwake.amqp.engine_calls``) and the JMS client
(``kittiwake.jms.engine``) both call for every message.

proton's Python layer wraps every engine event in an ``Event`` that builds a wrapper for its
delivery, link, session, connection and transport, and wraps every new delivery the same way;
both sides measured that as most of their CPU per message, so their hot paths call the C
functions directly. This module is neutral (it imports nothing of kittiwake), so the client
shares it without importing a broker module. Names are bound once at import: a call costs the
same as through the module that used to hold it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from cproton_ffi import ffi as _ffi  # type: ignore[import-not-found]
from cproton_ffi import lib as _lib

lib: Any = _lib
ffi: Any = _ffi

collector_peek: Callable[[Any], Any] = _lib.pn_collector_peek
collector_pop: Callable[[Any], Any] = _lib.pn_collector_pop
event_type: Callable[[Any], int] = _lib.pn_event_type
event_delivery: Callable[[Any], Any] = _lib.pn_event_delivery
delivery_link: Callable[[Any], Any] = _lib.pn_delivery_link
delivery_settle: Callable[[Any], None] = _lib.pn_delivery_settle
delivery_update: Callable[[Any, int], None] = _lib.pn_delivery_update
delivery_readable: Callable[[Any], bool] = _lib.pn_delivery_readable
delivery_partial: Callable[[Any], bool] = _lib.pn_delivery_partial
delivery_updated: Callable[[Any], bool] = _lib.pn_delivery_updated
delivery_pending: Callable[[Any], int] = _lib.pn_delivery_pending
delivery_settled: Callable[[Any], bool] = _lib.pn_delivery_settled
delivery_remote_state: Callable[[Any], int] = _lib.pn_delivery_remote_state
delivery_remote: Callable[[Any], Any] = _lib.pn_delivery_remote
link_advance: Callable[[Any], bool] = _lib.pn_link_advance
link_credit: Callable[[Any], int] = _lib.pn_link_credit
link_recv: Any = _lib.pn_link_recv
link_send: Any = _lib.pn_link_send
new_delivery: Any = _lib.pn_delivery
transport_capacity: Callable[[Any], int] = _lib.pn_transport_capacity
transport_pending: Callable[[Any], int] = _lib.pn_transport_pending
transport_peek: Any = _lib.pn_transport_peek
transport_pop: Any = _lib.pn_transport_pop
transport_push_raw: Any = _lib.pn_transport_push
unpack: Any = _ffi.unpack
from_buffer: Any = _ffi.from_buffer
_delivery_tag = _lib.pn_delivery_tag
_disposition_data = _lib.pn_disposition_data
_data_encoded_size = _lib.pn_data_encoded_size
_data_encode = _lib.pn_data_encode


def delivery_tag(delivery: Any) -> bytes:
    """A delivery's tag as bytes (proton's wrapper decodes it as UTF-8 text)."""
    tag = _delivery_tag(delivery)
    return bytes(unpack(tag.start, tag.size))


class Scratch(threading.local):
    """A C buffer the engine copies into (a transfer's bytes, its output), reused: one per
    thread (C calls release the GIL, so threads cannot share one; each use is a copy in and
    a copy out with nothing in between). Passing a new bytearray through ``ffi.from_buffer``
    instead cost more than the copy itself on every call."""

    def __init__(self) -> None:
        self.size = 64 * 1024
        self.buffer: Any = _ffi.new("char[]", self.size)

    def at_least(self, size: int) -> Any:
        if size > self.size:
            self.size = max(size, 2 * self.size)
            self.buffer = _ffi.new("char[]", self.size)
        return self.buffer


scratch = Scratch()


def remote_state_fields(delivery: Any) -> bytes | None:
    """The encoding of the fields of a delivery's remote state when it is one proton does
    not read itself (a transactional state: a list); None when it has none. Three C calls,
    where proton's ``Data`` wrapper and its ``get_object`` cost tens of microseconds on every
    transactional transfer (the broker) and transactional send's outcome (the client)."""
    data = _disposition_data(_lib.pn_delivery_remote(delivery))
    size = _data_encoded_size(data)
    if size <= 0:
        return None
    buffer = scratch.at_least(size)
    got = _data_encode(data, buffer, size)
    if got <= 0:
        return None
    return bytes(unpack(buffer, got))
