"""One MQTT client connection: turns decoded packets into broker calls and broker deliveries
into packets.

It never touches a socket or the event loop: bytes go out through the :class:`Transport` it is
given, the asyncio shell in :mod:`kittiwake.mqtt.server` feeds it decoded packets, and what needs
the loop is a callable that shell injects (``call_soon``, and the login's password check). So a
unit test drives it with bytes alone (tests/unit/mqtt/connection_harness.py). No delivery rule lives
here: who gets what, at which QoS, is the broker's business; so is what must be durable before
an answer goes out (each answer waits on the completion of the core call it reports, never on
the store), and answers leave in the order of the packets they answer.
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar, Final, Protocol, TypeAlias

from kittiwake.broker.authentication import Authentication, Principal, Refusal
from kittiwake.broker.authorization import RenewPermissions
from kittiwake.broker.broker import Broker, Subscribed, SubscribeRefusal, SubscriptionOptions
from kittiwake.broker.completion import NOT_FOUND, Completion, all_of
from kittiwake.broker.connection_admission import AdmissionRefusal
from kittiwake.broker.consumers import Delivery, DeliveryState
from kittiwake.broker.message import Message, MQTT5Fields
from kittiwake.broker.queues import QueuedMessage
from kittiwake.broker.sessions import NEVER_EXPIRES, Session
from kittiwake.broker.topics import (
    MAX_CACHED_TOPIC_CHARS,
    TopicError,
    parse_shared,
    validate_topic_name,
)
from kittiwake.logs import ConnectionLog, connection_log
from kittiwake.mqtt.answers import encode_answer, response_information
from kittiwake.mqtt.codec import (
    encode_ack,
    encode_puback,
    encode_publish,
    encode_publish_head,
    encode_suback_v3,
)
from kittiwake.mqtt.errors import MQTTProtocolError, UnsupportedProtocolVersionError, quoted
from kittiwake.mqtt.login import Login, PendingVerdict, refusal_code
from kittiwake.mqtt.packet_ids import MAX_PACKET_ID, OutgoingPacketIds
from kittiwake.mqtt.packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PubAck,
    PubAckRun,
    PubComp,
    Publish,
    PublishRun,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
)
from kittiwake.mqtt.properties import Properties, encode_properties
from kittiwake.mqtt.reason_codes import SUBACK_FAILURE_V3, ConnectReturnCode, ReasonCode

log = logging.getLogger(__name__)

PINGRESP = b"\xd0\x00"
_PUBLISH = 3
_ADMISSION_REASON = {
    AdmissionRefusal.RATE: ReasonCode.CONNECTION_RATE_EXCEEDED,
    AdmissionRefusal.QUOTA: ReasonCode.QUOTA_EXCEEDED,
}
_REFUSAL_REASON = {
    SubscribeRefusal.INVALID_FILTER: ReasonCode.TOPIC_FILTER_INVALID,
    SubscribeRefusal.NOT_AUTHORIZED: ReasonCode.NOT_AUTHORIZED,
    SubscribeRefusal.QUOTA_EXCEEDED: ReasonCode.QUOTA_EXCEEDED,
}


class Transport(Protocol):
    """The byte pipe under a connection; writes are coalesced by the implementation."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def write_backlog(self) -> int:
        """Bytes written but not yet sent; QoS 0 messages are dropped above a limit."""


class PeerName(Protocol):
    """Where a connection's peer address comes from when asked (the socket's shell)."""

    def peer_text(self) -> str:
        """The client's address as text ("host:port"), for logs and the console."""


# Runs a callable on a later turn of the event loop (the shell passes ``loop.call_soon``).
CallSoon = Callable[[Callable[[], None]], object]


