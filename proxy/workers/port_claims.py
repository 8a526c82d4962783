"""The ports a supervisor claims for its workers, held from before the first worker binds them
until the supervisor exits.

Every worker binds its ports with SO_REUSEPORT, and the kernel lets such a bind join any socket of
the same user that set it too (another proxy's workers), then splits the clients with it without an
error. So the supervisor binds each port plainly first, which fails as one process's bind fails when
another process has the port. It then keeps that socket, bound and never listening (the kernel hands
connections to listening sockets only), with SO_REUSEADDR turned off and SO_REUSEPORT on: this
proxy's workers join it, and another process's bind fails, with SO_REUSEADDR or without. Closing
the check's socket instead left two windows in which another process could take the port: between
the check and the first worker's bind, and while every worker serving the port was being restarted.
"""

from __future__ import annotations

import socket
from types import TracebackType

from proxy.errors import BindError


class PortClaims:
    """The claimed ports' sockets, closed on leaving the ``with`` block, once no worker serves them."""

    def __init__(self) -> None:
        self._held: list[socket.socket] = []

    def __enter__(self) -> PortClaims:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def claim(self, what: str, host: str, port: int) -> None:
        """Hold ``host:port`` (each of its addresses) for this proxy's workers; raise ``BindError``
        (``what`` names the listener) if another process has it. Port 0 claims nothing."""
        if port == 0:
            return
        claimed: list[socket.socket] = []
        try:
            for family, kind, proto, _, address in socket.getaddrinfo(
                host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            ):
                sock = socket.socket(family, kind, proto)
                claimed.append(sock)
                # For the bind only: a closed connection in TIME_WAIT is no user (trio's listeners set it too).
                # Left on, it would let another process's SO_REUSEADDR bind join a socket that is not listening.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                try:
                    sock.bind(address)
                except OSError as exc:
                    raise BindError(what, host, port, exc) from None
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        except BaseException:
            for sock in claimed:
                sock.close()
            raise
        self._held += claimed

    def close(self) -> None:
        for sock in self._held:
            sock.close()
        self._held.clear()
