"""Connections to brokers: TCP, or TLS with CA verification."""

from __future__ import annotations

import ssl

import trio

from .config import UpstreamTls
from .metrics import Metrics

CONNECT_TIMEOUT_S = 10.0


class UpstreamUnavailable(Exception):
    pass


class UpstreamConnector:
    def __init__(self, tls: UpstreamTls, context: ssl.SSLContext | None, metrics: Metrics) -> None:
        self._tls = tls
        self._context = context
        self._metrics = metrics

    @property
    def tls_enabled(self) -> bool:
        return self._context is not None

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        try:
            with trio.fail_after(CONNECT_TIMEOUT_S):
                tcp = await trio.open_tcp_stream(host, port)
                if self._context is None:
                    return tcp
                stream = trio.SSLStream(
                    tcp, self._context, server_hostname=self._tls.server_hostname or host
                )
                try:
                    await stream.do_handshake()
                except BaseException:
                    await trio.aclose_forcefully(tcp)
                    raise
                return stream
        except (OSError, trio.TooSlowError, trio.BrokenResourceError, ssl.SSLError) as exc:
            self._metrics.upstream_connect_failures.labels(f"{host}:{port}").inc()
            cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) else exc
            raise UpstreamUnavailable(f"cannot connect to broker {host}:{port}: {cause or exc!r}") from exc

    async def connect_any(self, addresses: list[tuple[str, int]]) -> trio.abc.Stream:
        """The first of the bootstrap servers that answers."""
        errors = []
        for host, port in addresses:
            try:
                return await self.connect(host, port)
            except UpstreamUnavailable as exc:
                errors.append(str(exc))
        raise UpstreamUnavailable("; ".join(errors))
