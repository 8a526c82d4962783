"""One client connection: a TLS handshake if the listener has TLS, one upstream
connection, and two pumps in one nursery.

client -> broker: length prefix checked before the body is read, header peeked,
Produce/Fetch bodies forwarded as bytes. broker -> client: responses arrive in
request order (a broker answers one request per connection at a time); the few
that carry broker addresses or API versions are decoded and rewritten.
"""

from __future__ import annotations

import collections
import itertools
import logging
import socket
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from policies.frame_check import FrameKind, FrameVerdict, looks_like_http, looks_like_tls

from . import rewrite, wire
from .framing import FrameReader, TruncatedFrame
from .group_tracking import GroupRequest
from .request_admission import Answer
from .upstream import UpstreamLink, UpstreamUnavailable

if TYPE_CHECKING:
    from .listener import ListenerRuntime, Route

log = logging.getLogger("kafka_admission_proxy.connection")

HANDSHAKE_TIMEOUT_S = 10.0
_HTTP_400_BODY = b"This is a Kafka port (kafka-admission-proxy), not HTTP.\n"
_HTTP_400 = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_HTTP_400_BODY), _HTTP_400_BODY)
)


_ids = itertools.count(1)


class ConnectionClosed(Exception):
    """Ends a connection; ``cause`` is its metric label, the message its log line."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


@dataclass(slots=True)
class InFlight:
    """A request awaiting its answer, in the order the client sent it."""

    correlation_id: int
    api_key: int
    api_version: int
    proxy_seconds: float = 0.0  # time the request spent inside the proxy
    answer: Answer | None = None  # the proxy's own answer: the broker never saw the request
    ticket: int | None = None  # its bytes in the memory pool, released once answered
    group_request: GroupRequest | None = None  # a group API: its response updates the group tracker


class ClientConnection:
    def __init__(self, listener: ListenerRuntime, route: Route, stream: trio.SocketStream) -> None:
        self.listener = listener
        self.route = route
        self._tcp = stream
        try:
            host, port = stream.socket.getpeername()[:2]
            self.peer, self.peer_ip = f"{host}:{port}", str(host)
        except OSError:
            self.peer, self.peer_ip = "unknown", "unknown"
        self.conn_id = f"{listener.config.name}-{next(_ids)}"
        self.tls = listener.ssl_context is not None
        self._scope = trio.CancelScope()  # cancelled to close the connection from outside
        # Requests awaiting an answer, in the order the client sent them.
        self._pending: collections.deque[InFlight] = collections.deque()
        self._requests_done = False
        self.in_flight = 0
        self._unanswered: collections.deque[int] = collections.deque(maxlen=64)  # acks=0 Produce ids
        self._stopping = False
        self._idle_scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self.upstream_address = "unconnected"

    @property
    def busy(self) -> bool:
        return self.in_flight > 0

    def close_now(self, cause: str, reason: str) -> None:
        """Close from outside (eviction, idle expiry, a lowered limit; the gate counts it)."""
        if not self._scope.cancel_called:
            log.info(
                "connection closed: %s",
                reason,
                extra={"peer": self.peer, "listener": self.listener.config.name, "cause": cause},
            )
            self._scope.cancel()

    def stop_reading(self) -> None:
        """Graceful shutdown: finish the frame being read, answer what is in flight, close."""
        self._stopping = True
        if self._idle_scope is not None:
            self._idle_scope.cancel()

    async def run(self) -> None:
        with self._scope:
            await self._serve()

    async def _serve(self) -> None:
        cfg = self.listener.config
        try:
            await self._connect_and_pump()
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self._tcp)  # closed already on most paths; harmless twice
            log.debug("connection closed", extra={"peer": self.peer, "listener": cfg.name})

    async def _connect_and_pump(self) -> None:
        try:
            client = await self._client_stream()
            link = await self.route.connect()
        except ConnectionClosed as exc:
            self._closed_by(exc)
            return
        except UpstreamUnavailable as exc:
            self._closed_by(ConnectionClosed("upstream_unavailable", str(exc)))
            return
        upstream = link.stream
        self.upstream_address = link.address
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._guard, self._pump_requests, client, upstream)
                nursery.start_soon(self._guard, self._pump_responses, upstream, client)
        finally:
            if self.listener.pool.enabled:
                self.listener.pool.cancel(self)  # whatever it held or waited for goes back
            # Shielded: when the connection is closed from outside (eviction, idle expiry)
            # its scope is cancelled, and an unshielded close would be cancelled too.
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(upstream)
                await trio.aclose_forcefully(client)

    async def _client_stream(self) -> trio.abc.Stream:
        context = self.listener.ssl_context
        if context is None:
            return self._tcp
        await self._expect_client_hello()
        stream = trio.SSLStream(self._tcp, context, server_side=True)
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                await stream.do_handshake()
        except TruncatedFrame as exc:
            self._closed_by(ConnectionClosed("truncated_frame", str(exc)))
        except wire.MalformedFrame as exc:
            self._closed_by(ConnectionClosed("malformed_frame", str(exc)))
        except (trio.BrokenResourceError, trio.TooSlowError, ssl.SSLError, OSError) as exc:
            self.listener.metrics.handshake_failures.labels(self.listener.config.name).inc()
            cause = exc.__cause__ or exc
            raise ConnectionClosed("tls_handshake", f"TLS handshake failed: {cause!r}") from None
        return stream

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
        self._mismatch("client", "plaintext_on_tls")
        raise ConnectionClosed("client_plaintext_on_tls", f"client sent {what} to a TLS listener; it needs TLS")

    def _mismatch(self, direction: str, kind: str) -> None:
        self.listener.metrics.protocol_mismatches.labels(direction, kind).inc()
        self.listener.audit.emit(
            "protocol_mismatch", direction=direction, kind=kind, listener=self.listener.config.name, peer=self.peer
        )

    async def _guard(self, pump, source: trio.abc.Stream, sink: trio.abc.Stream) -> None:  # type: ignore[no-untyped-def]
        """Runs a pump; whatever ends it ends this connection only."""
        assert self._nursery is not None
        try:
            await pump(source, sink)
        except _Done:
            pass
        except ConnectionClosed as exc:
            self._closed_by(exc)
        except TruncatedFrame as exc:
            self._closed_by(ConnectionClosed("truncated_frame", str(exc)))
        except wire.MalformedFrame as exc:
            self._closed_by(ConnectionClosed("malformed_frame", str(exc)))
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError) as exc:
            cause = exc.__cause__ or exc
            self._closed_by(ConnectionClosed("broken", f"connection broken: {cause!r}"))
        except Exception as exc:  # a bug must cost one connection, not the proxy
            log.exception(
                "internal error on connection", extra={"peer": self.peer, "listener": self.listener.config.name}
            )
            self._closed_by(ConnectionClosed("internal_error", repr(exc)))
        self._nursery.cancel_scope.cancel()

    def _closed_by(self, exc: ConnectionClosed) -> None:
        name = self.listener.config.name
        self.listener.metrics.connection_failures.labels(name, exc.cause).inc()
        log.warning(
            "connection closed: %s",
            exc,
            extra={"peer": self.peer, "listener": name, "cause": exc.cause},
        )

    def _refuse_request(self, verdict: FrameVerdict, head: bytes) -> ConnectionClosed:
        """One decision, one count: a frame no Kafka request starts with."""
        if verdict.kind is FrameKind.TLS_RECORD:
            self._mismatch("client", "tls_on_plaintext")
            return ConnectionClosed(
                "client_tls_on_plaintext", "client speaks TLS on a plaintext link; use TLS only on a TLS listener"
            )
        if verdict.kind is FrameKind.HTTP:
            self._mismatch("client", "http_on_kafka_port")
            return ConnectionClosed("client_http_on_kafka_port", "HTTP request on a Kafka port")
        name = self.listener.config.name
        kind = verdict.kind.value
        self.listener.metrics.frames_rejected.labels(name, "request", kind).inc()
        self.listener.audit.emit(
            "frame_rejected",
            listener=name,
            peer=self.peer,
            direction="request",
            kind=kind,
            size=verdict.size,
            head=head.hex(),
        )
        limit = self.listener.policies.socket_request_max_bytes
        return ConnectionClosed(
            f"request_{kind}", f"request length prefix {verdict.size} refused (socket.request.max.bytes={limit})"
        )

    def _refuse_response(self, verdict: FrameVerdict, head: bytes, request: InFlight | None) -> ConnectionClosed | None:
        """A response length the proxy must not read; None when observe mode lets it through."""
        if verdict.kind is FrameKind.TLS_RECORD:
            message = self.listener.connector.mismatch(
                self.upstream_address, "tls_on_plaintext", "speaks TLS; set upstream.tls.enabled"
            )
            return ConnectionClosed("upstream_tls_on_plaintext", message)
        about = (
            f"response to {wire.api_name(request.api_key)} v{request.api_version} "
            f"correlation id {request.correlation_id}"
            if request is not None
            else "unsolicited response"
        )
        if verdict.kind is FrameKind.INVALID_SIZE:
            return ConnectionClosed("response_invalid_size", f"{about}: invalid length prefix {verdict.size}")
        policies = self.listener.policies
        limit = policies.max_response_size_for(self.listener.config.name)
        mode = policies.mode_of(policies.response_size_mode)
        name = self.listener.config.name
        self.listener.metrics.responses_oversized.labels(name, mode).inc()
        self.listener.audit.emit(
            "response_oversized",
            listener=name,
            peer=self.peer,
            upstream=self.upstream_address,
            mode=mode,
            api=wire.api_name(request.api_key) if request else None,
            correlation_id=request.correlation_id if request else None,
            size=verdict.size,
            limit=limit,
        )
        message = f"{about} is {verdict.size} bytes, over max.response.size={limit}"
        if mode == "observe":
            log.warning("would close: %s (observe mode)", message, extra={"peer": self.peer, "listener": name})
            return None
        return ConnectionClosed("response_too_large", message)

    async def _wait_for_next_request(self, reader: FrameReader) -> bool:
        """Wait for a next frame to begin; False when the client is gone or we are stopping."""
        if not reader.idle:
            return True
        if self._stopping:
            return False
        arrived = False
        with trio.CancelScope() as scope:
            self._idle_scope = scope
            arrived = await reader.fill(1)
        self._idle_scope = None
        return arrived and not scope.cancelled_caught

    async def _pump_requests(self, client: trio.abc.Stream, upstream: trio.abc.Stream) -> None:
        listener = self.listener
        name = listener.config.name
        admission = listener.admission
        pool = listener.pool
        count = listener.request_counter
        request_bytes = listener.metrics.request_bytes.labels(name)
        max_bytes = listener.policies.socket_request_max_bytes
        reader = FrameReader(client, plaintext=listener.ssl_context is None)
        while await self._wait_for_next_request(reader):
            verdict = await reader.next_prefix(max_bytes)
            if verdict is None:
                break
            if not verdict.admitted:
                refusal = self._refuse_request(verdict, reader.head)
                if verdict.kind is FrameKind.HTTP:
                    await client.send_all(_HTTP_400)
                raise refusal
            ticket, frame = await self._read_body(reader, verdict.size)
            started = trio.current_time()
            header = wire.peek_request_header(frame)
            count(header.api_key)
            if not self._codec_reads(header):
                raise ConnectionClosed(
                    "unreadable_version",
                    f"{wire.api_name(header.api_key)} v{header.api_version} is newer than the proxy can read; "
                    "the client ignored the versions it was offered",
                )
            if header.api_key in admission.groups.decoded_api_keys:
                await admission.groups.reconcile(header.api_key, header.api_version, frame, self._coordinator_link)
            answer, group_request = admission.check(header, frame, name, self.peer)
            if answer is not None:
                if answer.frame is None:
                    raise ConnectionClosed(answer.cause, answer.message)
                self._expect(
                    InFlight(header.correlation_id, header.api_key, header.api_version, answer=answer, ticket=ticket)
                )
                if len(self._pending) == 1:  # nothing before it: the answer goes out now
                    await self._deliver_answers(client)
                if answer.close_after:
                    break
                continue
            if header.api_key == wire.PRODUCE and wire.produce_acks(frame, header.api_version) == 0:
                self._unanswered.append(header.correlation_id)
                listener.gate.on_request(self)  # activity, with nothing left in flight after it
                listener.gate.on_response(self)
                await upstream.send_all(frame)
                if ticket is not None:
                    pool.release(ticket)  # acks=0: nothing more to wait for once the broker has it
            else:
                # Time inside the proxy ends here: waiting for the broker to read is not ours.
                self._expect(
                    InFlight(
                        header.correlation_id,
                        header.api_key,
                        header.api_version,
                        ticket=ticket,
                        proxy_seconds=trio.current_time() - started,
                        group_request=group_request,
                    )
                )
                await upstream.send_all(frame)
            request_bytes.inc(len(frame))
        if reader.eof:
            raise _Done()  # the client left; what it still awaited is not ours to deliver
        self._requests_done = True
        if not self._pending:
            raise _Done()
        await trio.sleep_forever()  # the response pump answers what is pending, then ends the connection

    def _codec_reads(self, header: wire.RequestHeader) -> bool:
        """False for a version of an API the proxy must decode that the codec does not know."""
        decodes = (
            self.listener.rewrites and rewrite.carries_addresses(header.api_key, header.api_version)
        ) or header.api_key in self.listener.admission.decoded_api_keys
        return not decodes or rewrite.codec_knows(header.api_key, header.api_version)

    def _expect(self, request: InFlight) -> None:
        self._pending.append(request)
        self.in_flight += 1
        self.listener.gate.on_request(self)

    async def _deliver_answers(self, client: trio.abc.Stream) -> None:
        """Write the proxy's own answers now at the head of the line, in order.

        Only one task writes at a time: the request pump calls this when its answer
        is alone in line, the response pump after each broker response it wrote.
        """
        while self._pending and self._pending[0].answer is not None:
            request = self._pending[0]
            answer = request.answer
            assert answer is not None and answer.frame is not None
            await client.send_all(answer.frame)
            self._pending.popleft()
            self._answered(request)
            if answer.close_after:
                raise ConnectionClosed(answer.cause, f"{answer.message}; closed after the answer")
        if self._requests_done and not self._pending:
            raise _Done()  # drained: every request read before the shutdown was answered

    async def _pump_responses(self, upstream: trio.abc.Stream, client: trio.abc.Stream) -> None:
        """Broker responses arrive in request order (a broker answers one request per
        connection at a time); each goes to the client with the answers queued behind it."""
        listener = self.listener
        name = listener.config.name
        response_bytes = listener.metrics.response_bytes.labels(name)
        latency = listener.metrics.proxy_latency.labels(name)
        reader = FrameReader(upstream, plaintext=not listener.connector.tls_enabled)
        limit = listener.policies.max_response_size_for(name)
        healthy = False
        while True:
            frame = await self._next_response(reader, limit)
            started = trio.current_time()
            if not healthy:
                listener.connector.healthy(self.upstream_address)
                healthy = True
            correlation_id = wire.response_correlation_id(frame)
            request = self._awaiting_broker()
            if request is None or correlation_id != request.correlation_id:
                if correlation_id in self._unanswered:
                    # Some brokers (Tansu) answer acks=0 Produce anyway; the client expects nothing.
                    self._unanswered.remove(correlation_id)
                    continue
                expected = request.correlation_id if request is not None else "none"
                raise ConnectionClosed(
                    "unexpected_response", f"broker answered correlation id {correlation_id}, expected {expected}"
                )
            if (request.api_key == wire.API_VERSIONS and listener.decoded_api_keys) or (
                listener.rewrites and rewrite.carries_addresses(request.api_key, request.api_version)
            ):
                frame = await self._rewritten(frame, request)
            if request.group_request is not None:
                self._track_group(request, frame)
            await client.send_all(frame)
            self._pending.popleft()
            self._answered(request)
            response_bytes.inc(len(frame))
            latency.observe(request.proxy_seconds + trio.current_time() - started)
            await self._deliver_answers(client)

    def _answered(self, request: InFlight) -> None:
        self.in_flight -= 1
        self.listener.gate.on_response(self)
        if request.ticket is not None:
            self.listener.pool.release(request.ticket)

    async def _read_body(self, reader: FrameReader, size: int) -> tuple[int | None, bytes]:
        """Memory for the frame from the pool (KIP-72), then its body; both within
        request.body.timeout.ms, so a stalled sender holds neither memory nor a place
        in the pool's queue for long. Returns (pool ticket or None, whole frame)."""
        listener = self.listener
        timeout_ms = listener.policies.request_body_timeout_ms
        ticket = None
        with trio.move_on_after(timeout_ms / 1000):
            if listener.pool.enabled:
                ticket = await listener.pool.reserve(self, size, listener.config.name, self.peer)
            return ticket, await reader.read_frame(size)
        waited_for = "its body" if ticket is not None or not listener.pool.enabled else "pool memory"
        listener.audit.emit(
            "request_body_timeout",
            listener=listener.config.name,
            peer=self.peer,
            size=size,
            timeout_ms=timeout_ms,
            waiting_for=waited_for,
        )
        raise ConnectionClosed(
            "request_body_timeout",
            f"a {size}-byte request did not complete within request.body.timeout.ms={timeout_ms} "
            f"(waiting for {waited_for})",
        )

    async def _coordinator_link(self) -> UpstreamLink:
        """A second connection to this connection's broker: the group's coordinator
        (clients send group requests to the coordinator)."""
        host, _, port = self.upstream_address.rpartition(":")
        return await self.listener.connector.connect(host, int(port))

    def _track_group(self, request: InFlight, frame: bytes) -> None:
        """Tell the group tracker what the coordinator answered, before the client hears it."""
        assert request.group_request is not None
        try:
            self.listener.admission.groups.on_response(
                request.api_key, request.api_version, request.group_request, frame
            )
        except wire.MalformedFrame as exc:
            log.warning("group response not tracked: %s", exc, extra={"peer": self.peer})

    def _awaiting_broker(self) -> InFlight | None:
        """The request the broker's next response answers (None if the head is the proxy's own)."""
        return self._pending[0] if self._pending and self._pending[0].answer is None else None

    async def _next_response(self, reader: FrameReader, limit: int) -> bytes:
        """The broker's next frame, its length checked before it is read (KIP-498)."""
        verdict = await reader.next_prefix(limit)
        if verdict is None:
            raise ConnectionClosed("upstream_closed", f"broker {self.upstream_address} closed the connection")
        if not verdict.admitted:
            refusal = self._refuse_response(verdict, reader.head, self._awaiting_broker())
            if refusal is not None:
                raise refusal
        return await reader.read_frame(verdict.size)

    async def _rewritten(self, frame: bytes, request: InFlight) -> bytes:
        api_key, version = request.api_key, request.api_version
        try:
            response = wire.decode_response(frame, api_key, version)
        except wire.MalformedFrame:
            if api_key == wire.API_VERSIONS:
                # An UNSUPPORTED_VERSION answer is encoded as v0; the client retries lower.
                return frame
            raise
        body = response.body
        if api_key == wire.API_VERSIONS:
            if body.error_code != 0:
                return frame
            body = rewrite.cap_api_versions(
                body, hot_path=self.listener.rewrites, decoded=self.listener.decoded_api_keys
            )
            if body == response.body:
                return frame
        else:
            await self.listener.directory.learn(rewrite.brokers_in(body, api_key, version))
            body = rewrite.rewrite_addresses(body, api_key, version, self.listener.address_of)
        self.listener.metrics.responses_rewritten.labels(self.listener.config.name, wire.api_name(api_key)).inc()
        return wire.encode_frame(response.header, body)


class _Done(ConnectionClosed):
    """The connection ended normally (client left, or drained at shutdown)."""

    def __init__(self) -> None:
        super().__init__("done", "done")
