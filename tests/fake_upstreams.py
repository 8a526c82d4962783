"""Test upstreams for what no real broker here can be made to do.

They are fakes, and say so: a Java broker's answer to a plaintext client on
its TLS port (Tansu's TLS does not work in this build, and OpenSSL servers
close silently), and relays in front of a real Tansu: one answers one client
with a 200 MB length prefix, one turns into that TLS answer when told. Everything
else they pass to the real broker.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

from proxy.protocol import wire

# What Apache Kafka's TLS listener writes to a plaintext client: a TLS alert.
JAVA_BROKER_TLS_ALERT = bytes.fromhex("15030300020250")


class _Server:
    def __init__(self, handle: Callable[[socket.socket], None]) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._handle = handle
        self._stopped = False
        self.connections = 0
        self.requests: list[bytes] = []  # what a handler chose to keep of what it read
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._handle(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def stop(self) -> None:
        self._stopped = True
        self._sock.close()


def tls_alert_broker() -> _Server:
    """Answers whatever it reads with the Java broker's TLS alert, then closes: the
    bytes Apache Kafka's TLS listener writes to a plaintext client (TOOLS.md), replayed."""

    server = _Server(lambda conn: _answer_tls_alert(server, conn))
    return server


def _answer_tls_alert(server: _Server, conn: socket.socket) -> None:
    """Keep what ``conn`` sent first, and answer it with the TLS alert."""
    if data := conn.recv(65536):
        server.requests.append(data)
        conn.sendall(JAVA_BROKER_TLS_ALERT)


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise OSError("closed")
        data += chunk
    return data


def _relay_frames(conn: socket.socket, broker: str, intercept: Callable[[bytes], bool] = lambda frame: False) -> None:
    """Pass ``conn``'s requests to the real ``broker`` and its answers back, frame by frame, until
    ``intercept`` (given each request) says it answered one itself; then hold the connection."""
    host, port = broker.rsplit(":", 1)
    upstream = socket.create_connection((host, int(port)))

    def back() -> None:
        try:
            while data := upstream.recv(65536):
                conn.sendall(data)
        except OSError:
            pass
        finally:
            conn.close()

    threading.Thread(target=back, daemon=True).start()
    try:
        while True:
            size = int.from_bytes(_read_exactly(conn, 4), "big")
            frame = size.to_bytes(4, "big") + _read_exactly(conn, size)
            if intercept(frame):
                conn.recv(1)  # hold the connection until the proxy drops it
                return
            upstream.sendall(frame)
    finally:
        upstream.close()


class OversizeRelay(_Server):
    """Relays to ``broker`` (set once the broker runs), except that a request from
    ``victim_client_id`` is answered with a length prefix of ``announced`` bytes."""

    def __init__(self, victim_client_id: str, announced: int) -> None:
        self.broker = ""
        self.victim_client_id = victim_client_id
        self.announced = announced
        super().__init__(lambda conn: _relay_frames(conn, self.broker, lambda frame: self._answer(conn, frame)))

    def _answer(self, conn: socket.socket, frame: bytes) -> bool:
        if wire.peek_client_id(frame, 0) != self.victim_client_id:
            return False
        conn.sendall(self.announced.to_bytes(4, "big") + b"\0" * 4096)
        return True


class TurnsTls(_Server):
    """Relays to the real ``broker`` until ``speaks_tls`` is set; from then on each new connection
    is answered as by ``tls_alert_broker``: a broker whose port was turned to TLS under a running
    proxy (which found it healthy at start, so its readiness probes are done)."""

    def __init__(self, broker: str) -> None:
        self.broker = broker
        self.speaks_tls = False
        super().__init__(self._serve_one)

    def _serve_one(self, conn: socket.socket) -> None:
        if self.speaks_tls:
            _answer_tls_alert(self, conn)
        else:
            _relay_frames(conn, self.broker)
