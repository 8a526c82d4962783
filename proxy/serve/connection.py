"""One client connection's I/O: TLS if its listener has it, one upstream connection, and
two pumps, one per direction. The protocol is the sans-I/O core's
(``proxy.protocol.core.ConnectionCore``); the sockets are served by the process's I/O
driver (``proxy.serve.driver``). Between reads a pump is parked in the driver; when its
socket is readable the driver calls the pump's ``_serve_*`` in its pass: it reads, hands
the bytes to the core with the current config generation and the time, and carries out the
common case itself (a lone Forward or Answer that the other socket takes whole). Anything
else wakes the pump's task, which carries it out through :meth:`ClientConnection.carry_out`,
where an action becomes a send, a wait or a close, and parks again.

The client socket has one writer at a time: both pumps may write to it (the response
pump the broker's responses, the request pump the proxy's own answers when nothing is
ahead of them), so a second writer waits for the first; order is kept because the core
takes frames off the session's line before the writer waits.
"""

from __future__ import annotations

import logging
import math
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from time import perf_counter
from typing import NoReturn

import trio

from policies.close_cause import CloseCause, Closing
from policies.connections import OpenCounts, decide_send_stall
from policies.frame_check import decide_client_hello
from proxy.evidence.decisions import Where
from proxy.evidence.lifecycle import record_lifecycle
from proxy.evidence.metrics import TrafficStats
from proxy.hooks.request import Request
from proxy.links.identity import ClientCertificate, verified_client_certificate
from proxy.links.tls import TlsTermination
from proxy.links.transport import (
    NeedsTask,
    SendStalled,
    SocketTransport,
    TlsTransport,
    Transport,
    peer_address,
    stdlib_socket,
)
from proxy.links.upstream import NoClientIdentity, UpstreamConnector, UpstreamLink, UpstreamUnavailable
from proxy.protocol import wire
from proxy.protocol.core import (
    MAX_PENDING_REQUESTS,
    Actions,
    Answer,
    Close,
    Connect,
    ConnectionCore,
    Forward,
    Inspect,
    Note,
    Prepare,
    ResumeReading,
    SetDeadline,
    StopReading,
    WaitForPool,
)
from proxy.protocol.framing import RECEIVE_SIZE
from proxy.protocol.session import UnexpectedResponse
from proxy.protocol.wire import Received
from proxy.serve.driver import MORE
from proxy.serve.runtime import Runtime

__all__ = ["MAX_PENDING_REQUESTS", "ClientConnection", "Port"]

log = logging.getLogger("kafka_admission_proxy.connection")

HANDSHAKE_TIMEOUT_S = 10.0
# Closes after which the client may still be sending (a refused frame's body): the
# proxy half-closes and discards what comes for a bounded time, as Kafka's client then
# reads an EOF where closing with bytes unread would send it a reset.
_LINGER_AFTER = frozenset(
    {
        CloseCause.REQUEST_TOO_LARGE,
        CloseCause.REQUEST_INVALID_SIZE,
        CloseCause.CLIENT_TLS_ON_PLAINTEXT,
        CloseCause.CLIENT_HTTP_ON_KAFKA_PORT,
        CloseCause.UNREADABLE_VERSION,
        CloseCause.MALFORMED_FRAME,
    }
)


class ConnectionClosed(Exception):
    """Ends a connection: ``closing`` says why (its metric label, its log line)."""

    def __init__(self, closing: Closing) -> None:
        super().__init__(closing.reason)
        self.closing = closing


@dataclass(frozen=True, slots=True)
class Port:
    """What a connection needs from the port it was accepted on."""

    listener: str
    tls: TlsTermination | None
    upstream_name: str
    connect: Callable[[ClientCertificate], Awaitable[UpstreamLink]]  # on behalf of this client
    stats: TrafficStats


