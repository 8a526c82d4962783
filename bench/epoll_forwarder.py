"""The Python limit: ``bench/floor_forwarder.py``'s framed forwarding in a bare
``select.epoll`` loop, no async framework (the ``epoll`` path of
``bench/proxy_vs_direct.py``, issue 15).

Same frames, same buffer (``FrameBuffer``), same one ``send`` per batch of
complete frames; only the event loop differs: sockets stay registered
(level-triggered) instead of being re-armed per wait, and an event costs one
``recv_into`` and one ``send``, with no task switch. A send the kernel cannot
take whole is kept and finished on EPOLLOUT; meanwhile the other side is not
read (backpressure). The broker connection is made with a blocking
``connect`` (loopback; only established connections are measured).

    python bench/epoll_forwarder.py --listen 127.0.0.1:9093 --upstream 127.0.0.1:9092
"""

from __future__ import annotations

import gc
import select
import socket

from floor_forwarder import FrameBuffer, parse_args


class Side:
    """One socket of a forwarded connection: what it reads goes to ``peer``."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.frames = FrameBuffer()
        self.peer: Side = self
        self.backlog = b""  # bytes for this socket that the kernel did not take yet

    def flags(self) -> int:
        reading = 0 if self.peer.backlog else select.EPOLLIN  # backpressure
        return reading | (select.EPOLLOUT if self.backlog else 0)


class Forwarder:
    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.epoll = select.epoll()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(listen)
        self.listener.listen(1024)
        self.listener.setblocking(False)
        self.listener_fd = self.listener.fileno()
        self.epoll.register(self.listener_fd, select.EPOLLIN)
        self.sides: dict[int, Side] = {}

    def accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except BlockingIOError:
                return
            try:
                broker = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            a, b = Side(client), Side(broker)
            a.peer, b.peer = b, a
            for side in (a, b):
                side.sock.setblocking(False)
                side.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.sides[side.fd] = side
                self.epoll.register(side.fd, select.EPOLLIN)

    def close(self, side: Side) -> None:
        for s in (side, side.peer):
            if self.sides.pop(s.fd, None) is not None:
                self.epoll.unregister(s.fd)
                s.sock.close()

    def on_writable(self, side: Side) -> None:
        sent = side.sock.send(side.backlog)
        side.backlog = side.backlog[sent:]
        if not side.backlog:
            self.epoll.modify(side.fd, side.flags())
            self.epoll.modify(side.peer.fd, side.peer.flags())

    def on_readable(self, side: Side) -> bool:
        """Forward what ``side`` has; False when it closed."""
        n = side.sock.recv_into(side.frames.read_view)
        if n == 0:
            return False
        block = side.frames.complete(n)
        if block:
            dst = side.peer
            try:
                sent = dst.sock.send(block)
            except BlockingIOError:
                sent = 0
            if sent < len(block):
                dst.backlog = bytes(block[sent:])
                self.epoll.modify(dst.fd, dst.flags())
                self.epoll.modify(side.fd, side.flags())
        return True

    def serve(self, ready: list[tuple[int, int]]) -> None:
        """Every event of one ``epoll.poll``: accept, forward, finish sends, close."""
        listener_fd, sides = self.listener_fd, self.sides
        for fd, events in ready:
            if fd == listener_fd:
                self.accept()
                continue
            side = sides.get(fd)
            if side is None:  # closed by an earlier event of this batch
                continue
            try:
                if events & select.EPOLLOUT:
                    self.on_writable(side)
                if events & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                    if not self.on_readable(side):
                        self.close(side)
            except BlockingIOError:
                pass
            except OSError:
                self.close(side)

    def run(self) -> None:
        poll, serve = self.epoll.poll, self.serve
        while True:
            serve(poll())


def main() -> None:
    args = parse_args(variants=("epoll",))
    if args.gc_freeze:
        gc.freeze()
    Forwarder(args.listen, args.upstream).run()  # until SIGTERM ends the process


if __name__ == "__main__":
    main()
