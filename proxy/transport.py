"""The two ways a pump moves bytes: a plaintext socket driven directly, or a trio
stream (TLS).

A plaintext socket is used the way the cheapest trio forwarder uses it
(bench/floor_forwarder.py): non-blocking calls that complete at once cost no
trip through trio's scheduler, and trio is asked to wait only when the kernel
has nothing to give or no room to take. After a short read the socket is
drained, so the next receive waits for it at once instead of first learning it
from an EAGAIN. trio's SocketStream, by contrast, schedules twice per call. TLS
needs trio's SSLStream and keeps it.
"""

from __future__ import annotations

import socket
from typing import Protocol

import trio

from .wire import Received


class Transport(Protocol):
    async def receive(self, max_bytes: int) -> Received:
        """Some bytes, at most ``max_bytes``; empty at end of stream."""
        ...

    async def send(self, data: Received | memoryview) -> None:
        """All of ``data``."""
        ...

    async def aclose(self) -> None: ...


def stdlib_socket(stream: trio.SocketStream) -> socket.socket:
    """The plain socket behind a trio SocketStream, now owned by the caller."""
    trio_socket = stream.socket
    family, kind, proto = trio_socket.family, trio_socket.type, trio_socket.proto
    sock = socket.socket(family, kind, proto, fileno=trio_socket.detach())
    sock.setblocking(False)
    return sock


class SocketTransport:
    __slots__ = ("_drained", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._drained = False

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
                await trio.lowlevel.wait_writable(sock)
            except OSError as exc:
                raise trio.BrokenResourceError(f"send failed: {exc!r}") from exc

    async def aclose(self) -> None:
        trio.lowlevel.notify_closing(self.sock)
        self.sock.close()


class StreamTransport:
    __slots__ = ("stream",)

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream

    async def receive(self, max_bytes: int) -> Received:
        return await self.stream.receive_some(max_bytes)

    async def send(self, data: Received | memoryview) -> None:
        await self.stream.send_all(data)

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)
