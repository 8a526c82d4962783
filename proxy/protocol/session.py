"""One client connection's request/response bookkeeping, sans-I/O.

Kafka answers the requests of one connection in the order they were sent, and
the proxy keeps that order whoever answers: the broker, or the proxy itself with
an error response (the broker never sees that request). A request Produce with
``acks=0`` gets no answer at all. Drain (graceful shutdown) stops taking requests
and ends the session once every request taken has been answered.

The connection feeds it facts (a request forwarded, a request answered by the
proxy, a response from the broker) and asks what to write next; it holds no
sockets and no clock. The states::

    OPEN --stop()--> DRAINING --(nothing pending)--> DONE
      \\--------------(nothing pending)--------------^   (client left)
"""

from __future__ import annotations

import collections
import enum
from dataclasses import dataclass
from typing import Any

# How many acks=0 Produce correlation ids are remembered: some brokers (Tansu) answer
# them anyway, and such an answer must be dropped, not taken for the next response.
_UNANSWERED_KEPT = 64


class State(enum.Enum):
    OPEN = "open"
    DRAINING = "draining"
    DONE = "done"


class UnexpectedResponse(Exception):
    """The broker answered a correlation id the session was not waiting for."""


@dataclass(slots=True)
class Pending:
    """A request taken from the client and not yet answered to it."""

    correlation_id: int
    api_key: int
    api_version: int
    size: int  # the request's bytes (released from the memory pool once answered)
    ticket: int | None = None  # its memory pool ticket
    # The two fields the core fills for every request come next, so that it passes them by position:
    # a keyword argument costs a dataclass __init__ of this many fields almost as much again.
    client_id: str | None = None  # for the observation windows (read only when they are kept)
    api_name: str = ""  # wire.api_name(api_key), from its plan (the observation windows key by it)
    answer: bytes | None = None  # the proxy's own answer (the broker never saw the request)
    close_after: bool = False  # close the connection once ``answer`` is written
    close_cause: str = ""
    close_reason: str = ""
    on_response: Any = None  # what the response must be shown to (a hook and its request), or None
    request_seconds: float = 0.0  # time the request spent inside the proxy (read to sent)
    response_size: int = 0


class Session:
    __slots__ = ("_unanswered", "pending", "state", "taking_requests")

    def __init__(self) -> None:
        # Attributes, not properties (read per receive); only _become writes them.
        self.state = State.OPEN
        self.taking_requests = True
        self.pending: collections.deque[Pending] = collections.deque()
        self._unanswered: collections.deque[int] = collections.deque(maxlen=_UNANSWERED_KEPT)

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def _become(self, state: State) -> None:
        self.state = state
        self.taking_requests = state is State.OPEN

    def forwarded(self, request: Pending) -> None:
        """The request went to the broker; its response will come in order."""
        self.pending.append(request)

    def forwarded_without_answer(self, correlation_id: int) -> None:
        """An acks=0 Produce went to the broker: the client expects nothing back."""
        self._unanswered.append(correlation_id)

    def answered_by_proxy(self, request: Pending) -> bool:
        """The proxy answers ``request`` itself (``request.answer``). True when nothing is
        ahead of it, so it can be written now; else it goes out after what is ahead."""
        self.pending.append(request)
        return len(self.pending) == 1

    def on_response(self, correlation_id: int) -> Pending | None:
        """Match a broker response to the request at the head of the line.

        Returns that request (still pending until :meth:`delivered`), or None for a
        response to an acks=0 Produce, which is dropped. Raises UnexpectedResponse
        for anything else: the broker and the session disagree about the order.
        """
        head = self.pending[0] if self.pending else None
        if head is not None and head.answer is None and head.correlation_id == correlation_id:
            return head
        if correlation_id in self._unanswered:
            self._unanswered.remove(correlation_id)
            return None
        expected = "none" if head is None or head.answer is not None else head.correlation_id
        raise UnexpectedResponse(f"broker answered correlation id {correlation_id}, expected {expected}")

    def delivered(self) -> Pending:
        """The head of the line was written to the client."""
        request = self.pending.popleft()
        # taking_requests first: per response, an enum attribute costs as much as a call on Python 3.11.
        if not self.taking_requests and not self.pending and self.state is State.DRAINING:
            self._become(State.DONE)
        return request

    def answers_ready(self) -> bool:
        """The head of the line is one of the proxy's own answers: write it now."""
        return bool(self.pending) and self.pending[0].answer is not None

    def stop(self) -> None:
        """Drain: take no more requests; done once everything taken is answered."""
        if self.state is State.OPEN:
            self._become(State.DRAINING if self.pending else State.DONE)

    def client_left(self) -> None:
        """The client closed its side: what it still awaited is not ours to deliver."""
        self._become(State.DONE)
