"""The floor: the cheapest framed Kafka forwarder we can write on trio, the reference
the proxy's request path is measured against (issue 15, the ``floor`` path of
``bench/proxy_vs_direct.py``).

It forwards whole Kafka frames (4-byte big-endian length prefix) between a
client and one broker, in both directions: every complete frame at hand goes
out in one ``send``, a frame split over reads waits for its end. Nothing is
decoded and nothing is rewritten, so the broker must advertise this
forwarder's address.

``--variant`` picks how a direction is pumped; ``best`` is the floor, the
others are kept to measure what each trio pattern costs per round trip
(``bench/floor_variants.py``, findings in ``bench/RESULTS.md``):

  stream    trio.SocketStream: ``receive_some`` and ``send_all`` (what the proxy
            does today): two checkpoints per call, one wake-up per frame
  socket    trio.socket ``recv_into`` / ``send``: the same checkpoints, without
            the stream layer
  lowlevel  plain non-blocking socket calls, ``trio.lowlevel.wait_readable`` /
            ``wait_writable`` only when a call would block; no checkpoint when
            data is at hand, but a ``recv`` that fails with EAGAIN before each wait
  best      ``lowlevel``, and a read that did not fill the buffer means the socket
            is drained: wait at once, without the EAGAIN ``recv``; 256 KiB reads

    python bench/floor_forwarder.py --listen 127.0.0.1:9093 --upstream 127.0.0.1:9092
"""

from __future__ import annotations

import argparse
import errno
import gc
import socket
from collections.abc import Awaitable, Callable

import trio

READ_SIZE = 256 * 1024
STREAM_READ_SIZE = 65536


class FrameBuffer:
    """Bytes read from one socket; hands out every complete Kafka frame at hand as one block.

    Reads go into one preallocated buffer (``read_view``). When a read holds only
    whole frames, the block handed out is a view of that buffer: no copy. Only a
    frame split over reads is gathered in ``partial``.
    """

    def __init__(self, read_size: int = READ_SIZE) -> None:
        self.read_view = memoryview(bytearray(read_size))
        self.partial = bytearray()
        self._needed = 0  # len(partial) at which its first incomplete frame is whole

    def complete(self, n: int) -> memoryview | bytearray:
        """The complete frames after ``n`` more bytes were read into ``read_view`` (maybe none).

        The block is valid until the next read: send it before reading again."""
        if not self.partial:
            end = _frames_end(self.read_view, n)
            if end < n:
                self.partial += self.read_view[end:n]
                self._needed = _frame_size_at(self.partial)
            return self.read_view[:end]
        self.partial += self.read_view[:n]
        if len(self.partial) < self._needed:
            return self.read_view[:0]
        end = _frames_end(self.partial, len(self.partial))
        if end == len(self.partial):
            block, self.partial = self.partial, bytearray()
            return block
        block = self.partial[:end]
        del self.partial[:end]
        self._needed = _frame_size_at(self.partial)
        return block


def _frames_end(data: memoryview | bytearray, n: int) -> int:
    """Offset just past the last complete frame in ``data[:n]``."""
    pos = 0
    while n - pos >= 4:
        end = pos + 4 + int.from_bytes(data[pos : pos + 4], "big")
        if end > n:
            break
        pos = end
    return pos


def _frame_size_at(data: bytearray) -> int:
    """Bytes needed for the frame ``data`` starts with to be whole (4 while its length is unknown)."""
    return 4 + int.from_bytes(data[:4], "big") if len(data) >= 4 else 4


# --- the best trio pump: no checkpoint while data is at hand ----------------------------------


async def send_block(sock: socket.socket, block: memoryview | bytearray) -> None:
    """All of ``block``, waiting for the socket to drain only when the kernel's buffer is full."""
    sent = 0
    while sent < len(block):
        try:
            sent += sock.send(block[sent:])
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)