class MQTTConnection:
    """The protocol state machine of one connection (awaiting CONNECT → connected → closed).

    Slotted, and what an idle connection never uses is not made for it: a 5.0 client's topic
    alias maps are made by its CONNECT, the packet-id map by the first QoS 1/2 delivery, the
    held input by a password check; the login is dropped once the CONNECT is accepted (and
    publish verdicts live on the principal's shared Permissions). Ten thousand idle
    connections then carry none of these.
    """

    __slots__ = (
        "_answers",
        "_awaiting_commit",
        "_call_soon",
        "_checking",
        "_connect_seen",
        "_held_bytes",
        "_held_input",
        "_incoming_aliases",
        "_limits",
        "_login",
        "_max_backlog",
        "_outgoing_aliases",
        "_packet_ids",
        "_peer",
        "_problem_information",
        "_publish_heads",
        "_watched",
        "admission_refusal",
        "broker",
        "client_id",
        "closed",
        "keepalive",
        "last_received",
        "peer_max_packet_size",
        "peer_topic_alias_maximum",
        "permissions",
        "principal",
        "protocol_version",
        "reading_paused",
        "session",
        "traffic",
        "transport",
    )

    def __init__(
        self,
        broker: Broker,
        transport: Transport,
        peer: str | PeerName = "?",
        login: Login | None = None,
        *,
        call_soon: CallSoon | None = None,
    ) -> None:
        self.broker = broker
        self.transport = transport
        # The client's address as text, or where to get it when asked (the shell: a
        # formatted copy kept per connection would cost each idle one 64 bytes).
        self._peer = peer
        # Defers work to a later loop turn; without a loop (unit tests) it runs at once.
        self._call_soon: CallSoon = _call_now if call_soon is None else call_soon
        # MQTT's message counts (/metrics): one increment per publication each way.
        self.traffic = broker.stats.protocol("mqtt")
        self.session: Session | None = None
        # Who the client is, once its CONNECT's credentials checked out.
        self.principal: Principal | None = None
        # Until the CONNECT is accepted (None after: a connection logs in once).
        self._login: Login | None = login or _default_login(broker)
        # While a password is being checked: the check, and the packets that came after the
        # CONNECT meanwhile (handled once it is accepted; None until one comes).
        self._checking: PendingVerdict | None = None
        self._held_input: list[Packet] | None = None
        self.protocol_version = 4
        self.client_id = ""
        self.keepalive = 0
        self.last_received = broker.clock.now()
        self.closed = False
        # A CONNECT was decoded, so a v5 client can be answered with a CONNACK reason code.
        self._connect_seen = False
        # Set when the broker did not admit this connection (too many, or too fast, from its
        # address): its CONNECT is refused with the reason.
        self.admission_refusal: AdmissionRefusal | None = None
        limits = broker.config.limits
        # Peer limits (v5 CONNECT properties); defaults are the protocol's.
        self.peer_max_packet_size = 268_435_460
        self.peer_topic_alias_maximum = 0
        # Topic aliases, 5.0 only: the shared empty map until a 5.0 CONNECT (never written to).
        self._outgoing_aliases: dict[str, int] = _NO_ALIASES
        # Our QoS 1/2 PUBLISHes in flight: packet id -> the core's delivery. The shared empty
        # map (never written to) until the first delivery needs an id (see _own_packet_ids).
        self._packet_ids: OutgoingPacketIds = _NO_PACKET_IDS
        self._incoming_aliases: dict[int, str] = _NO_ALIASES
        self._problem_information = True
        # Answers not yet written, in the order of the packets they answer: each waits for
        # its completion and for every answer before it (see _answer). Made by the first
        # answer that has to wait: an idle connection never needs the deque's 760 bytes.
        self._answers: deque[_Answer] | None = None
        # The completion whose callback was last registered, so the acknowledgements of a run
        # of publications in one commit register one callback, not one each.
        self._watched: Completion = None
        # QoS 1 publications whose PUBACK is held (store commit, flow control, an earlier
        # answer); with the session's exactly_once_keys (which already include held QoS 2
        # ones) they make up the client's use of our Receive Maximum.
        self._awaiting_commit = 0
        # Payload bytes of the publications whose answer waits; above publisher_pause_bytes
        # the broker stops reading from this connection until half of them are answered, so
        # a publisher held back by flow control cannot push in more than that meanwhile.
        self._held_bytes = 0
        self.reading_paused = False
        # The broker's limits, shared: read where they apply, but for the one read per
        # delivery, kept in a slot of its own (a slot per limit would cost each idle
        # connection a size class, 16 bytes).
        self._limits = limits
        self._max_backlog = limits.max_queued_bytes
        # What this connection's principal may do (set once its CONNECT is accepted).
        self.permissions = broker.authorizer.permissions(None, "")
        # The start of the QoS 1/2 PUBLISH this connection was last sent per topic, with the
        # payload size and level it was made for: a run of messages on one topic (a 1->1 or
        # N->1 flow) encodes it once, not once per message. None until the first.
        self._publish_heads: dict[str, tuple[int, int, bytes]] | None = None

    def permissions_renewed(self, renew: RenewPermissions) -> None:
        """The rules were reloaded (SIGHUP): from now on this connection is checked by its
        principal's new ones (whose publish verdicts start empty: the old stay with the old)."""
        if self.session is None:
            return  # not connected yet: CONNECT will ask for the rules in force then
        principal = self.principal
        self.permissions = renew(principal.name if principal is not None else None, self.client_id)

    @property
    def peer(self) -> str:
        peer = self._peer
        return peer if isinstance(peer, str) else peer.peer_text()

    @property
    def _log(self) -> ConnectionLog:
        """The module's logger, its records tagged with this connection's id (the client id
        once known, its address before)."""
        return connection_log(log, self.client_id or self.peer)

    # -- input ----------------------------------------------------------------------------

    def handle(self, packet: Packet) -> None:
        """Act on one decoded packet; protocol breaches raise MQTTProtocolError.

        The transport stamps ``last_received`` once per read, not here once per packet.
        """
        if self.session is None:
            if self._checking is not None:
                if self._held_input is None:
                    self._held_input = []
                self._held_input.append(packet)
                return
            if isinstance(packet, Connect):
                self._on_connect(packet)
                return
            raise MQTTProtocolError(ReasonCode.PROTOCOL_ERROR, "the first packet must be CONNECT")
        handler = self._handlers.get(type(packet))
        if handler is None:
            raise MQTTProtocolError(
                ReasonCode.PROTOCOL_ERROR, f"a client may not send {type(packet).__name__}"
            )
        handler(self, packet)

    def handle_all(self, packets: list[Packet]) -> None:
        """Act on the packets of one read in order, until one closes the connection:
        :meth:`handle`'s dispatch written out for a session's packets, a call less per packet
        (PUBLISH and PUBACK are every message's path)."""
        if self.session is None:
            # Before CONNECT (which may come in this read): :meth:`handle` decides each.
            for packet in packets:
                self.handle(packet)
                if self.closed:
                    return
            return
        # Connected: the session goes only with the connection (taken over, closed).
        handlers = self._handlers
        session = self.session
        # _on_puback, for a run of PUBACKs (a subscriber's reads are runs of them, one per
        # delivery): their deliveries, settled in one call before the next other packet.
        acknowledged: list[Delivery] | None = None
        for packet in packets:
            if type(packet) is PubAckRun:
                # The decoder's run of plain PUBACKs: ids, no PubAck object each.
                pop = self._packet_ids.pop
                if acknowledged is None:
                    acknowledged = []
                for packet_id in packet.packet_ids:
                    delivery = pop(packet_id, None)
                    if delivery is not None:
                        acknowledged.append(delivery)
                continue
            if isinstance(packet, PubAck):
                delivery = self._packet_ids.pop(packet.packet_id, None)
                if delivery is not None:
                    if acknowledged is None:
                        acknowledged = [delivery]
                    else:
                        acknowledged.append(delivery)
                continue
            if acknowledged is not None:
                if acknowledged:
                    self.broker.acknowledge_all(session, acknowledged)
                acknowledged = None
                if self.closed:
                    return
            handler = handlers.get(type(packet))
            if handler is None:
                self.handle(packet)  # a packet a client may not send
            else:
                handler(self, packet)
            if self.closed:
                return
        if acknowledged:
            self.broker.acknowledge_all(session, acknowledged)

    def protocol_error(self, error: MQTTProtocolError, decoded_version: int = 4) -> None:
        """The peer broke the protocol: answer as its version says, then close.

        ``decoded_version`` is the level the decoder read from a CONNECT it then found
        malformed, so a 5.0 client still gets a CONNACK with the reason code (MQTT 5 §3.1.4).
        """
        self._log.info(
            "client %s (%s): protocol error: %s", self.client_id or "-", self.peer, error
        )
        if self.closed:
            return
        if self.session is None:
            if isinstance(error, UnsupportedProtocolVersionError):
                # A level we do not know: answer in the 3.1.1 form every level understands.
                self._send(ConnAck(False, ConnectReturnCode.UNACCEPTABLE_PROTOCOL_VERSION), 4)
            elif (self.protocol_version == 5 and self._connect_seen) or (
                decoded_version == 5 and not self._connect_seen
            ):
                self._send(ConnAck(False, error.reason_code), 5)
        elif self.protocol_version == 5:
            self._disconnect_with(error.reason_code, str(error))
        self._close(publish_will=True)

    def connection_lost(self) -> None:
        """The socket is gone; an unannounced loss publishes the will."""
        if not self.closed:
            self._close(publish_will=True)

    def keepalive_expired(self, now: float) -> bool:
        """True when the client has been silent for 1.5x its keepalive (MQTT-3.1.2-24)."""
        if self.reading_paused:
            return False  # we are not reading it: its silence is ours
        return self.keepalive > 0 and now - self.last_received > 1.5 * self.keepalive

    def close_for_keepalive(self) -> None:
        self._log.info("client %s (%s): keepalive timeout", self.client_id, self.peer)
        if self.protocol_version == 5:
            self._disconnect_with(ReasonCode.KEEP_ALIVE_TIMEOUT)
        self._close(publish_will=True)

    def shutdown(self) -> None:
        """The broker is stopping: tell v5 clients why, keep wills (not the client's fault)."""
        if self.closed:
            return
        if self.protocol_version == 5 and self.session is not None:
            self._disconnect_with(ReasonCode.SERVER_SHUTTING_DOWN)
        self._close(publish_will=False, keep_will=True)

    def close_by_operator(self) -> None:
        """An operator disconnects the client: v5 is told why (Administrative action); its
        will goes out, as for any end the client did not ask for."""
        if self.closed:
            return
        self._log.info("client %s (%s): disconnected by an operator", self.client_id, self.peer)
        if self.protocol_version == 5 and self.session is not None:
            self._disconnect_with(ReasonCode.ADMINISTRATIVE_ACTION, "disconnected by an operator")
        self._close(publish_will=True)

    # -- CONNECT --------------------------------------------------------------------------

    def _on_connect(self, packet: Connect) -> None:
        self._connect_seen = True
        self.protocol_version = version = packet.protocol_version
        props = packet.properties
        if version == 5 and props.maximum_packet_size is not None:
            # Before any answer, refusals included (MQTT-3.1.2-24).
            self.peer_max_packet_size = props.maximum_packet_size
        if self.admission_refusal is not None:
            return self._refuse(
                _ADMISSION_REASON[self.admission_refusal], self.admission_refusal.value
            )
        broker = self.broker
        config = broker.config
        client_id = packet.client_id
        assigned: str | None = None
        if not client_id:
            if version < 5 and not packet.clean_start:
                # 3.1.1 [MQTT-3.1.3-8]: an empty id needs clean session = 1.
                return self._refuse(ConnectReturnCode.IDENTIFIER_REJECTED, "empty client id")
            client_id = assigned = broker.assign_client_id()
        if props.authentication_method is not None:
            return self._refuse(
                ReasonCode.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not supported"
            )
        if self.principal is None:
            login = self._login
            if login is None:  # not reached: a connection that has logged in is connected
                raise MQTTProtocolError(ReasonCode.PROTOCOL_ERROR, "a second CONNECT")
            verdict = login.check(packet.username, packet.password)
            if not isinstance(verdict, (Principal, Refusal)):
                # Pending: the password is being checked (off the loop, by the shell's verify).
                self._check_then_connect(packet, verdict)
                return None
            if isinstance(verdict, Refusal):
                return self._refuse_login(packet, verdict)
            self.principal = verdict
        max_keepalive = config.sessions.max_keepalive
        keepalive = packet.keepalive
        server_keepalive: int | None = None
        if max_keepalive and (keepalive == 0 or keepalive > max_keepalive):
            if version == 5:
                keepalive = server_keepalive = max_keepalive
            elif keepalive > max_keepalive:
                # 3.1.1 has no way to tell a client its keepalive changed (as mosquitto does).
                return self._refuse(
                    ConnectReturnCode.IDENTIFIER_REJECTED,
                    f"keepalive {keepalive}s exceeds max_keepalive {max_keepalive}s",
                )
        principal_name = self.principal.name if self.principal is not None else None
        self.permissions = broker.authorizer.permissions(principal_name, client_id)
        if packet.will is not None:
            try:
                validate_topic_name(packet.will.topic)
            except TopicError as exc:
                raise MQTTProtocolError(ReasonCode.TOPIC_NAME_INVALID, str(exc)) from None
            if not self.permissions.may_publish(packet.will.topic):
                return self._refuse(
                    ReasonCode.NOT_AUTHORIZED if version == 5 else ConnectReturnCode.NOT_AUTHORIZED,
                    f"will topic {quoted(packet.will.topic)} not allowed",
                )
        requested_expiry: int | None = None
        if version == 5:
            expiry = props.session_expiry_interval or 0
            cap = config.sessions.max_session_expiry
            if expiry > cap:
                requested_expiry = expiry = cap
            window = props.receive_maximum if props.receive_maximum is not None else 65535
            self.peer_topic_alias_maximum = props.topic_alias_maximum or 0
            self._outgoing_aliases = {}
            self._incoming_aliases = {}
            if props.request_problem_information == 0:
                self._problem_information = False
        else:
            expiry = (
                0
                if packet.clean_start
                else (config.sessions.persistent_session_expiry_v3 or NEVER_EXPIRES)
            )
            window = config.limits.max_inflight
        will_message, will_delay, will_expiry = self._will_message(packet, client_id)
        self.client_id = client_id
        self.keepalive = keepalive
        session, present, completion = broker.connect(
            client_id,
            self,
            clean_start=packet.clean_start,
            expiry_interval=expiry,
            window=window,
            will=will_message,
            will_delay=will_delay,
            will_expiry=will_expiry,
            principal=principal_name,
        )
        self.session = session
        # Logged in for good: the login (and the shell's password check it holds) can go.
        self._login = None
        if session.permissions is not self.permissions:
            # Delivery is filtered by what this principal may read (route plans): only the
            # plans of this session's filters hold its copies.
            session.permissions = self.permissions
            broker.routes.session_changed(session)
        self._log.info(
            "client %s connected from %s (user %s, MQTT %s, clean=%s, keepalive=%ss, present=%s)",
            client_id,
            self.peer,
            _user_text(self.principal),
            {3: "3.1", 4: "3.1.1", 5: "5.0"}[version],
            packet.clean_start,
            keepalive,
            present,
        )
        ack_props = Properties()
        if version == 5:
            limits = config.limits
            ack_props.receive_maximum = limits.receive_maximum
            ack_props.topic_alias_maximum = limits.topic_alias_maximum
            ack_props.maximum_packet_size = limits.max_packet_size
            ack_props.assigned_client_identifier = assigned
            ack_props.server_keep_alive = server_keepalive
            ack_props.session_expiry_interval = requested_expiry
            if props.request_response_information == 1:
                ack_props.response_information = response_information(client_id)
        connack = self._encode(ConnAck(present, 0, ack_props), version)
        if completion is None:
            self.transport.write(connack)
            broker.start_delivery(session)
            return
        # The CONNACK waits for the session's state to be durable. Delivery starts now (so
        # nothing routed meanwhile is sent twice), but everything written until the CONNACK
        # leaves waits behind it: the CONNACK is the first packet a client receives.
        held = _HeldOutput(self.transport)
        self.transport = held
        broker.start_delivery(session)
        self._answer(completion, b"", _CONNACK, then=lambda: self._connack_sent(held, connack))

    def _check_then_connect(self, packet: Connect, check: PendingVerdict) -> None:
        """A password is being hashed off the loop: hold the input until the verdict."""
        self._checking = check
        pause = getattr(self.transport, "pause_reading", None)
        if pause is not None:
            pause()

        def checked(_done: object) -> None:
            self._checking = None
            held, self._held_input = self._held_input or [], None
            if self.closed:
                return
            resume = getattr(self.transport, "resume_reading", None)
            if resume is not None and not self.reading_paused:
                resume()
            try:
                verdict = check.result()
            except Exception:
                self._log.exception("client %s: the credentials check failed", self.peer)
                verdict = Refusal.BAD_CREDENTIALS
            if isinstance(verdict, Refusal):
                self._refuse_login(packet, verdict)
                return
            self.principal = verdict
            try:
                self._on_connect(packet)
                for later in held:
                    if self.closed:
                        return
                    self.handle(later)
            except MQTTProtocolError as error:
                self.protocol_error(error, self.protocol_version)

        check.add_done_callback(checked)

    def _refuse_login(self, packet: Connect, refusal: Refusal) -> None:
        self._log.warning(
            "login refused: user %r, client id %r, from %s: %s",
            packet.username,
            quoted(packet.client_id),
            self.peer,
            refusal.value,
        )
        self._refuse(refusal_code(refusal, self.protocol_version), refusal.value)

    def _connack_sent(self, held: _HeldOutput, connack: bytes) -> None:
        self.transport = held.transport
        held.transport.write(b"".join([connack, *held.writes]))
        held.writes.clear()

    def _refuse_unstored_connect(self) -> None:
        """The session's state could not be stored: refuse, as for a server unavailable."""
        self._log.error("client %s: session not stored (store write failed)", self.client_id)
        held = self.transport
        if isinstance(held, _HeldOutput):
            self.transport = held.transport
        if self.protocol_version == 5:
            self._send(ConnAck(False, ReasonCode.SERVER_UNAVAILABLE), 5)
        else:
            self._send(ConnAck(False, ConnectReturnCode.SERVER_UNAVAILABLE), self.protocol_version)
        self._close(publish_will=False)

    def _will_message(
        self, packet: Connect, client_id: str
    ) -> tuple[Message | None, int, int | None]:
        """The will as a core message, its delay and its expiry interval (counted from when
        it is published, not from now)."""
        will = packet.will
        if will is None:
            return None, 0, None
        props = will.properties
        message = Message(
            topic=will.topic,
            payload=will.payload,
            qos=will.qos,
            retain=will.retain,
            persistent=will.qos > 0,
            origin=client_id,
            mqtt5=_mqtt5_fields(props),
        )
        return message, props.will_delay_interval or 0, props.message_expiry_interval

    def _refuse(self, code: int, why: str) -> None:
        self._log.info("client %s refused: %s", self.peer, why)
        code = int(code)
        if self.protocol_version == 5 and code < 0x80:
            code = {
                ConnectReturnCode.IDENTIFIER_REJECTED: ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                ConnectReturnCode.NOT_AUTHORIZED: ReasonCode.NOT_AUTHORIZED,
            }.get(ConnectReturnCode(code), ReasonCode.UNSPECIFIED_ERROR)
        elif self.protocol_version < 5 and code >= 0x80:
            code = {
                ReasonCode.NOT_AUTHORIZED: ConnectReturnCode.NOT_AUTHORIZED,
                ReasonCode.BAD_AUTHENTICATION_METHOD: ConnectReturnCode.NOT_AUTHORIZED,
            }.get(ReasonCode(code), ConnectReturnCode.SERVER_UNAVAILABLE)
        props = Properties()
        if self.protocol_version == 5:
            props.reason_string = why
        self._send(ConnAck(False, code, props), self.protocol_version)
        self._close(publish_will=False)

    # -- PUBLISH from the client ----------------------------------------------------------

    def _publish_verdict(self, topic: str) -> bool:
        """A topic name missing from the verdict cache: validated (a bad one closes the
        connection), then whether this client may publish to it, remembered. The cache is
        read by the callers themselves, so a hit costs no call."""
        try:
            validate_topic_name(topic, self._limits.max_topic_levels)
        except TopicError as exc:
            raise MQTTProtocolError(ReasonCode.TOPIC_NAME_INVALID, str(exc)) from None
        permissions = self.permissions
        allowed = permissions.may_publish(topic)
        permissions.remember_publish_verdict(topic, allowed)
        return allowed

    def _on_publish(self, packet: Publish) -> None:
        session = self.session
        assert session is not None
        self.traffic.messages_received += 1
        version = self.protocol_version
        props = packet.properties
        topic = packet.topic
        if version == 5 and props.topic_alias is not None:
            topic = self._resolve_alias(props.topic_alias, topic)
        allowed = self.permissions.publish_verdicts.get(topic)
        if allowed is None:
            allowed = self._publish_verdict(topic)
        qos = packet.qos
        packet_id = packet.packet_id or 0
        if qos == 2 and packet_id in session.exactly_once_keys:
            # A resend of a publication we already own: exactly once means do not route again.
            # Its PUBREC is an acknowledgement like the first: only once the original is stored.
            self._answer(
                self.broker.exactly_once_resent(session, packet_id), encode_ack(0x50, packet_id)
            )
            return
        if (
            qos
            and version == 5
            and self._awaiting_commit + len(session.exactly_once_keys)
            >= self._limits.receive_maximum
        ):
            raise MQTTProtocolError(
                ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                f"more than {self._limits.receive_maximum} unacknowledged QoS 1/2 publications",
            )
        if not allowed:
            self._log.info(
                "client %s (user %s, %s): publish to %s not authorised",
                self.client_id,
                _user_text(self.principal),
                self.peer,
                quoted(topic),
            )
            if qos == 1:
                self._answer(None, self._encode(PubAck(packet_id, self._denied_code()), version))
            elif qos == 2:
                self._answer(None, self._encode(PubRec(packet_id, self._denied_code()), version))
            return
        if qos == 0 and not packet.retain and self._forward(topic, packet):
            return
        # Positional, and origin set after: keyword arguments to a dataclass of this many
        # fields cost more than the rest of making the message.
        message = Message(topic, packet.payload, qos, packet.retain, qos > 0)
        message.origin = self.client_id
        if version == 5:
            self._copy_properties(props, message)
        if qos == 2:
            self.broker.begin_exactly_once(session, packet_id)
        commit = self.broker.publish(message)
        if qos == 0:
            return
        if version == 5 and packet.retain and self.broker.retained_too_large(message):
            self._answer_not_retained(session, message, commit, packet_id)
            return
        ack = encode_puback(packet_id) if qos == 1 else encode_ack(0x50, packet_id)
        if commit is None and not self._answers:
            self.transport.write(ack)
            return
        kind = _PUBACK if qos == 1 else _PUBREC
        self._answer(commit, ack, kind, packet_id, None, len(message.payload))

    def _on_publish_run(self, run: PublishRun) -> None:
        """The decoder's run of plain 3.x QoS 1 PUBLISHes on one topic (a publisher's flood):
        :meth:`_on_publish` for each, with what depends on the topic alone (its validity, the
        publish verdict) decided once for the run, and the PUBACKs that need not wait written
        together. The broker takes the run at once (Broker.publish_run) with the one-by-one
        outcome, so every delivery rule (flow control, noLocal, the store's batches) decides
        each publication as it would one by one."""
        topic = run.topic
        allowed = self.permissions.publish_verdicts.get(topic)
        if allowed is None:
            allowed = self._publish_verdict(topic)
        if not allowed:
            # Refused (and logged) one by one, as ever.
            for publish in run.publishes():
                self._on_publish(publish)
                if self.closed:
                    return
            return
        client_id = self.client_id
        broker = self.broker
        # One read came at one time: the clock is read once for the run (publish() reads it
        # for a message that has no time yet).
        now = broker.clock.now()
        messages: list[Message] = []
        for payload in run.payloads:
            # As _on_publish: positional, origin set after.
            message = Message(topic, payload, 1, False, True)
            message.origin = client_id
            message.created = now
            messages.append(message)
        completions: list[Completion] = []
        stats = broker.stats
        before = stats.messages_received
        try:
            broker.publish_run(messages, completions)
        except BaseException:
            # Counted as taken, as one by one (the broker counts each as it takes it): an
            # error mid-run stops the count where it stopped.
            self.traffic.messages_received += stats.messages_received - before
            raise
        self.traffic.messages_received += len(messages)
        if self.closed:
            return
        if not self._answers and completions.count(None) == len(completions):
            # Every PUBACK is owed now (a flood's usual case): one write.
            self.transport.write(b"".join(map(encode_puback, run.packet_ids)))
            return
        # PUBACKs owed now (no commit to wait for, no answer queued ahead): one write.
        acks: list[bytes] = []
        for packet_id, payload, commit in zip(
            run.packet_ids, run.payloads, completions, strict=True
        ):
            if commit is None and not self._answers:
                acks.append(encode_puback(packet_id))
                continue
            if acks:
                # The answers owed already go first (MQTT-4.6.0-2).
                self._write_all(acks)
            self._answer(commit, encode_puback(packet_id), _PUBACK, packet_id, None, len(payload))
            if self.closed:
                return
        if acks:
            self._write_all(acks)

    def _answer_not_retained(
        self, session: Session, message: Message, commit: Completion, packet_id: int
    ) -> None:
        """A retained publication over limits.max_retained_payload: delivered but not
        retained. A v5 publisher hears it as 0x97 Quota exceeded, the PUBACK/PUBREC code of
        "an administrative limit was exceeded" (0x9A Retain not supported is not one of
        theirs); a code of 0x80 or more ends a QoS 2 exchange, so its id is released now."""
        limit = self.broker.config.limits.max_retained_payload
        why = f"delivered, not retained: a retained message may have at most {limit} bytes"
        props = Properties(reason_string=why)
        if message.qos == 1:
            self._answer(
                commit,
                self._encode(PubAck(packet_id, ReasonCode.QUOTA_EXCEEDED, props), 5),
                _PUBACK,
                packet_id,
                None,
                len(message.payload),
            )
            return
        released = self.broker.end_exactly_once(session, packet_id)[1]
        self._answer(
            all_of(commit, released),
            self._encode(PubRec(packet_id, ReasonCode.QUOTA_EXCEEDED, props), 5),
            _PUBREC,
            packet_id,
            None,
            len(message.payload),
        )

    def _refuse_unstored(self, session: Session, qos: int, packet_id: int) -> None:
        """The store could not take the message: never acknowledge it as safe.

        v5 gets a negative PUBACK/PUBREC (the exchange ends, so a QoS 2 id is forgotten);
        3.1.1 has no negative acknowledgement, so the client is disconnected and will resend.
        """
        self._log.error("client %s: message not stored (store write failed)", self.client_id)
        if qos == 2:
            self.broker.end_exactly_once(session, packet_id)
        if self.protocol_version < 5:
            self._close(publish_will=False)
            return
        props = Properties(reason_string="the broker could not store the message")
        if qos == 1:
            self._send(PubAck(packet_id, ReasonCode.UNSPECIFIED_ERROR, props), 5)
        else:
            self._send(PubRec(packet_id, ReasonCode.UNSPECIFIED_ERROR, props), 5)

    def _forward(self, topic: str, packet: Publish) -> bool:
        """The QoS 0 fast path: write one encoded frame to every receiver, no Message.

        The broker's route plan says who gets such a publication exactly as published
        (``direct``); this only adds the wire's condition: every receiver is a 3.1/3.1.1
        connection, whose frame carries no properties and so is the same for all of them.
        Returns False to take the full publish path. Counted in the broker's stats as any
        publication is, written out here: a call per message costs this path about 1%.
        """
        broker = self.broker
        routes = broker.routes
        # .get, not a subscript in try: a hit costs about the same, and a miss (every
        # publication of a fleet wider than the cache) saves raising a KeyError (~1 us).
        plan = routes.by_topic.get(topic)
        if plan is None:
            plan = routes.missed(topic)
        receivers = plan.memo
        if receivers is None:
            receivers = plan.memo = _frame_receivers(plan.direct)
        if receivers is False:
            return False
        # What _frame_receivers made (memo is typed object on the plan): no isinstance
        # check per message on the QoS 0 path.
        targets: tuple[MQTTConnection, ...] = receivers  # type: ignore[assignment]
        stats = broker.stats
        stats.messages_received += 1
        stats.messages_sent += len(targets)
        if targets:
            frame = packet.raw
            if frame is None:  # a 5.0 publisher, or an alias: the 3.x frame must be built
                frame = encode_publish(topic.encode(), packet.payload, 0, False, False, None, None)
            for receiver in targets:
                receiver.deliver_frame(frame)
        return True

    def deliver_frame(self, frame: bytes) -> None:
        """Write an already encoded QoS 0 PUBLISH (see :meth:`_forward`): the checks of
        :meth:`_cannot_take_qos0` written out, a call less per receiver of the fast path."""
        if self.closed:
            return
        transport = self.transport
        if transport.write_backlog() > self._max_backlog:
            self._count_dropped()
            return
        self.traffic.messages_sent += 1
        transport.write(frame)

    def _cannot_take_qos0(self) -> bool:
        """A closed connection, or a subscriber so far behind that its QoS 0 is dropped:
        a slow reader loses QoS 0 messages, never the broker's memory."""
        if self.closed:
            return True
        if self.transport.write_backlog() > self._max_backlog:
            self._count_dropped()
            return True
        return False

    def _acknowledge_later(self, session: Session, delivery: Delivery) -> None:
        """Complete a dropped delivery on the next loop turn, so a long run of oversized messages
        cannot recurse through pump → deliver → acknowledge."""

        def complete() -> None:
            self.broker.acknowledge(session, delivery)

        self._call_soon(complete)

    def _count_dropped(self) -> None:
        """A message handed to us (and counted sent by whoever handed it) was not sent."""
        stats = self.broker.stats
        stats.messages_dropped += 1
        stats.messages_sent -= 1

    def _denied_code(self) -> int:
        # 3.1.1 has no negative PUBACK: the publication is acknowledged and dropped.
        return ReasonCode.NOT_AUTHORIZED if self.protocol_version == 5 else 0

    def _copy_properties(self, props: Properties, message: Message) -> None:
        if props.message_expiry_interval is not None:
            interval = props.message_expiry_interval
            cap = self.broker.config.sessions.max_message_expiry
            if cap and interval > cap:
                interval = cap
            message.expiry = self.broker.clock.now() + interval
        message.mqtt5 = _mqtt5_fields(props)

    def _resolve_alias(self, alias: int, topic: str) -> str:
        if alias == 0 or alias > self.broker.config.limits.topic_alias_maximum:
            raise MQTTProtocolError(
                ReasonCode.TOPIC_ALIAS_INVALID,
                f"topic alias {alias} outside 1..{self.broker.config.limits.topic_alias_maximum}",
            )
        if topic:
            self._incoming_aliases[alias] = topic
            return topic
        known = self._incoming_aliases.get(alias)
        if known is None:
            raise MQTTProtocolError(ReasonCode.PROTOCOL_ERROR, f"topic alias {alias} is not set")
        return known

    # -- acknowledgements from the client -------------------------------------------------

    def _on_puback(self, packet: PubAck) -> None:
        assert self.session is not None
        delivery = self._packet_ids.pop(packet.packet_id, None)
        if delivery is not None:
            self.broker.acknowledge(self.session, delivery)

    def _on_puback_run(self, packet: PubAckRun) -> None:
        session = self.session
        assert session is not None
        pop = self._packet_ids.pop
        acknowledged = [d for d in (pop(i, None) for i in packet.packet_ids) if d is not None]
        if acknowledged:
            self.broker.acknowledge_all(session, acknowledged)

    def _on_pubrec(self, packet: PubRec) -> None:
        session = self.session
        assert session is not None
        if packet.reason_code >= 0x80:
            # v5: a failing PUBREC ends the exchange; no PUBREL follows.
            delivery = self._packet_ids.pop(packet.packet_id, None)
            if delivery is not None:
                self.broker.acknowledge(session, delivery)
            return
        delivery = self._packet_ids.get(packet.packet_id)
        found, completion = (
            self.broker.received(session, delivery) if delivery is not None else NOT_FOUND
        )
        if found:
            self._answer(completion, encode_ack(0x62, packet.packet_id))
        else:
            code = ReasonCode.PACKET_IDENTIFIER_NOT_FOUND if self.protocol_version == 5 else 0
            self._answer(None, self._encode(PubRel(packet.packet_id, code), self.protocol_version))

    def _on_pubrel(self, packet: PubRel) -> None:
        session = self.session
        assert session is not None
        found, completion = self.broker.end_exactly_once(session, packet.packet_id)
        if found or self.protocol_version < 5:
            self._answer(completion, encode_ack(0x70, packet.packet_id))
        else:
            code = ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
            self._answer(None, self._encode(PubComp(packet.packet_id, code), 5))

    def _on_pubcomp(self, packet: PubComp) -> None:
        assert self.session is not None
        delivery = self._packet_ids.pop(packet.packet_id, None)
        if delivery is not None:
            self.broker.acknowledge(self.session, delivery)

    # -- SUBSCRIBE / UNSUBSCRIBE ----------------------------------------------------------

    def _on_subscribe(self, packet: Subscribe) -> None:
        session = self.session
        assert session is not None
        version = self.protocol_version
        subscription_id = None
        if packet.properties.subscription_identifiers:
            subscription_id = packet.properties.subscription_identifiers[0]
        codes: list[int] = []
        accepted = []
        completion: Completion = None
        subscribe = self.broker.subscribe
        for request in packet.subscriptions:
            if request.no_local and version == 5 and _is_shared(request.topic_filter):
                raise MQTTProtocolError(
                    ReasonCode.PROTOCOL_ERROR, "No Local is not allowed on a shared subscription"
                )
            if version < 5:
                options = _V3_OPTIONS[request.qos]
            else:
                options = SubscriptionOptions(
                    max_qos=request.qos,
                    no_local=request.no_local,
                    retain_as_published=request.retain_as_published,
                    retain_handling=request.retain_handling,
                    subscription_id=subscription_id,
                )
            outcome = subscribe(session, request.topic_filter, options)
            if type(outcome) is Subscribed:
                # The usual answer first, by its exact type: isinstance against the Enum
                # class asks its metaclass, about twice the cost, on a fleet's every filter.
                codes.append(outcome.subscription.max_qos)  # granted_qos without its call
                accepted.append(outcome)
                if outcome.completion is not None:  # a persistent session's: else no call
                    completion = all_of(completion, outcome.completion)
            else:
                assert isinstance(outcome, SubscribeRefusal)
                self._log.info(
                    "client %s (user %s, %s): subscription to %s refused: %s",
                    self.client_id,
                    _user_text(self.principal),
                    self.peer,
                    quoted(request.topic_filter),
                    outcome.value,
                )
                codes.append(_REFUSAL_REASON[outcome] if version == 5 else SUBACK_FAILURE_V3)

        then: Callable[[], None] | None = None
        # A SUBACK written at once while nothing is retained has nothing to send after it
        # (no closure made per SUBSCRIBE of a fleet).
        if accepted and (
            completion is not None or self._answers or self.broker.may_send_retained()
        ):

            def send_retained() -> None:
                # After the SUBACK, never before it.
                for subscribed in accepted:
                    self.broker.send_retained(subscribed)

            then = send_retained
        self._answer(
            completion,
            self._encode(SubAck(packet.packet_id, codes, Properties()), version)
            if version == 5
            else encode_suback_v3(packet.packet_id, codes),
            then=then,
        )

    def _on_unsubscribe(self, packet: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        codes: list[int] = []
        completion: Completion = None
        for topic_filter in packet.topic_filters:
            found, removed = self.broker.unsubscribe(session, topic_filter)
            codes.append(ReasonCode.SUCCESS if found else ReasonCode.NO_SUBSCRIPTION_EXISTED)
            completion = all_of(completion, removed)
        if self.protocol_version < 5:
            codes = []
        self._answer(
            completion, self._encode(UnsubAck(packet.packet_id, codes), self.protocol_version)
        )

    # -- the rest -------------------------------------------------------------------------

    def _on_pingreq(self, packet: PingReq) -> None:
        self.transport.write(PINGRESP)

    def _on_disconnect(self, packet: Disconnect) -> None:
        session = self.session
        assert session is not None
        if self.protocol_version == 5:
            expiry = packet.properties.session_expiry_interval
            if expiry is not None:
                if session.expiry_interval == 0 and expiry != 0:
                    # MQTT-3.14.2-2: a session that was to end may not be revived here.
                    raise MQTTProtocolError(
                        ReasonCode.PROTOCOL_ERROR,
                        "DISCONNECT may not set a session expiry when CONNECT had none",
                    )
                expiry = min(expiry, self.broker.config.sessions.max_session_expiry)
                self.broker.set_session_expiry(session, expiry)
        publish_will = packet.reason_code == ReasonCode.DISCONNECT_WITH_WILL_MESSAGE
        self._log.info("client %s disconnected (reason 0x%02x)", self.client_id, packet.reason_code)
        self._close(publish_will=publish_will)

    def _on_auth(self, packet: Auth) -> None:
        raise MQTTProtocolError(ReasonCode.PROTOCOL_ERROR, "AUTH without enhanced authentication")

    def _on_connect_again(self, packet: Connect) -> None:
        raise MQTTProtocolError(ReasonCode.PROTOCOL_ERROR, "a second CONNECT on one connection")

    _handlers: ClassVar[dict[type, Callable[[MQTTConnection, Any], None]]] = {
        Publish: _on_publish,
        PublishRun: _on_publish_run,
        PubAck: _on_puback,
        PubAckRun: _on_puback_run,
        PubRec: _on_pubrec,
        PubRel: _on_pubrel,
        PubComp: _on_pubcomp,
        Subscribe: _on_subscribe,
        Unsubscribe: _on_unsubscribe,
        PingReq: _on_pingreq,
        Disconnect: _on_disconnect,
        Auth: _on_auth,
        Connect: _on_connect_again,
    }

    # -- SessionLink: deliveries from the broker -------------------------------------------

    def tag(self, delivery: Delivery) -> int:
        ids = self._packet_ids
        if ids is _NO_PACKET_IDS:
            ids = self._own_packet_ids()
        # OutgoingPacketIds.assign, its usual case inlined (every stored delivery's tag).
        delivery_id = delivery.tag
        if not delivery_id:
            last = ids.last
            delivery_id = last + 1 if last < MAX_PACKET_ID else 1
            if delivery_id in ids:
                return ids.assign(delivery)
            ids.last = delivery.tag = delivery_id
        ids[delivery_id] = delivery
        return delivery_id

    def _own_packet_ids(self) -> OutgoingPacketIds:
        """This connection's packet-id map, made on first use (the shared empty one until
        then is only ever read)."""
        ids = self._packet_ids
        if ids is _NO_PACKET_IDS:
            self._packet_ids = ids = OutgoingPacketIds()
        return ids

    def deliver(self, delivery: Delivery) -> None:
        if self.closed:
            return
        ids = self._packet_ids
        if ids is _NO_PACKET_IDS:
            ids = self._own_packet_ids()
        delivery_id = delivery.tag
        if delivery_id:
            ids[delivery_id] = delivery
        else:
            # OutgoingPacketIds.assign, its usual case inlined: the next id is free.
            last = ids.last
            delivery_id = last + 1 if last < MAX_PACKET_ID else 1
            if delivery_id in ids:
                delivery_id = ids.assign(delivery)
            else:
                ids.last = delivery.tag = delivery_id
                ids[delivery_id] = delivery
        if delivery.state is _RECEIVED:
            # The client holds it already: only the release is missing (MQTT-4.4.0-1).
            self._send(PubRel(delivery_id), self.protocol_version)
            return
        view = delivery.view
        heads = self._publish_heads
        if heads is not None and not view.delivery_count:
            # _publish's usual case, inlined: a first attempt to a 3.x client (5.0 keeps no
            # heads) on a topic whose head it has, of a payload that fits the client.
            message = view.message
            known = heads.get(message.topic)
            payload = message.payload
            if (
                known is not None
                and known[0] == len(payload)
                and known[1] == (view.qos + 3 if view.retain else view.qos)
            ):
                data = b"".join((known[2], delivery_id.to_bytes(2, "big"), payload))
                if len(data) <= self.peer_max_packet_size:
                    self.traffic.messages_sent += 1
                    self.transport.write(data)
                    return
        self._publish(delivery_id, view, view.delivery_count > 0)

    def deliver_all(self, deliveries: list[Delivery]) -> None:
        """:meth:`deliver` for each of a queue's dispatch run, in order, in one write: a first
        attempt to a 3.x client on a topic whose head it has (a subscriber behind a flood:
        every queued delivery) is spliced into one list of pieces, joined once; anything
        else goes through :meth:`deliver`, after what is spliced before it. Like
        :meth:`deliver` it changes nothing in the queue (a dropped message is acknowledged
        later), which is what lets the queue hand over a run (see ``Receiver.deliver_all``)."""
        heads = self._publish_heads
        if heads is None or self.closed:
            for delivery in deliveries:
                self.deliver(delivery)
            return
        ids = self._packet_ids
        if ids is _NO_PACKET_IDS:
            ids = self._own_packet_ids()
        limit = self.peer_max_packet_size
        pieces: list[bytes] = []
        spliced = 0
        topic = None
        known = None
        # The largest payload the client takes after this topic's head and a packet id.
        room = 0
        for delivery in deliveries:
            view = delivery.view
            message = view.message
            if message.topic is not topic:
                topic = message.topic
                known = heads.get(topic)
                if known is not None:
                    room = limit - len(known[2]) - 2
            payload = message.payload
            if (
                known is None
                or delivery.tag
                or view.delivery_count
                or known[0] != len(payload)
                or known[0] > room
                or known[1] != (view.qos + 3 if view.retain else view.qos)
            ):
                # Not a plain first attempt: deliver()'s own way, after what went before.
                if pieces:
                    self.transport.write(b"".join(pieces))
                    pieces = []
                self.deliver(delivery)
                if self.closed:
                    return
                known = heads.get(topic)  # (deliver may have cached a head for it)
                if known is not None:
                    room = limit - len(known[2]) - 2
                continue
            delivery_id = ids.assign(delivery)
            pieces.append(known[2])
            pieces.append(delivery_id.to_bytes(2, "big"))
            pieces.append(payload)
            spliced += 1
        if spliced:
            self.traffic.messages_sent += spliced
        if pieces:
            self.transport.write(b"".join(pieces))

    def deliver_settled(self, entry: QueuedMessage) -> None:
        if not self._cannot_take_qos0():
            self._publish(0, entry, False)

    def _publish(self, delivery_id: int, entry: QueuedMessage, resend: bool) -> None:
        self.traffic.messages_sent += 1
        qos = entry.qos
        message = entry.message
        if self.protocol_version == 5:
            data = self._encode_v5(delivery_id, entry, resend)
        elif resend:
            data = encode_publish(
                message.topic.encode(),
                message.payload,
                qos,
                entry.retain,
                True,
                delivery_id or None,
                None,
            )
        elif qos:
            # 3.x frames differ only in the packet id: splice it between a head encoded once
            # per topic, payload size and level, and the payload.
            key = qos + 3 if entry.retain else qos
            size = len(message.payload)
            heads = self._publish_heads
            if heads is None:
                heads = self._publish_heads = {}
            known = heads.get(message.topic)
            if known is not None and known[0] == size and known[1] == key:
                head = known[2]
            else:
                head = encode_publish_head(message.topic.encode(), size, qos, entry.retain)
                if len(message.topic) <= MAX_CACHED_TOPIC_CHARS:
                    if len(heads) >= 1024:
                        heads.clear()
                    heads[message.topic] = (size, key, head)
            data = b"".join((head, delivery_id.to_bytes(2, "big"), message.payload))
        else:
            # QoS 0 3.x frames are the same for every subscriber: encoded once per message.
            key = 3 if entry.retain else 0
            cache = message.encoded
            if cache is None:
                message.encoded = cache = {}
            frame = cache.get(key)
            if frame is None:
                head = encode_publish_head(
                    message.topic.encode(), len(message.payload), 0, entry.retain
                )
                frame = cache[key] = head + message.payload
            data = frame
        if len(data) > self.peer_max_packet_size:
            # MQTT-3.1.2-25: never send more than the client accepts; the message is dropped.
            self._log.info(
                "client %s: message on %s exceeds its maximum packet size; dropped",
                self.client_id,
                message.topic,
            )
            self._count_dropped()
            if delivery_id and self.session is not None:
                delivery = self._packet_ids.pop(delivery_id, None)
                if delivery is not None:
                    self._acknowledge_later(self.session, delivery)
            return
        self.transport.write(data)

    def _encode_v5(self, delivery_id: int, entry: QueuedMessage, resend: bool) -> bytes:
        message = entry.message
        if (
            message.expiry is None
            and not entry.subscription_ids
            and not self.peer_topic_alias_maximum
        ):
            # Nothing subscriber-specific in the property block: encode it once per message.
            cache = message.encoded
            if cache is None:
                message.encoded = cache = {}
            block = cache.get(_V5_SHARED_PROPERTIES)
            if block is None:
                block = cache[_V5_SHARED_PROPERTIES] = encode_properties(
                    _message_properties(message), _PUBLISH
                )
            return encode_publish(
                message.topic.encode(),
                message.payload,
                entry.qos,
                entry.retain,
                resend,
                delivery_id or None,
                block,
            )
        props = _message_properties(message)
        remaining = message.remaining_expiry(self.broker.clock.now())
        if remaining is not None:
            props.message_expiry_interval = remaining
        if entry.subscription_ids:
            props.subscription_identifiers = list(entry.subscription_ids)
        topic = message.topic
        topic_bytes = topic.encode()
        new_alias = 0
        if self.peer_topic_alias_maximum:
            alias = self._outgoing_aliases.get(topic)
            if alias is not None:
                props.topic_alias = alias
                topic_bytes = b""
            elif len(self._outgoing_aliases) < self.peer_topic_alias_maximum:
                new_alias = props.topic_alias = len(self._outgoing_aliases) + 1
        data = encode_publish(
            topic_bytes,
            message.payload,
            entry.qos,
            entry.retain,
            resend,
            delivery_id or None,
            encode_properties(props, _PUBLISH),
        )
        if new_alias and len(data) <= self.peer_max_packet_size:
            # The client knows the alias only once this packet reaches it; one that deliver
            # drops for its size must leave no trace.
            self._outgoing_aliases[topic] = new_alias
        return data

    def taken_over(self) -> None:
        """The broker moved our session to a newer connection: leave it alone and go."""
        if self.closed:
            return
        self.session = None
        if self.protocol_version == 5:
            self._disconnect_with(ReasonCode.SESSION_TAKEN_OVER)
        self.closed = True
        self.transport.close()

    # -- output helpers -------------------------------------------------------------------

    def _send(self, packet: Packet, version: int) -> None:
        self.transport.write(self._encode(packet, version))

    def _encode(self, packet: Packet, version: int) -> bytes:
        data = encode_answer(packet, version, self.peer_max_packet_size, self._problem_information)
        if len(data) > self.peer_max_packet_size and isinstance(packet, (SubAck, UnsubAck)):
            # Only these grow with the request (one reason code per filter); every other
            # answer is a few bytes once its optional text is gone (MQTT-3.1.2-24).
            raise MQTTProtocolError(
                ReasonCode.PACKET_TOO_LARGE,
                f"the {type(packet).__name__} exceeds the client's Maximum Packet Size",
            )
        return data

    def _disconnect_with(self, reason: int, why: str = "") -> None:
        props = Properties(reason_string=why or None)
        self._send(Disconnect(reason, props), 5)

    def _answer(
        self,
        completion: Completion,
        data: bytes,
        kind: int = 0,
        packet_id: int = 0,
        then: Callable[[], None] | None = None,
        size: int = 0,
    ) -> None:
        """Write the answer ``data`` once ``completion`` is done and every answer before it
        was written, so answers leave in the order of the packets they answer (MQTT-4.6.0-2
        to -4) whatever each waits for. ``then`` runs right after it is written.

        ``kind`` says what a failed completion means: for a publication (_PUBACK, _PUBREC,
        ``packet_id``) the client is told it was not stored, a CONNACK becomes a refusal; for
        anything else the connection closes (the client resends after reconnecting).
        """
        answers = self._answers
        if completion is None and not answers:
            self.transport.write(data)
            if then is not None:
                then()
            return
        if answers is None:
            answers = self._answers = deque()
        answers.append((completion, data, kind, packet_id, then, size))
        if kind == _PUBACK:
            self._awaiting_commit += 1
        if size:
            self._held_bytes += size
            pause = self._limits.publisher_pause_bytes or sys.maxsize
            if self._held_bytes > pause and not self.reading_paused:
                self._pause_reading()
        if completion is not None and (completion is not self._watched or completion.done()):
            self._watched = completion
            completion.add_done_callback(self._answers_ready)

    def _answers_ready(self, _completion: object = None) -> None:
        """Write every answer at the head of the line whose completion is done, together."""
        answers = self._answers
        if answers is None:
            return
        ready: list[bytes] = []
        succeeded: Completion = None
        while answers and not self.closed:
            completion, data, kind, packet_id, then, size = answers[0]
            if completion is not None and completion is not succeeded:
                if not completion.done():
                    break
                if completion.cancelled() or completion.exception() is not None:
                    answers.popleft()
                    if kind == _PUBACK:
                        self._awaiting_commit -= 1
                    self._held_bytes -= size
                    self._write_all(ready)
                    self._answer_failed(kind, packet_id)
                    continue
                succeeded = completion
            answers.popleft()
            if kind == _PUBACK:
                self._awaiting_commit -= 1
            self._held_bytes -= size
            ready.append(data)
            if then is not None:
                self._write_all(ready)
                then()
        if self.closed:
            answers.clear()
            return
        self._write_all(ready)
        pause = self._limits.publisher_pause_bytes or sys.maxsize
        if self.reading_paused and self._held_bytes <= pause // 2:
            self._resume_reading()

    def _pause_reading(self) -> None:
        """Too many bytes of this publisher's wait for their answers (flow control, commits):
        read nothing more from it until half of them are answered (TCP pushes back)."""
        pause = getattr(self.transport, "pause_reading", None)
        if pause is not None:
            self.reading_paused = True
            pause()

    def _resume_reading(self) -> None:
        self.reading_paused = False
        # The silence was ours: keepalive counts from now.
        self.last_received = self.broker.clock.now()
        if self._checking is None:
            resume = getattr(self.transport, "resume_reading", None)
            if resume is not None:
                resume()

    def _write_all(self, ready: list[bytes]) -> None:
        if ready:
            self.transport.write(ready[0] if len(ready) == 1 else b"".join(ready))
            ready.clear()

    def _answer_failed(self, kind: int, packet_id: int) -> None:
        session = self.session
        if session is None:
            return
        if kind == _CONNACK:
            self._refuse_unstored_connect()
        elif kind:
            self._refuse_unstored(session, 1 if kind == _PUBACK else 2, packet_id)
        else:
            self._log.error(
                "client %s: state not stored (store write failed); closing", self.client_id
            )
            self._close(publish_will=False)

    def _close(self, *, publish_will: bool, keep_will: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        session = self.session
        if session is not None:
            self.broker.disconnect(session, publish_will=publish_will, keep_will=keep_will)
        self.transport.close()


# One answer waiting to be written (see MQTTConnection._answer): its completion, its bytes, its
# kind, the packet id it answers (publications), what runs once it is written and the payload
# bytes of the publication it answers (see _held_bytes). A tuple: one
# is made per acknowledged publication.
_Answer: TypeAlias = tuple[Completion, bytes, int, int, "Callable[[], None] | None", int]

# Kinds of answer: the PUBACK of a QoS 1 publication, the PUBREC of a QoS 2 one, the CONNACK,
# anything else (0).
_PUBACK = 1
_PUBREC = 2
_CONNACK = 3


class _HeldOutput:
    """Stands in for the transport while the CONNACK waits for its completion: what the
    connection writes meanwhile waits here and follows the CONNACK."""

    __slots__ = ("size", "transport", "writes")

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.writes: list[bytes] = []
        self.size = 0

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        self.size += len(data)

    def close(self) -> None:
        self.writes.clear()
        self.transport.close()

    def write_backlog(self) -> int:
        # Held bytes count: a flood of QoS 0 meanwhile is dropped as for a slow reader.
        return self.size + self.transport.write_backlog()


# Read per delivery; an Enum class attribute lookup costs several plain ones.
_RECEIVED = DeliveryState.RECEIVED

# Every 3.x connection's topic alias maps (see MQTTConnection.__init__).
_NO_ALIASES: Final[dict[Any, Any]] = {}
# Every connection's packet ids until it has some (never written to).
_NO_PACKET_IDS: Final = OutgoingPacketIds()

# A 3.x subscription's options, by maximum QoS: only that differs (the broker copies them
# into the subscription and changes no options object), so one each serves every SUBSCRIBE.
_V3_OPTIONS: Final = tuple(SubscriptionOptions(max_qos=qos) for qos in range(3))

# Key of a message's cached 5.0 property block in Message.encoded.
_V5_SHARED_PROPERTIES = "v5-properties"


def _message_properties(message: Message) -> Properties:
    """The 5.0 PUBLISH properties a message carries to every subscriber alike."""
    fields = message.mqtt5
    if fields is None:
        return Properties()
    props = Properties(
        payload_format_indicator=fields.payload_format_indicator,
        content_type=fields.content_type,
        response_topic=fields.response_topic,
        correlation_data=fields.correlation_data,
    )
    if fields.user_properties:
        props.user_properties = fields.user_properties
    return props


def _frame_receivers(direct: tuple[Session, ...] | None) -> tuple[MQTTConnection, ...] | bool:
    """What the QoS 0 fast path keeps on a route plan: the connections one 3.x frame goes to,
    or False when the full publish path is needed."""
    if direct is None:
        return False
    if len(direct) == 1:
        link = direct[0].link
        if type(link) is MQTTConnection and link.protocol_version < 5:
            return (link,)
        return False
    links = tuple(session.link for session in direct)
    if all(type(link) is MQTTConnection and link.protocol_version < 5 for link in links):
        return links  # type: ignore[return-value]
    return False


def _mqtt5_fields(props: Properties) -> MQTT5Fields | None:
    """The message fields of a 5.0 PUBLISH or will; None when it has none (most messages)."""
    if (
        props.payload_format_indicator is None
        and props.content_type is None
        and props.response_topic is None
        and props.correlation_data is None
        and not props.user_properties
    ):
        return None
    return MQTT5Fields(
        props.payload_format_indicator,
        props.content_type,
        props.response_topic,
        props.correlation_data,
        list(props.user_properties),
    )


def _is_shared(topic_filter: str) -> bool:
    """A well-formed shared subscription filter (an ill-formed one is refused as invalid by
    the broker, not as a protocol error here). Parsed only for the rare No Local request: the
    broker parses every filter once itself."""
    try:
        group, _ = parse_shared(topic_filter)
    except TopicError:
        return False
    return group is not None


def _user_text(principal: Principal | None) -> str:
    if principal is None or principal.name is None:
        return "anonymous"
    return f"{quoted(principal.name)} by {principal.how}"


def _default_login(broker: Broker) -> Login:
    """Without a listener's login (embedding, unit tests): the broker-wide anonymous policy
    and no users."""
    policy = broker.config.auth.allow_anonymous
    return Login(Authentication(allow_anonymous=None if policy == "auto" else policy))


def _call_now(callback: Callable[[], None]) -> None:
    """``call_soon`` without an event loop (unit tests): run it at once."""
    callback()
