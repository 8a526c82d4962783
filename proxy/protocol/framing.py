"""The one Kafka frame splitter, sans-I/O: bytes in, whole frames out.

Each 4-byte length prefix is checked before its body is buffered (Kafka's
``NetworkReceive`` with ``socket.request.max.bytes``); only the first prefix of a
stream is also sniffed for a TLS record or an HTTP request (KIP-498), since a
later prefix is a length whatever its bytes look like.

Frames come out as ``(start, end)`` offsets into :attr:`FrameSplitter.buffer`, so
the caller can send a run of frames as one slice of what it received: in the
common case a receive holds whole frames and nothing is copied at all. A frame
that spans receives is copied, as it arrives, into one buffer of its size, made
once its prefix is known: it costs its size in memory, not twice that (the pool
reserves its size, KIP-72), as a list of receives joined at the end would.
"""

from __future__ import annotations

import struct

from policies.frame_check import FrameVerdict, check_length_prefix
from proxy.protocol.wire import Received

_PREFIX = struct.Struct(">i")
# recv(n) allocates n bytes up front: never ask for more than this at once.
MAX_RECEIVE = 1 << 20
RECEIVE_SIZE = 65536


class FrameRefused(Exception):
    """A length prefix no Kafka frame may have; ``head`` is what the stream began with."""

    def __init__(self, verdict: FrameVerdict, head: bytes) -> None:
        super().__init__(f"{verdict.kind.value} length prefix {verdict.size}")
        self.verdict = verdict
        self.head = head


class FrameSplitter:
    __slots__ = ("_gather", "_held", "_need", "_pos", "_sniff", "buffer", "frame_size")

    def __init__(self, *, sniff: bool) -> None:
        # What ``next_frame`` offsets point into; valid until the next ``feed`` (an attribute, not a
        # property: it is read per receive).
        self.buffer: Received = b""
        self._pos = 0
        self._gather: bytearray | None = None  # a frame that spans receives, as it arrives
        self._held = 0  # bytes in _gather
        self._need = 4  # bytes the frame being gathered needs in all (prefix included)
        self._sniff = sniff
        # Body size of the frame whose prefix has been read and checked and whose body
        # has not all arrived (0: none). The caller reserves memory for it before reading
        # on (KIP-72) and bounds the wait for the rest (request.body.timeout.ms).
        self.frame_size = 0

    @property
    def idle(self) -> bool:
        """No byte of a next frame has arrived."""
        return self._gather is None and self._pos == len(self.buffer)

    @property
    def wanted(self) -> int:
        """Bytes still missing for the frame being gathered (a hint for the read size): 0 when no byte
        of one is held, at least 1 while ``frame_size`` says its body is still to come."""
        held = self._held if self._gather is not None else len(self.buffer) - self._pos
        return max(0, self._need - held) if held else 0

    def truncated(self) -> str:
        """What is held of an incomplete frame, for the line that says the stream ended in it."""
        held = self._held if self._gather is not None else len(self.buffer) - self._pos
        if self.frame_size:
            return f"stream closed mid-frame ({held - 4} of {self.frame_size} bytes)"
        return f"stream closed mid-frame ({held} bytes of a length prefix)"

    def head(self) -> bytes:
        """The first bytes buffered (to name what a refused frame looked like)."""
        if self._gather is not None:
            return bytes(self._gather[:16])
        return bytes(self.buffer[self._pos : self._pos + 16])

    def feed(self, data: Received) -> None:
        if self._gather is None:
            if self._pos == len(self.buffer):
                self.buffer, self._pos = data, 0  # the common case: no copy
                return
            # The frame's size once its prefix is known (4 until then), and room for what the
            # receive that completes a large frame reads past it (at most RECEIVE_SIZE).
            need = self._need
            self._gather, self._held = bytearray(need + RECEIVE_SIZE if need > RECEIVE_SIZE else need), 0
            self._append(memoryview(self.buffer)[self._pos :])
            self.buffer, self._pos = b"", 0
        self._append(data)
        if self._held >= self._need:
            whole = self._gather
            del whole[self._held :]  # the room left over (shrinks in place)
            self.buffer, self._gather, self._held = memoryview(whole).toreadonly(), None, 0

    def _append(self, data: Received) -> None:
        gather, held = self._gather, self._held
        assert gather is not None
        end = held + len(data)
        if end <= len(gather):
            with memoryview(gather) as view:  # a bytearray's own slice assignment copies ``data`` first
                view[held:end] = data
        else:  # more than the frame and its room arrived at once: it grows (in place where it can)
            del gather[held:]
            gather += data
        self._held = end

    @property
    def prefix_ready(self) -> bool:
        """The next frame's length prefix has arrived."""
        return self._gather is None and len(self.buffer) - self._pos >= 4

    def check_prefix(self, max_bytes: int) -> None:
        """Check the next prefix now (sniffing it if it is the stream's first) without
        taking its frame: before a connection commits to anything, say what it is."""
        if self.prefix_ready and not self.frame_size:
            self._checked_size(self.buffer, self._pos, max_bytes)

    def admit(self, size: int) -> None:
        """Take the refused frame anyway (observe mode): ``next_frame`` returns it next."""
        self.frame_size = size

    def next_frame(self, max_bytes: int) -> tuple[int, int] | None:
        """``(start, end)`` of the next whole frame (prefix included) in :attr:`buffer`,
        or None until more bytes are fed; once a frame ends at ``len(buffer)`` the next call
        answers None, so a caller need not make it. Raises :class:`FrameRefused` on a prefix over
        ``max_bytes``, not positive, or (first frame only) a TLS record or HTTP."""
        if self._gather is not None:
            return None
        buf, pos = self.buffer, self._pos
        if len(buf) - pos < 4:
            self._need = 4
            return None
        size = self.frame_size  # a prefix already checked, whose body was still to come
        if not size:
            (size,) = _PREFIX.unpack_from(buf, pos)
            if self._sniff or not 0 < size <= max_bytes:
                size = self._checked_size(buf, pos, max_bytes)
        end = pos + 4 + size
        if end > len(buf):
            self._need = 4 + size
            self.frame_size = size  # checked once: the body is still to come
            return None
        self._pos = end
        self.frame_size = 0
        if end == len(buf):
            # The receive is used up: the state a further call would leave, so that a caller can
            # skip that call (it would only answer None) when ``end == len(buffer)``.
            self._need = 4
        return pos, end

    def _checked_size(self, buf: Received, pos: int, max_bytes: int) -> int:
        (size,) = _PREFIX.unpack_from(buf, pos)
        if self._sniff or not 0 < size <= max_bytes:
            verdict = check_length_prefix(bytes(buf[pos : pos + 4]), max_bytes, plaintext=self._sniff)
            self._sniff = False
            if not verdict.admitted:
                raise FrameRefused(verdict, self.head())
        return int(size)
