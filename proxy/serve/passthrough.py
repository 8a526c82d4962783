"""A ``tls: passthrough`` connection: the client's TLS bytes relayed, never decrypted,
to one broker, so the broker sees the client's own certificate (its ACLs, quotas and
audit log name the client) and nothing here can read a Kafka frame.

Only the connection-level policies apply (Kafka's ``ConnectionQuotas`` and KIP-1015,
through the same :class:`proxy.serve.connection_gate.ConnectionGate`): it is a TLS connection
for ``max.ssl.connections``. Without frames, "a request in flight" is "bytes being
relayed": a chunk read from one side counts as a request until it is written to the
other, so a connection is idle -- LRU-evictable, and closed after
``connections.max.idle.ms`` -- exactly when no byte moves either way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import trio

from policies.close_cause import CloseCause, Closing
from policies.connections import OpenCounts, decide_send_stall
from proxy.evidence.decisions import Where
from proxy.evidence.lifecycle import record_lifecycle
from proxy.evidence.metrics import TrafficStats
from proxy.links.transport import peer_address
from proxy.serve.runtime import Runtime

log = logging.getLogger("kafka_admission_proxy.passthrough")

CONNECT_TIMEOUT_S = 10.0
_CHUNK = 65536


class BrokerUnreachable(Exception):
    pass


@dataclass(frozen=True, slots=True)
class PassthroughRoute:
    """Where a passthrough port relays: its listener and the broker(s) to try, in order."""

    listener: str
    upstream_name: str
    brokers: tuple[tuple[str, int], ...]
    stats: TrafficStats


async def connect_first(brokers: tuple[tuple[str, int], ...]) -> tuple[trio.SocketStream, str]:
    """A plain TCP connection to the first broker that accepts (TLS is the client's)."""
    failures = []
    for host, port in brokers:
        try:
            with trio.fail_after(CONNECT_TIMEOUT_S):
                return await trio.open_tcp_stream(host, port), f"{host}:{port}"
        except (OSError, trio.TooSlowError) as exc:
            failures.append(f"{host}:{port}: {exc!r}")
    raise BrokerUnreachable("no passthrough broker accepted: " + "; ".join(failures))


class PassthroughConnection:
    """One relayed connection; the gate admits it, may close it, and is told of its bytes."""

    def __init__(
        self,
        route: PassthroughRoute,
        runtime: Runtime,
        stream: trio.SocketStream,
        conn_id: str,
    ) -> None:
        self.route = route
        self.runtime = runtime
        self._client = stream
        self.peer, self.peer_ip = peer_address(stream)
        self.listener = route.listener
        self.conn_id = conn_id
        self.tls = True  # counted against max.ssl.connections (KIP-1015)
        self.where = Where(route.listener, self.peer, self.conn_id, True)
        self.open_counts: OpenCounts | None = None  # set by the gate as it admits this connection
        self.upstream_address = "unconnected"
        self.bytes_in = 0
        self.bytes_out = 0
        self.closing: Closing | None = None  # why it ended, once it has
        self._scope = trio.CancelScope()
        self._opened = trio.current_time()

    # -- from outside: the gate and the server ------------------------------------------

    def close_now(self, closing: Closing) -> None:
        if not self._scope.cancel_called:
            self._ended(closing)
            log.info("connection closed: %s", closing.reason, extra={"peer": self.peer, "listener": self.listener})
            self._scope.cancel()

    def stop_reading(self) -> None:
        """Graceful shutdown: without frames there is no request boundary to finish at."""
        self.close_now(Closing(CloseCause.DRAINED, "shutting down (passthrough: no request boundary to wait for)"))

    # -- the connection's life ----------------------------------------------------------

    async def run(self) -> None:
        self._lifecycle("open")
        upstream: trio.SocketStream | None = None
        try:
            with self._scope:
                try:
                    upstream, self.upstream_address = await connect_first(self.route.brokers)
                except BrokerUnreachable as exc:
                    self._closed_by(Closing(CloseCause.UPSTREAM_UNAVAILABLE, str(exc)))
                    return
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._relay, upstream, self._client, False, nursery)
                    await self._relay(self._client, upstream, True, nursery)
        finally:
            with trio.CancelScope(shield=True):
                if upstream is not None:
                    await trio.aclose_forcefully(upstream)
                await trio.aclose_forcefully(self._client)
            self._lifecycle("close")

    async def _relay(
        self, source: trio.SocketStream, sink: trio.SocketStream, inbound: bool, nursery: trio.Nursery
    ) -> None:
        """One direction; its end (EOF, a reset, a stalled peer) ends the connection."""
        gate, stats = self.runtime.gate, self.route.stats
        try:
            while True:
                data = await source.receive_some(_CHUNK)
                if not data:
                    self._ended(Closing(CloseCause.CLIENT_CLOSED if inbound else CloseCause.BROKER_CLOSED))
                    return
                gate.on_request(self.conn_id, trio.current_time())  # bytes moving: not idle
                # A peer that takes no byte for connections.max.idle.ms is idle too (Kafka's
                # idle expiry counts socket activity): it must not hold the relay for ever.
                stall = self.runtime.generation.send_stall_s  # read at every send: a reload reaches it
                with trio.move_on_after(stall) as waited:
                    await sink.send_all(data)
                if waited.cancelled_caught:
                    self._send_stalled(stall, "client" if not inbound else "broker")
                    return
                gate.on_response(self.conn_id, trio.current_time())
                if inbound:
                    self.bytes_in += len(data)
                    stats.request_bytes += len(data)
                else:
                    self.bytes_out += len(data)
                    stats.response_bytes += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._closed_by(Closing(CloseCause.BROKEN, f"connection broken: {exc.__cause__ or exc!r}"))
        finally:
            nursery.cancel_scope.cancel()

    def _send_stalled(self, seconds: float, peer: str) -> None:
        """As a terminating connection's stalled send: a CLOSE of connections.max.idle.ms."""
        decision = decide_send_stall(seconds, peer)
        self.runtime.recorder.record(decision, self.where)
        self._ended(Closing(CloseCause.CLOSED_BY_LIMIT, decision.reason, decision.limit_key))

    def _ended(self, closing: Closing) -> None:
        if self.closing is None:  # the first cause is the one kept
            self.closing = closing

    def _closed_by(self, closing: Closing) -> None:
        self._ended(closing)
        self.runtime.count_failure(self.listener, self.peer, closing)

    def _lifecycle(self, event: str) -> None:
        """Open and close, marked ``passthrough`` (no requests or client id: the proxy never
        sees a frame)."""
        closed: dict[str, object] = {}
        if event == "close":
            closed = {
                "duration_seconds": trio.current_time() - self._opened,
                "upstream": self.upstream_address,
                "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out,
            }
        record_lifecycle(
            self.runtime.audit,
            self.runtime.window,
            event,
            conn_id=self.conn_id,
            listener=self.listener,
            peer=self.peer,
            tls=True,
            counts=self.open_counts,
            closed=closed,
            closing=self.closing,
            passthrough=True,
        )
