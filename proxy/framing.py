"""The one Kafka frame reader: length prefix first, checked before the body is
read or any room is made for it (Kafka's ``NetworkReceive`` with
``socket.request.max.bytes``)."""

from __future__ import annotations

import trio

from policies.frame_check import FrameVerdict, check_length_prefix

_CHUNK = 65536
# recv(n) allocates n bytes up front: never ask for more than this at once.
_MAX_RECEIVE = 1 << 20


class TruncatedFrame(Exception):
    """The stream ended inside a frame."""


class FrameReader:
    def __init__(self, stream: trio.abc.ReceiveStream, *, plaintext: bool) -> None:
        self._stream = stream
        self._plaintext = plaintext
        self._buffer = bytearray()
        self.eof = False

    @property
    def idle(self) -> bool:
        """No byte of a next frame has arrived yet."""
        return not self._buffer

    async def fill(self, want: int) -> bool:
        """Receive until ``want`` bytes are buffered; False at end of stream."""
        while len(self._buffer) < want:
            chunk = await self._stream.receive_some(min(max(_CHUNK, want - len(self._buffer)), _MAX_RECEIVE))
            if not chunk:
                self.eof = True
                return False
            self._buffer += chunk
        return True

    async def next_prefix(self, max_bytes: int) -> FrameVerdict | None:
        """The verdict on the next frame's length prefix; None at a clean end of stream."""
        if not await self.fill(4):
            if self._buffer:
                raise TruncatedFrame(f"stream closed mid-frame ({len(self._buffer)} bytes of a length prefix)")
            return None
        return check_length_prefix(bytes(self._buffer[:4]), max_bytes, plaintext=self._plaintext)

    @property
    def head(self) -> bytes:
        """The first bytes buffered (to name what a rejected frame looked like)."""
        return bytes(self._buffer[:16])

    async def read_frame(self, size: int) -> bytes:
        """The whole frame (prefix included) whose admitted length is ``size``."""
        if not await self.fill(4 + size):
            raise TruncatedFrame(f"stream closed mid-frame ({len(self._buffer) - 4} of {size} bytes)")
        end = 4 + size
        if len(self._buffer) == end:  # the common case: nothing of the next frame yet
            frame = bytes(self._buffer)
            self._buffer.clear()
            return frame
        with memoryview(self._buffer) as view:  # one copy, not slice-then-copy
            frame = bytes(view[:end])
        del self._buffer[:end]
        return frame
