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

    def try_receive(self, max_bytes: int) -> Received | None:
        """What is here now, at most ``max_bytes``, without waiting: None when nothing is
        (empty at end of stream). Raises NeedsTask when only a wait can move it on."""
        ...

    def try_send(self, data: Received | memoryview) -> int:
        """How much of ``data`` the socket took now, without waiting (0 also when TLS asks
        for a wait of either kind: the caller's ``send`` retries the same bytes and waits)."""
        ...

    def fileno(self) -> int: ...

    def buffered(self) -> bool:
        """Bytes already read from the socket wait inside (TLS records OpenSSL holds): the
        socket will not say it is readable for them."""
        ...

    async def aclose(self) -> None: ...

    async def aclose_lingering(self) -> None:
        """Close so that the peer reads an EOF after what it was sent (``lingering_close``)."""
        ...

    # A send that waits longer than this returns (in seconds) for the peer to take a byte
    # raises SendStalled; asked again while it waits, so that a reload reaches it.
    stall_limit: Callable[[], float]


class SendStalled(trio.BrokenResourceError):
    """The peer took no byte for ``seconds`` while a send waited."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the peer took nothing for {seconds:g}s")
        self.seconds = seconds


class NeedsTask(Exception):
    """A call that would not wait cannot go on without a wait of another kind (TLS asks to
    write while reading, or to read while writing): the caller's task must do it."""


STALL_RECHECK_S = 1.0  # how often a waiting send asks its stall limit again


def _no_stall_limit() -> float:
    return math.inf


