"""Connections to brokers: TCP, or TLS with CA verification; and the naming of
a broker that speaks the other protocol (KIP-498), with backoff instead of
hammering it."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass

import trio

from policies.api_keys import INT_MAX
from policies.frame_check import FrameKind, check_length_prefix
from policies.response_size import decide_upstream_mismatch
from policies.upstream_backoff import Blocked, SharedBlock, UpstreamBackoff
from proxy.config.model import UpstreamTls
from proxy.evidence.decisions import DecisionRecorder
from proxy.evidence.logs import RateLimitedLog
from proxy.evidence.metrics import Metrics
from proxy.links.identity import ClientCertificate, IdentityIssuer, IdentityRefused
from proxy.links.transport import SocketTransport, TlsTransport, Transport, stdlib_socket

log = logging.getLogger("kafka_admission_proxy.upstream")

CONNECT_TIMEOUT_S = 10.0
HANDSHAKE_TIMEOUT_S = 5.0
# ApiVersions v0, correlation id 0, no client id: the cheapest request every broker answers.
_PROBE_REQUEST = b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x00\xff\xff"


class UpstreamUnavailable(Exception):
    pass


class NoClientIdentity(UpstreamUnavailable):
    """No identity toward brokers for this client (no verified certificate and
    ``without_certificate: refuse``, or the identity CA could not issue one)."""


def _not_tls(cause: BaseException | None) -> bool:
    """A handshake that failed the way a plaintext peer makes it fail: garbage back,
    a close (a Kafka broker drops a ClientHello read as a 369 MB request), or silence
    (a peer waiting for the rest of that 'request')."""
    if isinstance(cause, trio.TooSlowError | ssl.SSLEOFError | ConnectionResetError):
        return True
    reason = getattr(cause, "reason", None)
    return reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "UNEXPECTED_EOF_WHILE_READING")


@dataclass(frozen=True, slots=True)
class UpstreamLink:
    transport: Transport
    address: str  # host:port actually connected to


class UpstreamConnector:
    """Connections to brokers: for the proxy's own requests (``client`` None) with the
    proxy's own TLS identity; for a client's, with the identity issued for it when
    ``upstream.tls.client_identity`` is set."""

    def __init__(
        self, tls: UpstreamTls, context: ssl.SSLContext | None, metrics: Metrics, recorder: DecisionRecorder
    ) -> None:
        self._tls = tls
        self._context = context
        self._metrics = metrics
        self._recorder = recorder
        self.backoff = UpstreamBackoff()
        # A new block is told here (workers: N tell the other workers, which adopt it)
        self.on_block: Callable[[SharedBlock], None] = lambda block: None
        self._mismatch_log = RateLimitedLog(log)
        self.identity: IdentityIssuer | None = None
        self.identity = self.prepare_identity(tls)

    def prepare_identity(self, tls: UpstreamTls) -> IdentityIssuer | None:
        """The issuer for these settings: the running one while its CA files and settings
        are the same (its cache kept), a new one (an empty cache) when they changed.
        Raises TlsMaterialError when the CA cannot be loaded."""
        if tls.client_identity is None or not tls.enabled:
            return None
        issuer = IdentityIssuer(tls.client_identity, tls, self._metrics)
        if self.identity is not None and self.identity.fingerprint == issuer.fingerprint:
            return self.identity
        return issuer

    def use_tls(self, tls: UpstreamTls, context: ssl.SSLContext | None, identity: IdentityIssuer | None = None) -> None:
        """A reload: new broker connections use these TLS settings and files (and this
        identity CA); those open keep theirs."""
        self._tls, self._context, self.identity = tls, context, identity
        self._metrics.upstream_identity_cache_size.set(len(identity) if identity is not None else 0)

    async def _context_for(self, client: ClientCertificate | None) -> ssl.SSLContext | None:
        issuer = self.identity
        if self._context is None or issuer is None or client is None:
            return self._context
        if client.der is not None:
            return await issuer.context_for(client.der)
        if issuer.without_certificate == "proxy":
            return self._context
        raise IdentityRefused(
            "the client presented no verified certificate (upstream.tls.client_identity.without_certificate: refuse)"
        )

    @property
    def tls_enabled(self) -> bool:
        return self._context is not None

    def mismatch(self, address: str, kind: str, description: str) -> str:
        """``address`` speaks the other protocol: back off from it; returns the log line.
        (The caller records the decision: it knows the client connection.)"""
        now = trio.current_time()
        self._blocked(self.backoff.on_mismatch(address, description, now), now)
        message = f"upstream {address} {description}"
        self._mismatch_log.log(logging.ERROR, (address, kind), now, message, extra={"upstream": address})
        return message

    def _record_mismatch(self, address: str, kind: str, description: str) -> None:
        decision = decide_upstream_mismatch(address, kind, description)
        self._recorder.record(decision, upstream=address, direction="upstream")

    def _blocked(self, block: Blocked | None, now: float) -> None:
        if block is not None:
            self.on_block(self.backoff.share(block, now))

    def adopt(self, shared: SharedBlock) -> None:
        """Another worker's new block: new connections here wait it out too, rather than each worker
        trying the broker in turn."""
        if self.backoff.adopt(shared, trio.current_time()) is not None:
            log.debug("upstream %s %s (another worker backs off)", shared.upstream, shared.description)

    def healthy(self, address: str) -> None:
        self.backoff.on_healthy(address)

    def backing_off(self, host: str, port: int) -> bool:
        """A new connection to ``host:port`` would fail at once: it is backed off from."""
        return self.backoff.blocked(f"{host}:{port}", trio.current_time()) is not None

    async def connect(
        self, host: str, port: int, *, backing_off: bool = True, client: ClientCertificate | None = None
    ) -> UpstreamLink:
        """A connection to one broker; while it is backed off from (it was unreachable or
        spoke the other protocol), fails at once unless ``backing_off`` is False. With
        ``client``, on behalf of that client connection (its identity, see above)."""
        address = f"{host}:{port}"
        blocked = self.backoff.blocked(address, trio.current_time()) if backing_off else None
        if blocked is not None:
            raise UpstreamUnavailable(f"upstream {address} {blocked.description} (backing off)")
        try:
            context = await self._context_for(client)
        except IdentityRefused as exc:
            raise NoClientIdentity(f"no identity toward broker {address}: {exc}") from None
        try:
            with trio.fail_after(CONNECT_TIMEOUT_S):
                tcp = await trio.open_tcp_stream(host, port)
        except (OSError, trio.TooSlowError) as exc:
            self._metrics.upstream_connect_failures.labels(address).inc()
            # New connections fail fast for a while instead of each trying (and logging) again.
            now = trio.current_time()
            self._blocked(self.backoff.on_unreachable(address, f"cannot be reached ({exc!r})", now), now)
            raise UpstreamUnavailable(f"cannot connect to broker {address}: {exc!r}") from exc
        if context is None:
            return UpstreamLink(SocketTransport(stdlib_socket(tcp)), address)
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                hostname = self._tls.server_hostname or host
                transport = await TlsTransport.handshake(
                    stdlib_socket(tcp), context, server_side=False, server_hostname=hostname
                )
        except (trio.TooSlowError, OSError) as exc:  # ssl.SSLError included; the socket is closed
            self._metrics.upstream_connect_failures.labels(address).inc()
            if _not_tls(exc):
                what = "timed out" if isinstance(exc, trio.TooSlowError) else f"failed: {exc}"
                description = f"does not speak TLS (handshake {what}); check upstream.tls.enabled"
                self._record_mismatch(address, "upstream_plaintext_on_tls", description)
                raise UpstreamUnavailable(self.mismatch(address, "plaintext_on_tls", description)) from exc
            raise UpstreamUnavailable(f"TLS handshake with broker {address} failed: {exc!r}") from exc
        return UpstreamLink(transport, address)

    async def connect_any(
        self, addresses: list[tuple[str, int]], *, backing_off: bool = True, client: ClientCertificate | None = None
    ) -> UpstreamLink:
        """The first of the bootstrap servers that answers (one backed off from fails at once; what
        policies.connections.bootstrap_broker predicts from that is the listener's to keep true)."""
        errors = []
        for host, port in addresses:
            try:
                return await self.connect(host, port, backing_off=backing_off, client=client)
            except NoClientIdentity:
                raise  # the same at every broker
            except UpstreamUnavailable as exc:
                errors.append(str(exc))
        raise UpstreamUnavailable("; ".join(errors))

    async def probe(self, addresses: list[tuple[str, int]]) -> None:
        """Connect and exchange an ApiVersions request: reachable and speaking Kafka. The
        probe tries for real even while client connections back off: it is what tells
        that the broker is back (a healthy answer ends the backoff)."""
        link = await self.connect_any(addresses, backing_off=False)
        try:
            await link.transport.send(_PROBE_REQUEST)
            prefix = b""
            while len(prefix) < 4:
                chunk = await link.transport.receive(4 - len(prefix))
                if not chunk:
                    raise UpstreamUnavailable(f"upstream {link.address} closed the connection on ApiVersions")
                prefix += chunk
            verdict = check_length_prefix(prefix, INT_MAX, plaintext=self._context is None)
            if verdict.kind is FrameKind.TLS_RECORD:
                description = "speaks TLS; set upstream.tls.enabled"
                self._record_mismatch(link.address, "upstream_tls_on_plaintext", description)
                raise UpstreamUnavailable(self.mismatch(link.address, "tls_on_plaintext", description))
            self.healthy(link.address)
        except (trio.BrokenResourceError, OSError) as exc:
            raise UpstreamUnavailable(f"upstream {link.address} broke the connection: {exc!r}") from exc
        finally:
            with trio.CancelScope(shield=True):
                await link.transport.aclose()
