"""One client connection: TLS if its listener has it, one upstream connection, and
two pumps, one per direction.

Each pump reads what the socket has, takes every whole frame in it, and writes
what goes on in one send: in the common case a receive holds whole frames that
all go on, and they are sent as a slice of the very bytes received. Per request
the work is O(1) and touches nothing outside this connection but timestamps in
the connection quotas and the memory pool: the header is peeked in place, and a
body is decoded only for the APIs a policy reads (the config generation's plan).

Answers the proxy gives itself (a refused group join, an identifier over its
limit) keep their place in the connection's response order (``Session``); they
are written by whichever pump finds them at the head of the line, and the
client socket's one writer at a time is made explicit by ``_send_to_client``.
"""

from __future__ import annotations

import itertools
import logging
import math
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from time import perf_counter
from typing import NoReturn

import trio

from policies.api_keys import PRODUCE, SASL_AUTHENTICATE
from policies.connections import OpenCounts
from policies.decision import Action, Decision, Policy
from policies.frame_check import (
    FrameKind,
    RequestLimit,
    decide_request_prefix,
    looks_like_http,
    looks_like_tls,
    request_limit,
)
from policies.mode import Mode
from policies.response_size import decide_response_prefix
from proxy.evidence.decisions import Where
from proxy.evidence.lifecycle import record_lifecycle
from proxy.evidence.logs import RateLimitedLog
from proxy.evidence.metrics import TrafficStats
from proxy.hooks.generation import Generation
from proxy.hooks.request import Request
from proxy.links.identity import ClientCertificate, verified_client_certificate
from proxy.links.tls import TlsTermination
from proxy.links.transport import SendStalled, SocketTransport, TlsTransport, Transport, peer_address, stdlib_socket
from proxy.links.upstream import NoClientIdentity, UpstreamLink, UpstreamUnavailable
from proxy.protocol import wire
from proxy.protocol.framing import MAX_RECEIVE, RECEIVE_SIZE, FrameRefused, FrameSplitter
from proxy.protocol.session import Pending, Session, State, UnexpectedResponse
from proxy.protocol.wire import Received
from proxy.serve.runtime import Runtime

log = logging.getLogger("kafka_admission_proxy.connection")
_closes = RateLimitedLog(log)

HANDSHAKE_TIMEOUT_S = 10.0
# Requests taken from one client and not yet answered to it before the proxy stops
# reading that client (reading resumes at half). Kafka's broker reads one request per
# connection at a time and Java clients keep 5 in flight; this bounds what a client
# that never reads its responses can make the proxy hold.
MAX_PENDING_REQUESTS = 1000
_HTTP_400_BODY = b"This is a Kafka port (kafka-admission-proxy), not HTTP.\n"
_HTTP_400 = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_HTTP_400_BODY), _HTTP_400_BODY)
)
_ids = itertools.count(1)
_CLIENT_SIDE = {"direction": "client"}
_Pump = Callable[[Transport, Transport], Awaitable[None]]


