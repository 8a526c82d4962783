"""A message link between the supervisor (the owner of the shared limits) and one
worker process, over a Unix stream socket: the same class at both ends.

A message is a length-prefixed pickle of ``(kind, ask_id, args)``. ``ask`` waits for
the peer's answer; ``tell`` is one way and never blocks (it is called from the
synchronous parts of the proxy, such as a connection's close). Both ends run the
handlers registered for a kind: tells and synchronous handlers in the order the
messages came, so a close told before an open is applied before it; an
asynchronous handler of an ask runs in its own task, so a slow answer holds up no
other message. Pickle is safe here: both ends are processes of this proxy, on a
socket pair made by the supervisor.
"""

from __future__ import annotations

import copyreg
import inspect
import io
import os
import pickle
import socket
import struct
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from proxy.serve.driver import IODriver

_HEADER = struct.Struct("!I")
_REPLY = "reply"
_FAILED = "failed"
_MAX_MESSAGE = 64 * 1024 * 1024

Handler = Callable[..., Any]
Message = tuple[str, int, tuple[Any, ...]]  # kind, ask id (0: a tell), args
_ENDED = object()  # the driver's serve found the peer gone


def _mappingproxy(items: dict[Any, Any]) -> MappingProxyType[Any, Any]:
    return MappingProxyType(items)


def _reduce_mappingproxy(mapping: MappingProxyType[Any, Any]) -> tuple[Any, ...]:
    return (_mappingproxy, (dict(mapping),))


# pickle refuses a mappingproxy, and every Decision holds one (its default element errors and
# subject): the link's own table sends it as a dict and rebuilds it (no global copyreg change).
_DISPATCH: Mapping[type, Callable[[Any], Any]] = MappingProxyType(
    {**copyreg.dispatch_table, MappingProxyType: _reduce_mappingproxy}
)


class LinkClosed(Exception):
    """The peer process is gone (its end of the socket closed)."""


class RemoteError(Exception):
    """The peer's handler of an ask raised: its type and message."""


