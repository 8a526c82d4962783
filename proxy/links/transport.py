"""How a pump moves bytes: a socket driven directly, plaintext or TLS.

A plaintext socket is used the way the cheapest trio forwarder uses it
(bench/floor_forwarder.py): non-blocking calls that complete at once cost no
trip through trio's scheduler, and trio is asked to wait only when the kernel
has nothing to give or no room to take. After a short read the socket is
drained, so the next receive waits for it at once instead of first learning it
from an EAGAIN. trio's SocketStream, by contrast, schedules twice per call.

TLS is driven the same way: the stdlib's SSLSocket on the same non-blocking
socket, where OpenSSL reads and writes the kernel directly. trio's SSLStream
goes through memory BIOs and a scheduling point per record; here one receive
takes every record already read (a client writes a request in several records).
"""

from __future__ import annotations

import math
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from proxy.protocol.wire import Received


class Transport(Protocol):
    async def receive(self, max_bytes: int) -> Received:
        """Some bytes, at most ``max_bytes``; empty at end of stream."""
        ...

    async def send(self, data: Received | memoryview) -> None:
        """All of ``data``."""
        ...

    async def aclose(self) -> None: ...

    # A send that waits longer than this for the peer to take a byte raises SendStalled.
    stall_timeout: float


class SendStalled(trio.BrokenResourceError):
    """The peer took no byte for ``stall_timeout`` seconds while a send waited."""


async def _wait_writable(sock: socket.socket, stall_timeout: float) -> None:
    """Wait for room to send; only a send that would block pays for the deadline."""
    if stall_timeout == math.inf:
        await trio.lowlevel.wait_writable(sock)
        return
    with trio.move_on_after(stall_timeout) as waited:
        await trio.lowlevel.wait_writable(sock)
    if waited.cancelled_caught:
        raise SendStalled(f"the peer took nothing for {stall_timeout:g}s")


def peer_address(stream: trio.SocketStream) -> tuple[str, str]:
    """("host:port", "host") of the client, or "unknown" twice when it is already gone."""
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "unknown", "unknown"
    return f"{host}:{port}", str(host)


def stdlib_socket(stream: trio.SocketStream) -> socket.socket:
    """The plain socket behind a trio SocketStream, now owned by the caller."""
    trio_socket = stream.socket
    family, kind, proto = trio_socket.family, trio_socket.type, trio_socket.proto
    sock = socket.socket(family, kind, proto, fileno=trio_socket.detach())
    sock.setblocking(False)
    return sock


class SocketTransport:
    __slots__ = ("_drained", "sock", "stall_timeout")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._drained = False
        self.stall_timeout = math.inf

    async def receive(self, max_bytes: int) -> bytes:
        sock = self.sock
        if self._drained:
            await trio.lowlevel.wait_readable(sock)
        while True:
            try:
                data = sock.recv(max_bytes)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(sock)
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(f"receive failed: {exc!r}") from exc
            if len(data) == max_bytes:
                self._drained = False
                await trio.lowlevel.checkpoint()  # more may be waiting: let the others run first
            else:
                self._drained = True
            return data

    async def send(self, data: Received | memoryview) -> None:
        sock = self.sock
        view = memoryview(data)
        sent = 0
        while sent < len(view):
            try:
                sent += sock.send(view[sent:])
            except BlockingIOError:
                await _wait_writable(sock, self.stall_timeout)
            except OSError as exc:
                raise trio.BrokenResourceError(f"send failed: {exc!r}") from exc

    async def aclose(self) -> None:
        trio.lowlevel.notify_closing(self.sock)
        self.sock.close()


LINGER_S = 1.0  # how long a failed handshake waits for the peer to read the alert


