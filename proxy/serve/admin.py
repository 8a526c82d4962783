"""Admin HTTP: ``/metrics`` (Prometheus exposition), ``/healthz`` (alive),
``/readyz`` (listeners bound and an upstream broker reachable).

HTTP/1.1 is parsed by h11; this module only routes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import h11
import trio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.errors import BindError
from proxy.evidence.metrics import Metrics

log = logging.getLogger("kafka_admission_proxy.admin")

ReadinessCheck = Callable[[], Awaitable[list[str]]]
# The /metrics body when it is not this process's registry (the supervisor of workers).
Exposition = Callable[[], Awaitable[bytes]]
_REQUEST_TIMEOUT_S = 10.0
_MAX_REQUEST_BYTES = 16384
_DRAIN_TIMEOUT_S = 1.0


class AdminServer:
    def __init__(self, metrics: Metrics, readiness: ReadinessCheck, exposition: Exposition | None = None) -> None:
        self._metrics = metrics
        self._readiness = readiness
        self._exposition = exposition

    async def serve(
        self, host: str, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            raise BindError("admin", host, port, exc) from exc
        bound = listeners[0].socket.getsockname()[1]
        log.info("admin listening", extra={"bind": f"{host}:{bound}"})
        task_status.started(bound)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_REQUEST_BYTES)
        try:
            with trio.move_on_after(_REQUEST_TIMEOUT_S):
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await stream.receive_some(4096)
                        conn.receive_data(data)
                        if not data:
                            return
                        continue
                    if isinstance(event, h11.Request):
                        status, content_type, body = await self._route(event)
                        if event.method == b"HEAD":
                            body = b""  # h11 sends no body in an answer to HEAD
                        await self._send(stream, conn, status, content_type, body)
                        await self._drain(stream)
                    return
        except (h11.RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            return
        except Exception:  # a bug here must cost one admin request, not the proxy
            log.exception("admin request failed")
        finally:
            await trio.aclose_forcefully(stream)

    @staticmethod
    async def _drain(stream: trio.SocketStream) -> None:
        """Read what the client still sends (a request body we do not want) before closing:
        closing with unread bytes would reset the connection and lose our answer."""
        await stream.send_eof()
        received = 0
        with trio.move_on_after(_DRAIN_TIMEOUT_S):
            while received < _MAX_REQUEST_BYTES and (chunk := await stream.receive_some(4096)):
                received += len(chunk)

    async def _route(self, request: h11.Request) -> tuple[int, bytes, bytes]:
        path = request.target.split(b"?", 1)[0]
        if request.method != b"GET":
            return 405, b"text/plain", b"method not allowed\n"
        if path == b"/metrics":
            if self._exposition is not None:
                return 200, CONTENT_TYPE_LATEST.encode(), await self._exposition()
            return 200, CONTENT_TYPE_LATEST.encode(), generate_latest(self._metrics.registry)
        if path == b"/healthz":
            return 200, b"text/plain", b"ok\n"
        if path == b"/readyz":
            problems = await self._readiness()
            if problems:
                return 503, b"text/plain", ("not ready\n" + "".join(f"- {p}\n" for p in problems)).encode()
            return 200, b"text/plain", b"ready\n"
        return 404, b"text/plain", b"not found: try /metrics, /healthz, /readyz\n"

    @staticmethod
    async def _send(
        stream: trio.SocketStream, conn: h11.Connection, status: int, content_type: bytes, body: bytes
    ) -> None:
        headers = [
            (b"content-type", content_type),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        if status == 405:
            headers.append((b"allow", b"GET"))
        data = conn.send(h11.Response(status_code=status, headers=headers))
        data += conn.send(h11.Data(data=body))
        data += conn.send(h11.EndOfMessage())
        await stream.send_all(data)