class Link:
    def __init__(self, stream: trio.abc.Stream, handlers: Mapping[str, Handler] | None = None) -> None:
        self._stream = stream
        self.handlers: dict[str, Handler] = dict(handlers or {})
        self._out = bytearray()
        self._out_ready = trio.Event()
        self._asks: dict[int, trio.MemorySendChannel[tuple[bool, Any]]] = {}
        self._next_ask = 1
        self.closed = trio.Event()
        self._sending = False  # the writer task is in send_all: a frame queued now must wait its turn
        self._sent = trio.Event()  # set when the writer has sent all that was queued, or the link closed
        self._fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else None
        self._pickled = io.BytesIO()  # one pickler per link, reused: a third of a new one's cost
        self._pickler = pickle.Pickler(self._pickled, protocol=pickle.HIGHEST_PROTOCOL)
        self._pickler.dispatch_table = _DISPATCH

    @classmethod
    def pair(cls) -> tuple[Link, Link]:
        """Two linked ends in one process (tests)."""
        a, b = trio.socket.socketpair()
        return cls(trio.SocketStream(a)), cls(trio.SocketStream(b))

    # -- sending -----------------------------------------------------------

    def tell(self, kind: str, *args: Any) -> None:
        """One way: queued, sent by ``run``'s writer; dropped once the link is closed."""
        self._queue(kind, 0, args)

    async def ask(self, kind: str, *args: Any) -> Any:
        """The peer's answer (what its handler returned); RemoteError if it raised, LinkClosed
        if the link ends first."""
        if self.closed.is_set():
            raise LinkClosed(f"link closed before {kind}")
        ask_id = self._next_ask
        self._next_ask += 1
        send, receive = trio.open_memory_channel[tuple[bool, Any]](1)
        self._asks[ask_id] = send
        try:
            self._queue(kind, ask_id, args)
            try:
                ok, value = await receive.receive()
            except trio.EndOfChannel:
                raise LinkClosed(f"link closed before the answer to {kind}") from None
        finally:
            self._asks.pop(ask_id, None)
        if not ok:
            raise RemoteError(value)
        return value

    async def sent(self) -> None:
        """Return once every message queued so far is written to the socket, or the link is
        closed: a worker's last tells before it exits (``run``'s writer sends them)."""
        while (self._out or self._sending) and not self.closed.is_set():
            self._sent = trio.Event()
            await self._sent.wait()

    def _queue(self, kind: str, ask_id: int, args: tuple[Any, ...]) -> None:
        if self.closed.is_set():
            return
        body = self._dumps((kind, ask_id, args))
        frame = _HEADER.pack(len(body)) + body
        if not self._out and not self._sending and self._fd is not None:
            # Straight to the socket when nothing is queued: no wake-up of the writer task (a
            # scheduler pass on each side of an ask); what the socket does not take now, it sends.
            try:
                sent = os.write(self._fd, frame)
            except OSError:  # full (BlockingIOError) or broken: the writer sends, or finds it broken
                sent = 0
            if sent == len(frame):
                return
            frame = frame[sent:]
        self._out += frame
        self._out_ready.set()

    def _dumps(self, message: tuple[str, int, tuple[Any, ...]]) -> bytes:
        out, pickler = self._pickled, self._pickler
        out.seek(0)
        out.truncate()
        pickler.clear_memo()
        pickler.dump(message)
        return out.getvalue()

    # -- running -----------------------------------------------------------

    @staticmethod
    def first_message(sock: socket.socket) -> tuple[str, tuple[Any, ...]]:
        """Read one message from a blocking socket before the link runs (a worker's start:
        the generation it is to serve), nothing after it."""

        def exactly(n: int) -> bytes:
            data = b""
            while len(data) < n:
                chunk = sock.recv(n - len(data))
                if not chunk:
                    raise LinkClosed("link closed before its first message")
                data += chunk
            return data

        (size,) = _HEADER.unpack(exactly(_HEADER.size))
        kind, _, args = pickle.loads(exactly(size))
        return kind, args

    async def run(self, driver: IODriver | None = None) -> None:
        """Read and dispatch until the peer closes; then every pending ask raises LinkClosed.
        With ``driver`` (a worker's: proxy/serve/driver.py) the socket is read within the
        driver's pass, so an answer wakes only the task that asked, not a reader task first."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write, nursery.cancel_scope)
                if driver is not None and self._fd is not None:
                    await self._read_in_driver(nursery, driver, self._fd)
                else:
                    await self._read(nursery)
                nursery.cancel_scope.cancel()
        finally:
            self.closed.set()
            self._sent.set()
            for send in self._asks.values():
                send.close()
            self._asks.clear()
            await trio.aclose_forcefully(self._stream)

    async def _write(self, scope: trio.CancelScope) -> None:
        try:
            while True:
                await self._out_ready.wait()
                self._out_ready = trio.Event()
                while self._out:
                    data, self._out = bytes(self._out), bytearray()
                    self._sending = True
                    try:
                        await self._stream.send_all(data)
                    finally:
                        self._sending = False
                self._sent.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            scope.cancel()

    async def _read(self, nursery: trio.Nursery) -> None:
        buffer = bytearray()
        while True:
            for kind, ask_id, args in _messages(buffer):
                self._dispatch(nursery, kind, ask_id, args)
            try:
                data = await self._stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            buffer += data

    async def _read_in_driver(self, nursery: trio.Nursery, driver: IODriver, fd: int) -> None:
        """Answers to this side's asks are handed to their askers within the driver's pass.
        Anything else that came (a tell, an ask of a handler here) wakes this task, which
        dispatches all that came in order, as ``_read`` does: handlers run in a task, and
        never after an answer that came behind them."""
        buffer = bytearray()

        def serve(now: float, started: float) -> object:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return None
            except OSError:
                return _ENDED
            if not data:
                return _ENDED
            buffer.extend(data)
            messages = _messages(buffer)
            if any(kind not in (_REPLY, _FAILED) for kind, _, _ in messages):
                return messages
            for kind, ask_id, args in messages:
                self._dispatch(nursery, kind, ask_id, args)
            return None

        while True:
            handed = await driver.park(fd, serve)
            if handed is _ENDED:
                return
            assert isinstance(handed, list)
            for kind, ask_id, args in handed:
                self._dispatch(nursery, kind, ask_id, args)

    def _dispatch(self, nursery: trio.Nursery, kind: str, ask_id: int, args: tuple[Any, ...]) -> None:
        if kind in (_REPLY, _FAILED):
            send = self._asks.pop(args[0], None)
            if send is not None:
                send.send_nowait((kind == _REPLY, args[1]))
            return
        handler = self.handlers.get(kind)
        if handler is None:
            if ask_id:
                self._queue(_FAILED, 0, (ask_id, f"no handler for {kind!r}"))
            return
        try:
            result = handler(*args)
        except Exception as exc:
            if not ask_id:
                raise
            self._queue(_FAILED, 0, (ask_id, f"{type(exc).__name__}: {exc}"))
            return
        if inspect.isawaitable(result):
            nursery.start_soon(self._answer_later, ask_id, result)
        elif ask_id:
            self._queue(_REPLY, 0, (ask_id, result))

    async def _answer_later(self, ask_id: int, result: Awaitable[Any]) -> None:
        try:
            value = await result
        except Exception as exc:
            if not ask_id:
                raise
            self._queue(_FAILED, 0, (ask_id, f"{type(exc).__name__}: {exc}"))
            return
        if ask_id:
            self._queue(_REPLY, 0, (ask_id, value))


def _messages(buffer: bytearray) -> list[Message]:
    """The whole messages at the start of ``buffer``, taken out of it."""
    messages = []
    while len(buffer) >= _HEADER.size:
        (size,) = _HEADER.unpack_from(buffer)
        if size > _MAX_MESSAGE:
            raise ValueError(f"link message of {size} bytes (at most {_MAX_MESSAGE})")
        if len(buffer) < _HEADER.size + size:
            break
        messages.append(pickle.loads(buffer[_HEADER.size : _HEADER.size + size]))
        del buffer[: _HEADER.size + size]
    return messages


@dataclass(frozen=True, slots=True)
class WorkerLink:
    """What makes a ProxyServer one worker of several: its index (0..workers-1), the link to
    the supervisor (the owner of the shared limits), and the generation it starts with."""

    index: int
    workers: int
    link: Link
    generation: int = 1