class ClientConnection:
    def __init__(self, port: Port, runtime: Runtime, stream: trio.SocketStream, conn_id: str) -> None:
        self.port = port
        self.runtime = runtime
        self._tcp = stream
        self.peer, self.peer_ip = peer_address(stream)
        self.listener = port.listener
        self.conn_id = conn_id
        self.tls = port.tls is not None
        self.where = Where(port.listener, self.peer, self.conn_id, self.tls)
        self.open_counts: OpenCounts | None = None  # set by the gate as it admits this connection
        self.client_certificate = ClientCertificate(None)  # the one its TLS listener verified
        self._coordinator = _Coordinator(runtime.connector)
        self._upstream_tls = runtime.connector.tls_enabled
        self.core = ConnectionCore(
            conn_id,
            port.listener,
            client_tls=self.tls,
            upstream_tls=self._upstream_tls,
            # the listener as configured when the connection opened
            sasl=any(lst.sasl for lst in runtime.generation.config.listeners if lst.name == self.listener),
            pool=runtime.pool,
            quotas=runtime.gate,
            stats=port.stats,
            window=runtime.window,
            recorder=runtime.recorder,
            where=self.where,
            make_request=Request,
            coordinator=self._coordinator,
        )
        self._scope = trio.CancelScope()  # cancelled to close the connection from outside
        self._body_deadline = trio.CancelScope()  # request.body.timeout.ms, as the core sets it
        self._writing = False  # a pump is writing to the client
        self._written: trio.Event | None = None  # made only when a second writer has to wait
        self._resume: trio.Event | None = None  # made while the core holds reading
        self._opened = trio.current_time()
        self.bytes_out = 0
        self._client: Transport | None = None
        self._upstream: Transport | None = None

    @property
    def upstream_address(self) -> str:
        return self.core.upstream_address

    # -- from outside: the gate and the server --------------------------------------

    def close_now(self, closing: Closing) -> None:
        """Close from outside (eviction, idle expiry, a lowered limit; the gate records it)."""
        if not self._scope.cancel_called:
            self.core.closed_by(closing)
            log.info("connection closed: %s", closing.reason, extra={"peer": self.peer, "listener": self.listener})
            self._scope.cancel()

    def stop_reading(self) -> None:
        """Graceful shutdown: finish the frame being read, answer what is in flight, close."""
        if self.core.stop():  # nothing in flight: closed now
            self._scope.cancel()

    # -- the connection's life ----------------------------------------------------------

    async def run(self) -> None:
        self._lifecycle("open")
        try:
            with self._scope:
                await self._serve()
        except Exception as exc:  # e.g. a reset before the first request: this connection only
            self._closed_by(self._ending(exc))
        finally:
            self.runtime.pool.cancel(self.conn_id)  # whatever it held or waited for goes back
            self._unanswered()
            with trio.CancelScope(shield=True):
                if self._upstream is not None:
                    await self._upstream.aclose()
                closing = self.core.closing
                if self._client is not None:
                    if closing is not None and closing.cause in _LINGER_AFTER:
                        await self._client.aclose_lingering()
                    else:
                        await self._client.aclose()
                await trio.aclose_forcefully(self._tcp)  # a no-op once the client transport owns the socket
            self._lifecycle("close")

    async def _serve(self) -> None:
        client = await self._open_client_stream()
        core = self.core
        # Until the first request prefix is checked: no broker is involved yet.
        while not core.connected:
            actions = core.client_bytes(await client.receive(RECEIVE_SIZE), self.runtime.generation, 0.0)
            if actions and actions[0].__class__ is Connect:
                break
            await self.carry_out(actions)
        try:
            link = await self.port.connect(self.client_certificate)
        except NoClientIdentity as exc:
            await self.carry_out(core.upstream_unavailable(str(exc), no_identity=True))
            return
        except UpstreamUnavailable as exc:
            await self.carry_out(core.upstream_unavailable(str(exc)))
            return
        self._upstream = link.transport
        self._coordinator.address, self._coordinator.certificate = link.address, self.client_certificate
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, self._pump_responses(link.transport), nursery)
                await self._pump(self._pump_requests(link.address), nursery)
        finally:
            with trio.CancelScope(shield=True):
                await link.transport.aclose()
                self._upstream = None

    async def _pump(self, pump: Awaitable[None], nursery: trio.Nursery) -> None:
        """Runs one direction; whatever ends it ends the connection (and only this one)."""
        try:
            await pump
        except Exception as exc:
            self._closed_by(self._ending(exc))
        finally:
            nursery.cancel_scope.cancel()

    async def _pump_requests(self, upstream_address: str) -> None:
        """The client -> broker direction, under ``request.body.timeout.ms`` (one scope kept for the
        life of the connection, its deadline set by the core). Between requests it is parked in
        the I/O driver, which serves the common case itself (:meth:`_serve_requests`)."""
        runtime, core, client = self.runtime, self.core, self._client
        assert client is not None
        park, fd, serve = runtime.driver.park, client.fileno(), self._serve_requests
        with self._body_deadline:
            now = trio.current_time()
            await self.carry_out(core.upstream_ready(upstream_address, runtime.generation, now), now, perf_counter())
            while True:
                if self._resume is not None:
                    await self._resume.wait()
                try:
                    handed = await park(fd, serve)
                except NeedsTask:  # TLS needs a wait of the other kind: this task waits for it
                    data = await client.receive(core.request_receive_size)
                    now, started = trio.current_time(), perf_counter()
                    handed = _HandBack(core.client_bytes(data, runtime.generation, now), now, started)
                await self._carry_on(handed)  # type: ignore[arg-type]
        if self._body_deadline.cancelled_caught:
            await self.carry_out(core.deadline_passed(trio.current_time()))

    def _serve_requests(self, now: float, started: float) -> object:
        """The client's socket is readable (called by the I/O driver, not in this connection's
        task): read, hand to the core, and send a lone Forward on at once; None when that is all."""
        core, client, upstream = self.core, self._client, self._upstream
        assert client is not None and upstream is not None
        data = client.try_receive(core.request_receive_size)  # NeedsTask: raised in the pump's task
        if data is None:
            return None
        actions = core.client_bytes(data, self.runtime.generation, now)
        if len(actions) > 1 or (actions and actions[0].__class__ is SetDeadline):
            actions = self._set_deadlines(actions)  # a frame spanning receives: its body's deadline
        if len(actions) == 1 and (action := actions[0]).__class__ is Forward:
            sent = upstream.try_send(action.data)
            if sent < len(action.data):
                return _HandBack(actions, now, started, sent)
            _forwarded(action, started)
        elif actions:
            return _HandBack(actions, now, started)
        # all sent, or nothing to do yet (a frame's body still to come)
        return MORE if self.tls and client.buffered() else None

    def _set_deadlines(self, actions: Actions) -> Actions:
        """SetDeadline carried out in the driver's pass (a cancel scope's deadline, no I/O), so a
        frame spanning receives wakes no task; the other actions are returned."""
        rest = []
        for action in actions:
            if action.__class__ is SetDeadline:
                self._body_deadline.deadline = action.at
                if action.at != math.inf:
                    self.runtime.driver.deadline_set()
            else:
                rest.append(action)
        return rest

    async def _pump_responses(self, upstream: Transport) -> None:
        """The broker -> client direction: the first response read here (it says the broker is
        healthy), then parked in the I/O driver (:meth:`_serve_responses`)."""
        runtime, core = self.runtime, self.core
        data = await upstream.receive(core.response_receive_size)
        if data:
            runtime.connector.healthy(core.upstream_address)
        now = trio.current_time()
        await self.carry_out(core.broker_bytes(data, runtime.generation, now), now, perf_counter())
        park, fd, serve = runtime.driver.park, upstream.fileno(), self._serve_responses
        while True:
            try:
                handed = await park(fd, serve)
            except NeedsTask:
                data = await upstream.receive(core.response_receive_size)
                now, started = trio.current_time(), perf_counter()
                handed = _HandBack(core.broker_bytes(data, runtime.generation, now), now, started)
            await self._carry_on(handed)  # type: ignore[arg-type]

    def _serve_responses(self, now: float, started: float) -> object:
        """The broker's socket is readable (called by the I/O driver): read, hand to the core,
        and send a lone Answer to the client at once when no one else is writing to it."""
        core, client, upstream = self.core, self._client, self._upstream
        assert client is not None and upstream is not None
        data = upstream.try_receive(core.response_receive_size)  # NeedsTask: raised in the pump's task
        if data is None:
            return None
        actions = core.broker_bytes(data, self.runtime.generation, now)
        if len(actions) == 1 and (action := actions[0]).__class__ is Answer and not self._writing:
            sent = client.try_send(action.data)
            if sent < len(action.data):
                self._writing = True  # the rest goes before anything else reaches the client
                return _HandBack(actions, now, started, sent)
            then = self._answered(action, now, started)
            if then:
                return _HandBack(then, now, started)
        elif actions:
            return _HandBack(actions, now, started)
        return MORE if self._upstream_tls and upstream.buffered() else None

    async def _carry_on(self, handed: _HandBack) -> None:
        """What the I/O driver handed back, carried out in this connection's task: a lone
        Forward or Answer it began to send (the rest of the same bytes, as TLS asks; an Answer
        holds the client's writer meanwhile), or actions it left alone."""
        now, started, sent = handed.now, handed.started, handed.sent
        if sent is None:
            await self.carry_out(handed.actions, now, started)
            return
        action = handed.actions[0]
        rest = memoryview(action.data)[sent:]
        if action.__class__ is Forward:
            await self._upstream.send(rest)  # type: ignore[union-attr]
            _forwarded(action, started)
            return
        await self._send_to_client(rest)
        then = self._answered(action, now, started)
        if then:
            await self.carry_out(then, now, started)

    # -- carrying out the core's actions ------------------------------------------------

    async def carry_out(self, actions: Actions, now: float = 0.0, started: float = 0.0) -> None:
        """Do what the core asked, in order: the one place an action becomes I/O. What the core
        asks in answer to an action (once the hook is done, the pool granted, the answer
        delivered) is done next, before the rest."""
        core = self.core
        i = 0
        while i < len(actions):
            action = actions[i]
            i += 1
            kind = action.__class__
            if kind is Forward:
                await self._upstream.send(action.data)  # type: ignore[union-attr]
                _forwarded(action, started)
                continue
            if kind is Answer:
                # The one way bytes reach the client; a second writer waits for the first.
                while self._writing:
                    if self._written is None:
                        self._written = trio.Event()
                    await self._written.wait()
                self._writing = True
                await self._send_to_client(action.data)
                then = self._answered(action, now, started)
            elif kind is Inspect:
                pending = action.pending
                request, hooks = pending.on_response
                changed = await action.rules.on_response(request, hooks, action.frame)
                if changed is not None:
                    self.runtime.metrics.responses_rewritten.labels(self.listener, wire.api_name(pending.api_key)).inc()
                then = core.inspected(changed)
            elif kind is WaitForPool:  # the pool makes this connection wait: its socket is not read meanwhile
                await self.runtime.pool.wait_for(action.ticket)
                then = core.pool_granted(trio.current_time())
            elif kind is Prepare:
                await action.rules.prepare(action.request, action.hooks)
                then = core.prepared(now)
            elif kind is SetDeadline:
                self._body_deadline.deadline = action.at
                continue
            elif kind is StopReading:
                self._resume = trio.Event()
                continue
            elif kind is ResumeReading:
                if self._resume is not None:
                    self._resume.set()
                    self._resume = None
                continue
            elif kind is Note:
                self.runtime.closes.log(
                    logging.WARNING,
                    action.key,
                    trio.current_time(),
                    "%s",
                    action.message,
                    extra={"peer": self.peer, "listener": self.listener},
                )
                continue
            elif kind is Close:
                await self._close(action)
            else:
                raise AssertionError(f"unknown action {action!r}")
            if then:
                actions, i = then + actions[i:], 0

    async def _send_to_client(self, data: Received | memoryview) -> None:
        """Send as the client's one writer (taken by the caller), and let the next one write."""
        try:
            await self._client.send(data)  # type: ignore[union-attr]
        except SendStalled as stalled:
            self._send_stalled(stalled.seconds)
        finally:
            self._written_by_one()

    def _written_by_one(self) -> None:
        self._writing = False
        if self._written is not None:
            self._written.set()
            self._written = None

    def _answered(self, action: Answer, now: float, started: float) -> Actions:
        """An Answer is with the client: counted, and the core told."""
        size = len(action.data)
        self.bytes_out += size
        self.port.stats.response_bytes += size
        return self.core.delivered(action.delivered, now, perf_counter() - started)

    def _send_stalled(self, seconds: float) -> NoReturn:
        """The client took no byte for connections.max.idle.ms while a send waited."""
        decision = decide_send_stall(seconds)
        self.runtime.recorder.record(decision, self.where)
        raise ConnectionClosed(Closing(CloseCause.CLOSED_BY_LIMIT, decision.reason, decision.limit_key)) from None

    async def _close(self, action: Close) -> NoReturn:
        closing = action.closing
        if closing.cause is CloseCause.UPSTREAM_TLS_ON_PLAINTEXT and action.decision is not None:
            # the broker speaks TLS: back off from it, and say so in the log line
            message = self.runtime.connector.mismatch(
                self.core.upstream_address, action.decision.limit_key, action.decision.reason
            )
            closing = Closing(closing.cause, message)
        if action.last_words and self._client is not None:
            with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
                await self._client.send(action.last_words)
        raise ConnectionClosed(closing)

    # -- before the first request -------------------------------------------------------

    async def _open_client_stream(self) -> Transport:
        termination = self.port.tls
        if termination is None:
            self._client = SocketTransport(stdlib_socket(self._tcp))
            self._client.stall_limit = self.runtime.send_stall_s
            return self._client
        await self._expect_client_hello()
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT_S):  # the waits for a turn included
                self._client = await TlsTransport.handshake(
                    stdlib_socket(self._tcp),
                    termination.context,
                    server_side=True,
                    turns=self.runtime.gate.handshake_turns,
                )
        except (trio.TooSlowError, OSError) as exc:  # ssl.SSLError included
            self.runtime.metrics.handshake_failures.labels(self.listener).inc()
            reason = str(getattr(exc, "reason", None) or type(exc).__name__)  # e.g. CERTIFICATE_VERIFY_FAILED
            raise ConnectionClosed(
                Closing(CloseCause.TLS_HANDSHAKE, f"TLS handshake failed: {exc!r}", detail=reason)
            ) from None
        self._client.stall_limit = self.runtime.send_stall_s
        self.client_certificate = verified_client_certificate(self._client.sock)
        return self._client

    async def _expect_client_hello(self) -> None:
        """On a TLS listener, name a client that speaks plaintext before the TLS library
        answers it with an alert the client would read as a 352 MB length."""
        head = b""
        with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
            try:
                head = await self._tcp.socket.recv(5, trio.socket.MSG_PEEK)  # leaves the bytes for TLS
            except OSError:
                return  # already gone: the handshake reports it
        decision = decide_client_hello(head)
        if decision is not None:
            self.runtime.recorder.record(decision, self.where)
            raise ConnectionClosed(Closing(CloseCause.CLIENT_PLAINTEXT_ON_TLS, decision.reason))

    # -- helpers ------------------------------------------------------------------------

    def _unanswered(self) -> None:
        """Requests whose responses never came (sent or not): the hooks that read their
        responses let go of what they held for them (a group join's slot)."""
        for pending in self.core.unanswered():
            request, hooks = pending.on_response
            for hook in hooks:
                hook.on_unanswered(request)

    def _ending(self, exc: Exception) -> Closing:
        """What ended the connection, as the cause its close is counted under."""
        if isinstance(exc, ConnectionClosed):
            return exc.closing
        if isinstance(exc, (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError)):
            return Closing(CloseCause.BROKEN, f"connection broken: {exc.__cause__ or exc!r}")
        if isinstance(exc, wire.MalformedFrame):
            return Closing(CloseCause.MALFORMED_FRAME, str(exc))
        if isinstance(exc, UnexpectedResponse):
            return Closing(CloseCause.UNEXPECTED_RESPONSE, str(exc))
        # A bug must cost one connection, not the proxy.
        log.error("internal error on connection", exc_info=exc, extra={"peer": self.peer, "listener": self.listener})
        return Closing(CloseCause.INTERNAL_ERROR, repr(exc))

    def _closed_by(self, closing: Closing) -> None:
        self.core.closed_by(closing)
        self.runtime.count_failure(self.listener, self.peer, closing)

    def _lifecycle(self, event: str) -> None:
        """Connection open and close, for the observation window and the audit."""
        closed: dict[str, object] = {}
        if event == "close":
            core = self.core
            closed = {
                "duration_seconds": trio.current_time() - self._opened,
                "requests": core.requests,
                "bytes_in": core.bytes_in,
                "bytes_out": self.bytes_out,
                "client_id": core.first_client_id,
            }
        record_lifecycle(
            self.runtime.audit,
            self.runtime.window,
            event,
            conn_id=self.conn_id,
            listener=self.listener,
            peer=self.peer,
            tls=self.tls,
            counts=self.open_counts,
            closed=closed,
            closing=self.core.closing,
        )


class _Coordinator:
    """A second connection to a connection's broker: the group's coordinator (clients send group
    requests to the coordinator), for hooks that must ask it something first. It refers to no
    connection, so that a connection and its core form no reference cycle (freed at once)."""

    __slots__ = ("address", "certificate", "connector")

    def __init__(self, connector: UpstreamConnector) -> None:
        self.connector = connector
        self.address = "unconnected"
        self.certificate = ClientCertificate(None)

    async def __call__(self) -> UpstreamLink:
        host, _, port = self.address.rpartition(":")
        return await self.connector.connect(host, int(port), client=self.certificate)


@dataclass(frozen=True, slots=True)
class _HandBack:
    """Actions the I/O driver did not finish, for the connection's task; ``sent``: it began to
    send the lone Forward or Answer in ``actions``, and this much of it is sent."""

    actions: Actions
    now: float
    started: float
    sent: int | None = None


def _forwarded(action: Forward, started: float) -> None:
    """A Forward is with the broker: the time its requests spent inside the proxy (the response
    adds its own)."""
    elapsed = perf_counter() - started
    for pending in action.sent:
        pending.request_seconds = elapsed