async def pump_best(src: socket.socket, dst: socket.socket, eagain_read: bool = False) -> None:
    frames = FrameBuffer()
    view, size = frames.read_view, len(frames.read_view)
    recv_into = src.recv_into
    while True:
        try:
            n = recv_into(view)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(src)
            continue
        if n == 0:
            return
        block = frames.complete(n)
        if block:
            await send_block(dst, block)
        if n == size:
            await trio.lowlevel.checkpoint()  # a full buffer: more may be waiting; let others run
        elif not eagain_read:
            # A short read drained the socket: wait now rather than learn it from EAGAIN.
            await trio.lowlevel.wait_readable(src)


async def pump_lowlevel(src: socket.socket, dst: socket.socket) -> None:
    await pump_best(src, dst, eagain_read=True)


# --- the trio socket layers, for comparison ---------------------------------------------------


async def pump_socket(src: socket.socket, dst: socket.socket) -> None:
    tsrc, tdst = trio.socket.from_stdlib_socket(src), trio.socket.from_stdlib_socket(dst)
    frames = FrameBuffer()
    while n := await tsrc.recv_into(frames.read_view):
        block = frames.complete(n)
        sent = 0
        while sent < len(block):
            sent += await tdst.send(block[sent:])


async def pump_stream(src: socket.socket, dst: socket.socket) -> None:
    source = trio.SocketStream(trio.socket.from_stdlib_socket(src))
    sink = trio.SocketStream(trio.socket.from_stdlib_socket(dst))
    frames = FrameBuffer(STREAM_READ_SIZE)
    while data := await source.receive_some(STREAM_READ_SIZE):
        frames.read_view[: len(data)] = data
        block = frames.complete(len(data))
        if block:
            await sink.send_all(block)


Pump = Callable[[socket.socket, socket.socket], Awaitable[None]]
VARIANTS: dict[str, Pump] = {
    "best": pump_best,
    "lowlevel": pump_lowlevel,
    "socket": pump_socket,
    "stream": pump_stream,
}


# --- connections ------------------------------------------------------------------------------


def _nonblocking(sock: socket.socket) -> socket.socket:
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


async def connect(address: tuple[str, int]) -> socket.socket:
    sock = _nonblocking(socket.socket())
    try:
        if sock.connect_ex(address) not in (0, errno.EINPROGRESS):
            raise ConnectionRefusedError(f"cannot connect to {address}")
        await trio.lowlevel.wait_writable(sock)
        error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:
            raise ConnectionRefusedError(f"cannot connect to {address}: errno {error}")
    except BaseException:
        sock.close()
        raise
    return sock


async def forward(client: socket.socket, upstream: tuple[str, int], pump: Pump) -> None:
    """Both directions of one connection; when either ends, the connection ends."""
    with client:
        try:
            broker = await connect(upstream)
        except OSError:
            return
        with broker:
            async with trio.open_nursery() as nursery:

                async def one_way(src: socket.socket, dst: socket.socket) -> None:
                    try:
                        await pump(src, dst)
                    except OSError:
                        pass
                    nursery.cancel_scope.cancel()

                nursery.start_soon(one_way, client, broker)
                nursery.start_soon(one_way, broker, client)


async def serve(listen: tuple[str, int], upstream: tuple[str, int], pump: Pump) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(listen)
    listener.listen(1024)
    listener.setblocking(False)
    async with trio.open_nursery() as nursery:
        while True:
            await trio.lowlevel.wait_readable(listener)
            try:
                client, _ = listener.accept()
            except BlockingIOError:
                continue
            nursery.start_soon(forward, _nonblocking(client), upstream, pump)


def address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host, int(port)


def parse_args(argv: list[str] | None = None, variants: tuple[str, ...] = tuple(VARIANTS)) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=address, required=True, help="HOST:PORT to accept clients on")
    parser.add_argument("--upstream", type=address, required=True, help="the broker, HOST:PORT")
    parser.add_argument("--variant", choices=variants, default=variants[0])
    parser.add_argument(
        "--gc-freeze", action="store_true", help="gc.freeze() after start-up: the cyclic GC skips start-up objects"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.gc_freeze:
        gc.freeze()
    # SIGTERM (how the benchmarks stop it) ends the process at once: nothing to clean up
    trio.run(serve, args.listen, args.upstream, VARIANTS[args.variant])


if __name__ == "__main__":
    main()