class ConnectionClosed(Exception):
    """Ends a connection abnormally; ``cause`` is its metric label, the message its log line,
    ``detail`` tells apart lines of one cause that say different things (logged apart)."""

    def __init__(self, cause: str, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.cause = cause
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Port:
    """What a connection needs from the port it was accepted on."""

    listener: str
    tls: TlsTermination | None
    upstream_name: str
    connect: Callable[[ClientCertificate], Awaitable[UpstreamLink]]  # on behalf of this client
    stats: TrafficStats


class ClientConnection:
    def __init__(self, port: Port, runtime: Runtime, stream: trio.SocketStream) -> None:
        self.port = port
        self.runtime = runtime
        self._tcp = stream
        self.peer, self.peer_ip = peer_address(stream)
        self.listener = port.listener
        self.conn_id = f"{port.listener}-{next(_ids)}"
        self.tls = port.tls is not None
        self.where = Where(port.listener, self.peer, self.conn_id, self.tls)
        self.open_counts: OpenCounts | None = None  # set by the gate as it admits this connection
        self.session = Session()
        self.client_certificate = ClientCertificate(None)  # the one its TLS listener verified
        self.upstream_address = "unconnected"
        self._scope = trio.CancelScope()  # cancelled to close the connection from outside
        self._splitter = FrameSplitter(sniff=not self.tls)
        self._stopping = False
        self._writing = False  # a pump is writing to the client
        self._written: trio.Event | None = None  # made only when a second writer has to wait
        self._opened = trio.current_time()
        self.requests = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.end_reason = "client_closed"
        self.first_client_id: str | None = None
        self._partial_ticket: int | None = None  # pool memory of the frame being read (KIP-72)
        self._body_deadline = trio.CancelScope()  # request.body.timeout.ms, armed per partial frame
        self._body_timeout_ms = 0
        self._waiting_for = ""
        self._room: trio.Event | None = None  # made only while MAX_PENDING_REQUESTS holds reading
        self._client: Transport | None = None
        # Kafka's SASL listeners: until the broker accepts a SaslAuthenticate, frames are bounded by
        # sasl.server.max.receive.size (the listener as configured when the connection opened).
        self._sasl = any(lst.sasl for lst in runtime.generation.config.listeners if lst.name == self.listener)
        self._authenticated = not self._sasl

    # -- from outside: the gate and the server --------------------------------------

    def close_now(self, cause: str, reason: str) -> None:
        """Close from outside (eviction, idle expiry, a lowered limit; the gate records it)."""
        if not self._scope.cancel_called:
            self.end_reason = cause
            log.info("connection closed: %s", reason, extra={"peer": self.peer, "listener": self.listener})
            self._scope.cancel()

    def stop_reading(self) -> None:
        """Graceful shutdown: finish the frame being read, answer what is in flight, close."""
        self._stopping = True
        if self._splitter.idle:
            self.session.stop()
            if self.session.state is State.DONE:
                self.end_reason = "drained"
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
                if self._client is not None:
                    await self._client.aclose()
                await trio.aclose_forcefully(self._tcp)  # a no-op once the client transport owns the socket
            self._lifecycle("close")

    async def _serve(self) -> None:
        client = await self._client_stream()
        # The first request decides what this is before any broker is involved: an HTTP
        # probe is answered even while the broker is down, and a client that never
        # speaks never costs an upstream connection.
        if not await self._first_bytes(client):
            return
        try:
            link = await self.port.connect(self.client_certificate)
        except NoClientIdentity as exc:
            raise ConnectionClosed("no_client_identity", str(exc)) from None
        except UpstreamUnavailable as exc:
            raise ConnectionClosed("upstream_unavailable", str(exc)) from None
        self.upstream_address = link.address
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, self._pump_responses, link.transport, client, nursery)
                await self._pump(self._pump_requests, client, link.transport, nursery)
        finally:
            with trio.CancelScope(shield=True):
                await link.transport.aclose()

    async def _pump(self, pump: _Pump, source: Transport, sink: Transport, nursery: trio.Nursery) -> None:
        """Runs one direction; whatever ends it ends the connection (and only this one)."""
        try:
            await pump(source, sink)
        except Exception as exc:
            self._closed_by(self._ending(exc))
        finally:
            nursery.cancel_scope.cancel()

    # -- before the first request -------------------------------------------------------

    async def _client_stream(self) -> Transport:
        client = await self._open_client_stream()
        # Kafka's idle expiry counts socket activity, not requests in flight: a client that
        # takes no byte of its responses for connections.max.idle.ms is closed (a frozen
        # client would otherwise hold its connection, and what it was sent, for ever). In
        # both modes: it is the proxy's hygiene, not a limit observe mode only reports.
        idle_ms = self.runtime.gate.quotas.limits.connections_max_idle_ms
        if idle_ms >= 0:
            client.stall_timeout = idle_ms / 1000
        return client

    async def _open_client_stream(self) -> Transport:
        termination = self.port.tls
        if termination is None:
            self._client = SocketTransport(stdlib_socket(self._tcp))
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
            raise ConnectionClosed("tls_handshake", f"TLS handshake failed: {exc!r}", reason) from None
        self.client_certificate = verified_client_certificate(self._client.sock)
        return self._client

    async def _expect_client_hello(self) -> None:
        """On a TLS listener, name a client that speaks plaintext before the TLS
        library answers it with an alert the client would read as a 352 MB length."""
        head = b""
        with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
            try:
                head = await self._tcp.socket.recv(5, socket.MSG_PEEK)  # leaves the bytes for TLS
            except OSError:
                return  # already gone: the handshake reports it
        if not head or looks_like_tls(head) or head[0] == 0x16:  # 0x16: a ClientHello begins
            return
        what = "an HTTP request" if looks_like_http(head) else f"plaintext (first bytes {head.hex()})"
        reason = f"client sent {what} to a TLS listener; it needs TLS"
        decision = Decision(
            Policy.PROTOCOL, Action.CLOSE, Mode.ENFORCE, "client_plaintext_on_tls", reason, subject=_CLIENT_SIDE
        )
        self.runtime.recorder.record(decision, self.where)
        raise ConnectionClosed("client_plaintext_on_tls", reason)

    async def _first_bytes(self, client: Transport) -> bool:
        """Read until the first length prefix is here and check it (TLS or HTTP on a
        plaintext port is named; HTTP gets a 400). False when the client left first."""
        splitter = self._splitter
        while not splitter.prefix_ready:
            data = await client.receive(RECEIVE_SIZE)
            if not data:
                return False
            self.bytes_in += len(data)
            splitter.feed(data)
        try:
            splitter.check_prefix(self._request_limit(self.runtime.generation).size)
        except FrameRefused as exc:
            await self._refuse_prefix(client, exc)
        return True

    # -- client -> broker ---------------------------------------------------------------

    async def _pump_requests(self, client: Transport, upstream: Transport) -> None:
        """The client -> broker direction. ``request.body.timeout.ms`` is the one deadline on
        it: armed once per frame whose body is still to come, on one scope kept for the life
        of the connection (a frame that arrives with its prefix needs none)."""
        with self._body_deadline:
            await self._take_requests(client, upstream)
        if self._body_deadline.cancelled_caught:
            self._body_timed_out()

    async def _take_requests(self, client: Transport, upstream: Transport) -> None:
        runtime, session, splitter, deadline = self.runtime, self.session, self._splitter, self._body_deadline
        while True:
            gen = runtime.generation
            now = trio.current_time()  # the policies' clock: one read per batch
            started = perf_counter()  # the added-latency clock (a cheaper read)
            buf = splitter.buffer
            out: list[memoryview | bytes] = []
            run_start = run_end = -1  # the run of frames that go on as one slice of buf
            sent: list[Pending] = []
            max_bytes = gen.socket_request_max_bytes if self._authenticated else self._request_limit(gen).size
            while session.taking_requests:
                try:
                    span = splitter.next_frame(max_bytes)
                except FrameRefused as exc:
                    await self._refuse_prefix(client, exc)
                if span is None:
                    break
                start, end = span
                if not await self._take_request(gen, client, buf, start, end, now, sent):
                    continue  # answered by the proxy: the broker never sees it
                if run_end != start:
                    if run_start >= 0:
                        out.append(memoryview(buf)[run_start:run_end])
                    run_start = start
                run_end = end
            if run_start >= 0:
                out.append(memoryview(buf)[run_start:run_end])
            if not splitter.frame_size and deadline.deadline != math.inf:
                deadline.deadline = math.inf  # the frame it was armed for is whole
            if out:
                await upstream.send(out[0] if len(out) == 1 else b"".join(out))
                elapsed = perf_counter() - started
                for pending in sent:
                    pending.request_seconds = elapsed  # the response adds its own
            if self._stopping and splitter.idle:
                session.stop()
            if not session.taking_requests:
                if session.state is State.DONE:
                    self.end_reason = "drained"
                    return
                await trio.sleep_forever()  # draining: the response pump ends the connection
            if splitter.frame_size:  # inside a frame whose body is still to come
                if deadline.deadline == math.inf:
                    deadline.deadline = trio.current_time() + gen.request_body_timeout_s
                    self._body_timeout_ms = round(gen.request_body_timeout_s * 1000)
                if self._partial_ticket is None:  # KIP-72: memory for the body before reading it
                    self._waiting_for = "pool memory"
                    self._partial_ticket = await self._reserve(splitter.frame_size, trio.current_time())
                self._waiting_for = "its body"
                if session.in_flight >= MAX_PENDING_REQUESTS:
                    # At the cap: the rest of this frame only, so that the cap holds reading right after
                    # it (a receive ending mid-frame otherwise read on past the cap, 64 KiB at a time).
                    data = await client.receive(min(splitter.wanted, MAX_RECEIVE))
                else:
                    data = await client.receive(max(RECEIVE_SIZE, min(splitter.wanted, MAX_RECEIVE)))
            else:
                if session.in_flight >= MAX_PENDING_REQUESTS:
                    self._room = trio.Event()  # the response pump sets it once half are answered
                    await self._room.wait()
                    self._room = None
                data = await client.receive(RECEIVE_SIZE)
            self.bytes_in += len(data)
            if not data:
                if not splitter.idle:
                    raise ConnectionClosed("truncated_frame", splitter.truncated())
                session.client_left()
                return
            splitter.feed(data)

    async def _take_request(
        self,
        gen: Generation,
        client: Transport,
        buf: Received,
        start: int,
        end: int,
        now: float,
        sent: list[Pending],
    ) -> bool:
        """Take one request frame; True when it goes on to the broker (its Pending, when
        a response is to come, is added to ``sent``), False when the proxy answered it."""
        api_key, api_version, correlation_id = wire.peek_head(buf, start)
        size = end - start
        self.requests += 1
        plan = gen.plan(api_key, api_version)
        stats = self.port.stats
        stats.requests[plan.counted_as] = stats.requests.get(plan.counted_as, 0) + 1
        stats.request_bytes += size
        if not plan.readable:
            raise ConnectionClosed(
                "unreadable_version",
                f"{wire.api_name(api_key)} v{api_version} is not a version the proxy can read; "
                "the client ignored the versions it was offered",
            )
        ticket = self._partial_ticket  # reserved before its body was read
        if ticket is None:
            admission = self.runtime.pool.reserve(self.conn_id, size - 4, now, self.where)
            ticket = admission.ticket
            if admission.waits:  # the pool makes this connection wait: its socket is not read meanwhile
                await self.runtime.pool.wait_for(ticket)  # type: ignore[arg-type]
        self._partial_ticket = None
        request = None
        if plan.request_hooks or plan.response_hooks:
            request = Request(buf, start, end, api_key, api_version, correlation_id, self.where, self._coordinator, now)
        client_id = None
        window = self.runtime.window
        if window is not None:  # the audit's observation windows: sizes per client id and API
            client_id = request.client_id if request is not None else wire.peek_client_id(buf, start)
            window.on_request(self.listener, client_id, wire.api_name(api_key), size)
            if self.requests == 1:
                self.first_client_id = client_id  # names the client in the connection's close event
        if request is not None and plan.request_hooks:
            if plan.prepare_hooks:
                await gen.prepare(request, plan.prepare_hooks)
            decision = gen.check_request(request, plan.request_hooks)
            if decision is not None:
                await self._answer(client, gen, request, decision, ticket)
                return False
        gate = self.runtime.gate
        if api_key == PRODUCE and (
            request.produce_head() if request is not None else wire.produce_head(buf, start, api_version)
        )[1] == 0:
            # acks=0: no response will come; the bytes are in hand and go out in this batch.
            self.session.forwarded_without_answer(correlation_id)
            gate.touched(self.conn_id, now)
            self.runtime.pool.release(ticket, now)
            return True
        pending = Pending(correlation_id, api_key, api_version, size, ticket, client_id=client_id)
        if plan.response_hooks:
            pending.on_response = (request, plan.response_hooks)
        self.session.forwarded(pending)
        gate.on_request(self.conn_id, now)
        sent.append(pending)
        return True

    async def _answer(
        self, client: Transport, gen: Generation, request: Request, decision: Decision, ticket: int | None
    ) -> None:
        """Carry out an enforced decision on a request: the proxy's own answer, in order;
        or, when no answer can be given, the end of the connection."""
        if decision.action is Action.CLOSE:
            raise ConnectionClosed(decision.policy.value, decision.reason)
        pending = Pending(
            request.correlation_id,
            request.api_key,
            request.api_version,
            request.end - request.start,
            ticket,
            answer=gen.answer(request, decision),
            client_id=request.client_id,
            close_after=decision.close_after,
            close_cause=decision.policy.value,
            close_reason=decision.reason,
        )
        self.runtime.gate.on_request(self.conn_id, request.now)
        if self.session.answered_by_proxy(pending):  # nothing ahead of it: it goes out now
            await self._write_answers(client)

    async def _reserve(self, size: int, now: float) -> int | None:
        """Memory for a request body from the pool (KIP-72): at once, unless the pool makes
        the connection wait (then this socket is not read meanwhile: TCP backpressure)."""
        pool = self.runtime.pool
        admission = pool.reserve(self.conn_id, size, now, self.where)
        ticket = admission.ticket
        if admission.waits:
            await pool.wait_for(ticket)  # type: ignore[arg-type]
        return ticket

    def _body_timed_out(self) -> NoReturn:
        """request.body.timeout.ms passed with a frame's memory or body still to come: a
        stalled sender holds neither memory nor a place in the pool's queue for long."""
        size, timeout_ms = self._splitter.frame_size, self._body_timeout_ms
        decision = Decision(
            Policy.MEMORY_POOL,
            Action.CLOSE,
            Mode.ENFORCE,
            "request.body.timeout.ms",
            f"a {size}-byte request did not complete within request.body.timeout.ms={timeout_ms} "
            f"(waiting for {self._waiting_for})",
            limit=timeout_ms,
            subject={"size": size},
        )
        self.runtime.recorder.record(decision, self.where)
        raise ConnectionClosed("request_body_timeout", decision.reason)

    # -- broker -> client ---------------------------------------------------------------

    async def _pump_responses(self, upstream: Transport, client: Transport) -> None:
        runtime, session = self.runtime, self.session
        splitter = FrameSplitter(sniff=not runtime.connector.tls_enabled)
        rewritten = runtime.metrics.responses_rewritten
        healthy = False
        while True:
            data = await upstream.receive(max(RECEIVE_SIZE, min(splitter.wanted, MAX_RECEIVE)))
            if not data:
                raise ConnectionClosed("upstream_closed", f"broker {self.upstream_address} closed the connection")
            if not healthy:
                runtime.connector.healthy(self.upstream_address)
                healthy = True
            splitter.feed(data)
            gen = runtime.generation
            limit = gen.max_response_size[self.listener]
            now = trio.current_time()
            started = perf_counter()
            buf = splitter.buffer
            out: list[memoryview | bytes] = []
            run_start = run_end = -1
            delivered: list[Pending] = []
            while True:
                try:
                    span = splitter.next_frame(limit)
                except FrameRefused as exc:
                    self._refuse_response(exc, gen, limit)  # observe mode: let it through
                    splitter.admit(exc.verdict.size)
                    continue
                if span is None:
                    break
                start, end = span
                pending = session.on_response(wire.response_correlation_id(buf, start))
                if pending is not None:
                    pending.response_size = end - start
                    if pending.api_key == SASL_AUTHENTICATE:
                        self._sasl_authenticate_answered(buf, start, end, pending.api_version)
                if pending is not None and pending.on_response is None:
                    if run_end != start:
                        if run_start >= 0:
                            out.append(memoryview(buf)[run_start:run_end])
                        run_start = start
                    run_end = end
                else:
                    if run_start >= 0:
                        out.append(memoryview(buf)[run_start:run_end])
                    run_start = run_end = -1
                    if pending is None:
                        continue  # an answer to acks=0 Produce (Tansu sends them): the client expects none
                    request, hooks = pending.on_response
                    frame = bytes(buf[start:end])
                    changed = await gen.on_response(request, hooks, frame)
                    if changed is not None:
                        rewritten.labels(self.listener, wire.api_name(pending.api_key)).inc()
                        pending.response_size = len(changed)
                    out.append(changed if changed is not None else frame)
                delivered.append(session.delivered())
                while session.answers_ready():  # the proxy's own answers queued behind it
                    answered = session.delivered()
                    delivered.append(answered)
                    if run_start >= 0:
                        out.append(memoryview(buf)[run_start:run_end])
                    run_start = run_end = -1
                    out.append(answered.answer)  # type: ignore[arg-type]
            if run_start >= 0:
                out.append(memoryview(buf)[run_start:run_end])
            if out:
                await self._send_to_client(client, out)
                self._delivered(delivered, now, started)
                if self._room is not None and session.in_flight <= MAX_PENDING_REQUESTS // 2:
                    self._room.set()
            if session.state is State.DONE:
                self.end_reason = "drained"
                return

    def _refuse_response(self, refused: FrameRefused, gen: Generation, limit: int) -> None:
        """A response length the proxy must not read: recorded; enforced, it ends the connection."""
        verdict = refused.verdict
        head = self.session.pending[0] if self.session.pending else None
        about = (
            f"response to {wire.api_name(head.api_key)} v{head.api_version} correlation id {head.correlation_id}"
            if head is not None
            else "unsolicited response"
        )
        decision = decide_response_prefix(verdict, limit, gen.response_size_mode, about)
        if decision.policy is Policy.PROTOCOL and verdict.kind is FrameKind.TLS_RECORD:
            message = self.runtime.connector.mismatch(self.upstream_address, decision.limit_key, decision.reason)
            self.runtime.recorder.record(decision, self.where, upstream=self.upstream_address)
            raise ConnectionClosed("upstream_tls_on_plaintext", message)
        self.runtime.recorder.record(
            decision,
            self.where,
            upstream=self.upstream_address,
            api_key=head.api_key if head else None,
            api_version=head.api_version if head else None,
            correlation_id=head.correlation_id if head else None,
        )
        if decision.enforced:
            cause = "response_too_large" if decision.policy is Policy.RESPONSE_SIZE else "response_invalid_size"
            raise ConnectionClosed(cause, decision.reason)

    # -- writing to the client ----------------------------------------------------------

    async def _write_answers(self, client: Transport) -> None:
        """Write the proxy's own answers now at the head of the line."""
        delivered: list[Pending] = []
        out: list[memoryview | bytes] = []
        while self.session.answers_ready():
            answered = self.session.delivered()
            delivered.append(answered)
            out.append(answered.answer)  # type: ignore[arg-type]
        if out:
            now, started = trio.current_time(), perf_counter()
            await self._send_to_client(client, out)
            self._delivered(delivered, now, started)

    async def _send_to_client(self, client: Transport, out: list[memoryview | bytes]) -> None:
        """The one way bytes reach the client. Both pumps may write (the response pump
        broker responses, the request pump the proxy's own answers when nothing is
        ahead of them), so a second writer waits for the first: order is kept because
        each pump takes its frames off the session's line before it waits."""
        while self._writing:
            if self._written is None:
                self._written = trio.Event()
            await self._written.wait()
        self._writing = True
        try:
            data = out[0] if len(out) == 1 else b"".join(out)
            try:
                await client.send(data)
            except SendStalled:
                self._send_stalled(client.stall_timeout)
            self.bytes_out += len(data)
            self.port.stats.response_bytes += len(data)
        finally:
            self._writing = False
            if self._written is not None:
                self._written.set()
                self._written = None

    def _send_stalled(self, seconds: float) -> NoReturn:
        idle_ms = round(seconds * 1000)
        decision = Decision(
            Policy.CONNECTIONS,
            Action.CLOSE,
            Mode.ENFORCE,
            "connections.max.idle.ms",
            f"connections.max.idle.ms={idle_ms} exceeded (the client read no response byte for {seconds:g}s)",
            limit=idle_ms,
        )
        self.runtime.recorder.record(decision, self.where)
        raise ConnectionClosed("closed: connections.max.idle.ms", decision.reason)

    def _delivered(self, delivered: list[Pending], now: float, started: float) -> None:
        """Responses are with the client: release their memory, mark activity, time them."""
        response_time = perf_counter() - started
        stats, gate, pool, window = self.port.stats, self.runtime.gate, self.runtime.pool, self.runtime.window
        close_after: Pending | None = None
        for pending in delivered:
            stats.observe_latency(pending.request_seconds + response_time)
            if window is not None:
                size = pending.response_size or len(pending.answer or b"")
                window.on_response(self.listener, pending.client_id, wire.api_name(pending.api_key), size)
            gate.on_response(self.conn_id, now)
            pool.release(pending.ticket, now)
            if pending.close_after and close_after is None:
                close_after = pending
        if close_after is not None:
            raise ConnectionClosed(close_after.close_cause, f"{close_after.close_reason}; closed after the answer")

    # -- helpers ------------------------------------------------------------------------

    async def _refuse_prefix(self, client: Transport, refused: FrameRefused) -> NoReturn:
        """A request length prefix no Kafka request has: recorded, then the connection ends
        (HTTP is told, in HTTP, that this is a Kafka port)."""
        verdict = refused.verdict
        limit = self._request_limit(self.runtime.generation)
        decision = decide_request_prefix(verdict, limit.size, limit.key)
        self.runtime.recorder.record(decision, self.where, size=verdict.size)
        if verdict.kind is FrameKind.HTTP:
            with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
                await client.send(_HTTP_400)
            raise ConnectionClosed("client_http_on_kafka_port", decision.reason)
        if verdict.kind is FrameKind.TLS_RECORD:
            raise ConnectionClosed("client_tls_on_plaintext", decision.reason)
        raise ConnectionClosed(f"request_{verdict.kind.value}", f"{decision.reason} (first bytes {refused.head.hex()})")

    def _sasl_authenticate_answered(self, buf: Received, start: int, end: int, api_version: int) -> None:
        """SASL passes through: the broker's answer says whether the client is authenticated."""
        if self._sasl:
            if not self._authenticated:
                self._authenticated = _sasl_authenticated(buf, start, end, api_version)
            return
        _closes.log(
            logging.WARNING,
            (self.listener, "sasl_unmarked"),
            trio.current_time(),
            "listener %s carries SASL authentication but is not marked sasl: true: frames before "
            "authentication are bounded by socket.request.max.bytes, not sasl.server.max.receive.size",
            self.listener,
            extra={"peer": self.peer, "listener": self.listener},
        )

    def _request_limit(self, gen: Generation) -> RequestLimit:
        policies = gen.config.policies
        return request_limit(
            policies.socket_request_max_bytes, policies.sasl_server_max_receive_size, authenticated=self._authenticated
        )

    async def _coordinator(self) -> UpstreamLink:
        """A second connection to this connection's broker: the group's coordinator
        (clients send group requests to the coordinator)."""
        host, _, port = self.upstream_address.rpartition(":")
        return await self.runtime.connector.connect(host, int(port), client=self.client_certificate)

    def _unanswered(self) -> None:
        """Requests whose responses never came (sent or not): the hooks that read their
        responses let go of what they held for them (a group join's slot)."""
        for pending in self.session.pending:
            if pending.on_response is not None:
                request, hooks = pending.on_response
                for hook in hooks:
                    hook.on_unanswered(request)

    def _ending(self, exc: Exception) -> ConnectionClosed:
        """What ended the connection, as the cause its close is counted under."""
        if isinstance(exc, ConnectionClosed):
            return exc
        if isinstance(exc, (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError)):
            return ConnectionClosed("broken", f"connection broken: {exc.__cause__ or exc!r}")
        if isinstance(exc, wire.MalformedFrame):
            return ConnectionClosed("malformed_frame", str(exc))
        if isinstance(exc, UnexpectedResponse):
            return ConnectionClosed("unexpected_response", str(exc))
        # A bug must cost one connection, not the proxy.
        log.error("internal error on connection", exc_info=exc, extra={"peer": self.peer, "listener": self.listener})
        return ConnectionClosed("internal_error", repr(exc))

    def _closed_by(self, exc: ConnectionClosed) -> None:
        self.end_reason = exc.cause
        self.runtime.metrics.connection_failures.labels(self.listener, exc.cause).inc()
        _closes.log(
            logging.WARNING,
            (self.listener, exc.cause, exc.detail),
            trio.current_time(),
            "connection closed: %s",
            exc,
            extra={"peer": self.peer, "listener": self.listener, "cause": exc.cause},
        )

    def _lifecycle(self, event: str) -> None:
        """Connection open and close, for the observation window and the audit."""
        closed: dict[str, object] = {}
        if event == "close":
            closed = {
                "reason": self.end_reason,
                "duration_seconds": trio.current_time() - self._opened,
                "requests": self.requests,
                "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out,
                "client_id": self.first_client_id,
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
        )


def _sasl_authenticated(buf: Received, start: int, end: int, api_version: int) -> bool:
    """The broker accepted the client's SASL authentication (SaslAuthenticate error code 0)."""
    try:
        return bool(wire.decode_response(bytes(buf[start:end]), SASL_AUTHENTICATE, api_version).body.error_code == 0)
    except wire.MalformedFrame:
        return False  # unreadable: the client stays bounded as unauthenticated