async def _wait_writable(sock: socket.socket, stall_limit: Callable[[], float]) -> None:
    """Wait for room to send; only a send that would block pays for the deadline."""
    started = trio.current_time()
    while True:
        deadline = started + stall_limit()
        with trio.move_on_at(min(deadline, trio.current_time() + STALL_RECHECK_S)):
            await trio.lowlevel.wait_writable(sock)
            return
        if trio.current_time() >= deadline:
            raise SendStalled(deadline - started)


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
    __slots__ = ("_drained", "sock", "stall_limit")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._drained = False
        self.stall_limit = _no_stall_limit

    async def receive(self, max_bytes: int) -> bytes:
        sock = self.sock
        if self._drained:
            await trio.lowlevel.wait_readable(sock)
        while (data := self.try_receive(max_bytes)) is None:
            await trio.lowlevel.wait_readable(sock)
        if len(data) == max_bytes:
            self._drained = False
            await trio.lowlevel.checkpoint()  # more may be waiting: let the others run first
        else:
            self._drained = True
        return data

    def try_receive(self, max_bytes: int) -> bytes | None:
        try:
            return self.sock.recv(max_bytes)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise trio.BrokenResourceError(f"receive failed: {exc!r}") from exc

    def try_send(self, data: Received | memoryview) -> int:
        try:
            return self.sock.send(data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise trio.BrokenResourceError(f"send failed: {exc!r}") from exc

    def fileno(self) -> int:
        return self.sock.fileno()

    def buffered(self) -> bool:
        return False

    async def send(self, data: Received | memoryview) -> None:
        view = memoryview(data)
        sent = 0
        while sent < len(view):
            taken = self.try_send(view[sent:])
            if taken:
                sent += taken
            else:  # the kernel has no room (a TCP send of some bytes never takes none otherwise)
                await _wait_writable(self.sock, self.stall_limit)

    async def aclose(self) -> None:
        trio.lowlevel.notify_closing(self.sock)
        self.sock.close()

    async def aclose_lingering(self) -> None:
        await lingering_close(self.sock)


LINGER_S = 1.0  # how long a closing connection waits for the peer to read its last bytes
LINGER_MAX_BYTES = 16 << 20  # and how much of what the peer still sends it reads to discard


class TlsTransport:
    """A TLS connection on a non-blocking stdlib socket. The two pumps share it: one
    receives while the other sends, which OpenSSL allows in one thread."""

    __slots__ = ("_drained", "sock", "stall_limit")

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self.sock = sock
        self._drained = False
        self.stall_limit = _no_stall_limit

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
                await lingering_close(tls)  # the alert OpenSSL just wrote must reach the client
            else:  # cancelled, reset, or a broker's failure (the proxy names it itself): no wait
                _close(tls)
            raise

    async def receive(self, max_bytes: int) -> bytes:
        tls = self.sock
        if self._drained:
            await trio.lowlevel.wait_readable(tls)
        while True:
            try:
                data = self.try_receive(max_bytes)
            except NeedsTask:  # OpenSSL has a reply of its own to send first
                await _wait_shared(trio.lowlevel.wait_writable, tls)
                continue
            if data is not None:
                break
            await trio.lowlevel.wait_readable(tls)
        if not self._drained:
            await trio.lowlevel.checkpoint()  # more may be waiting: let the others run first
        return data

    def _more_records(self, data: bytes, max_bytes: int) -> bytes:
        """One call gives one record, and a record holds what one write of the peer held:
        librdkafka writes a request in several, so a produce comes in records of a few
        KiB. Take every record already here; the first that is not says the socket is
        drained (the next receive waits for it at once)."""
        tls = self.sock
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
        return b"".join(chunks) if chunks is not None else data

    def try_receive(self, max_bytes: int) -> bytes | None:
        try:
            data = self.sock.recv(max_bytes)  # b"" on close_notify or EOF
        except ssl.SSLWantReadError:
            return None
        except ssl.SSLWantWriteError:  # OpenSSL has a reply of its own to send first
            raise NeedsTask from None
        except OSError as exc:  # ssl.SSLError included
            raise trio.BrokenResourceError(f"receive failed: {exc!r}") from exc
        return self._more_records(data, max_bytes)

    def try_send(self, data: Received | memoryview) -> int:
        try:
            return self.sock.send(data)
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
            return 0  # the task's send retries with the same bytes and waits as OpenSSL asks
        except OSError as exc:
            raise trio.BrokenResourceError(f"send failed: {exc!r}") from exc

    def fileno(self) -> int:
        return self.sock.fileno()

    def buffered(self) -> bool:
        return self.sock.pending() > 0

    async def send(self, data: Received | memoryview) -> None:
        tls = self.sock
        view = memoryview(data)
        sent = 0
        while sent < len(view):
            try:
                sent += tls.send(view[sent:])  # retried with the same bytes after a wait, as OpenSSL asks
            except ssl.SSLWantWriteError:
                await _wait_writable(tls, self.stall_limit)
            except ssl.SSLWantReadError:
                await _wait_shared(trio.lowlevel.wait_readable, tls)
            except OSError as exc:
                raise trio.BrokenResourceError(f"send failed: {exc!r}") from exc

    async def aclose(self) -> None:
        _close(self.sock)

    async def aclose_lingering(self) -> None:
        await lingering_close(self.sock)


def _close(sock: socket.socket) -> None:
    trio.lowlevel.notify_closing(sock)  # wakes whichever pump waits on it
    sock.close()


async def _wait_shared(wait: Callable[[ssl.SSLSocket], Awaitable[None]], tls: ssl.SSLSocket) -> None:
    """Wait on the direction the other pump normally waits on (rare: TLS 1.3 key updates).
    trio lets one task wait per direction; if the other pump already does, it will move
    things along, so just look again shortly."""
    try:
        await wait(tls)
    except trio.BusyResourceError:
        await trio.sleep(0.005)


async def lingering_close(sock: socket.socket, max_bytes: int = LINGER_MAX_BYTES) -> None:
    """Close so that the peer reads what was written last and then an EOF, not a reset:
    closing with its bytes unread would send an RST, which discards them at the peer (an
    alert after a failed handshake, the end of a connection whose frame was refused).
    Half-close, discard what it still sends (bounded in time and bytes), then close."""
    raw = socket.socket.recv  # beneath TLS: these bytes are only discarded
    discarded = 0
    with trio.move_on_after(LINGER_S, shield=True):
        try:
            socket.socket.shutdown(sock, socket.SHUT_WR)
            while discarded < max_bytes:
                await trio.lowlevel.wait_readable(sock)
                try:
                    data = raw(sock, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    break
                discarded += len(data)
        except OSError:
            pass
    _close(sock)