class TlsTransport:
    """A TLS connection on a non-blocking stdlib socket. The two pumps share it: one
    receives while the other sends, which OpenSSL allows in one thread."""

    __slots__ = ("_drained", "sock", "stall_timeout")

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self.sock = sock
        self._drained = False
        self.stall_timeout = math.inf

    @classmethod
    async def handshake(
        cls,
        sock: socket.socket,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
        turns: trio.CapacityLimiter | None = None,
    ) -> TlsTransport:
        """Wrap ``sock`` (now owned by the result) and complete the handshake; raises
        ssl.SSLError or OSError as OpenSSL reports them, and closes the socket then.

        With ``turns``, each step (OpenSSL's key exchange and signature: the CPU of a
        handshake, on the event loop) takes one of its slots and gives it back only after
        a checkpoint, once every other runnable task has had its turn: at most that many
        steps run between two turns of an established connection, however many clients
        handshake. Waiting for the peer holds no slot."""
        tls = context.wrap_socket(
            sock, server_side=server_side, server_hostname=server_hostname, do_handshake_on_connect=False
        )
        try:
            while True:
                try:
                    if turns is None:
                        tls.do_handshake()
                    else:
                        async with turns:
                            try:
                                tls.do_handshake()
                            finally:
                                await trio.lowlevel.checkpoint()
                    return cls(tls)
                except ssl.SSLWantReadError:
                    await trio.lowlevel.wait_readable(tls)
                except ssl.SSLWantWriteError:
                    await trio.lowlevel.wait_writable(tls)
        except BaseException as exc:
            if server_side and isinstance(exc, ssl.SSLError):
                await _lingering_close(tls)  # the alert OpenSSL just wrote must reach the client
            else:  # cancelled, reset, or a broker's failure (the proxy names it itself): no wait
                _close(tls)
            raise

    async def receive(self, max_bytes: int) -> bytes:
        tls = self.sock
        if self._drained:
            await trio.lowlevel.wait_readable(tls)
        while True:
            try:
                data = tls.recv(max_bytes)  # b"" on close_notify or EOF
                break
            except ssl.SSLWantReadError:
                await trio.lowlevel.wait_readable(tls)
            except ssl.SSLWantWriteError:  # OpenSSL has a reply of its own to send first
                await _wait_shared(trio.lowlevel.wait_writable, tls)
            except OSError as exc:  # ssl.SSLError included
                raise trio.BrokenResourceError(f"receive failed: {exc!r}") from exc
        # One call gives one record, and a record holds what one write of the peer held:
        # librdkafka writes a request in several, so a produce comes in records of a few
        # KiB. Take every record already here; the first that is not says the socket is
        # drained (the next receive waits for it at once).
        chunks = None
        size = len(data)
        self._drained = False
        while 0 < size < max_bytes:
            try:
                more = tls.recv(max_bytes - size)
            except ssl.SSLWantReadError:
                self._drained = True
                break
            except OSError:  # a reply to send first, or an error: the next call meets it
                break
            if not more:
                break  # EOF: the next call returns b""
            if chunks is None:
                chunks = [data]
            chunks.append(more)
            size += len(more)
        if not self._drained:
            await trio.lowlevel.checkpoint()  # more may be waiting: let the others run first
        return b"".join(chunks) if chunks is not None else data

    async def send(self, data: Received | memoryview) -> None:
        tls = self.sock
        view = memoryview(data)
        sent = 0
        while sent < len(view):
            try:
                sent += tls.send(view[sent:])  # retried with the same bytes after a wait, as OpenSSL asks
            except ssl.SSLWantWriteError:
                await _wait_writable(tls, self.stall_timeout)
            except ssl.SSLWantReadError:
                await _wait_shared(trio.lowlevel.wait_readable, tls)
            except OSError as exc:
                raise trio.BrokenResourceError(f"send failed: {exc!r}") from exc

    async def aclose(self) -> None:
        _close(self.sock)


def _close(tls: ssl.SSLSocket) -> None:
    trio.lowlevel.notify_closing(tls)  # wakes whichever pump waits on it
    tls.close()


async def _wait_shared(wait: Callable[[ssl.SSLSocket], Awaitable[None]], tls: ssl.SSLSocket) -> None:
    """Wait on the direction the other pump normally waits on (rare: TLS 1.3 key updates).
    trio lets one task wait per direction; if the other pump already does, it will move
    things along, so just look again shortly."""
    try:
        await wait(tls)
    except trio.BusyResourceError:
        await trio.sleep(0.005)


async def _lingering_close(tls: ssl.SSLSocket) -> None:
    """Close after a failed handshake so the peer reads OpenSSL's alert (e.g. "certificate
    required") instead of a reset: closing with its bytes unread would send an RST, which
    discards the alert at the peer. Half-close, discard what it still sends, then close."""
    raw = socket.socket.recv  # beneath TLS: these bytes are only discarded
    with trio.move_on_after(LINGER_S, shield=True):
        try:
            socket.socket.shutdown(tls, socket.SHUT_WR)
            while True:
                await trio.lowlevel.wait_readable(tls)
                if not raw(tls, 65536):
                    break
        except OSError:
            pass
    _close(tls)
