"""One request as the policies' API hooks see it: the header fields peeked in
place, the client id and the body read only when a hook asks for them, and each
at most once (a body decoded for the identifier check is the one the group size
policy reads, and the one its response is matched with)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from proxy.evidence.decisions import Where
from proxy.links.upstream import UpstreamLink
from proxy.protocol import wire
from proxy.protocol.wire import Received

_UNREAD: Any = object()


class Request:
    __slots__ = (
        "_body",
        "_client_id",
        "_frame",
        "_produce_head",
        "api_key",
        "api_version",
        "buf",
        "connect_coordinator",
        "correlation_id",
        "end",
        "now",
        "start",
        "ticket",
        "where",
    )

    def __init__(
        self,
        buf: Received,
        start: int,
        end: int,
        api_key: int,
        api_version: int,
        correlation_id: int,
        where: Where,
        connect_coordinator: Callable[[], Awaitable[UpstreamLink]],
        now: float,
    ) -> None:
        self.buf, self.start, self.end = buf, start, end
        self.api_key, self.api_version, self.correlation_id = api_key, api_version, correlation_id
        self.where = where
        self.now = now  # trio time the request was read (the policies' clock is the caller's)
        # A second connection to this connection's broker (the group coordinator, for a
        # group request): for hooks that must ask the broker something first.
        self.connect_coordinator = connect_coordinator
        self.ticket: int | None = None  # the group size policy's join ticket, for the response
        self._client_id: str | None = _UNREAD
        self._body: Any = _UNREAD
        self._frame: bytes | None = None
        self._produce_head: tuple[str | None, int] | None = None

    @property
    def frame(self) -> bytes:
        """The whole frame as its own bytes (for decoding; the hot path never asks)."""
        if self._frame is None:
            self._frame = bytes(self.buf[self.start : self.end])
        return self._frame

    @property
    def client_id(self) -> str | None:
        if self._client_id is _UNREAD:
            self._client_id = wire.peek_client_id(self.buf, self.start)
        return self._client_id

    @property
    def body(self) -> Any:
        """The body as a kio entity, decoded on first use."""
        if self._body is _UNREAD:
            self._body = wire.decode_request(self.frame, self.api_key, self.api_version)
        return self._body

    def header(self) -> wire.RequestHeader:
        return wire.RequestHeader(self.api_key, self.api_version, self.correlation_id, self.client_id)

    def produce_head(self) -> tuple[str | None, int]:
        """(transactional id, acks) of a Produce request, read in place (once)."""
        if self._produce_head is None:
            self._produce_head = wire.produce_head(self.buf, self.start, self.api_version)
        return self._produce_head
