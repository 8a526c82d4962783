"""One client connection's protocol, sans-I/O (in the style of h11): bytes and events in,
actions out.

The shell feeds it what happened -- bytes from the client or the broker, the upstream
connected or unavailable, a deadline passed, pool memory granted, an async hook done,
bytes delivered to the client -- with the current config generation and the time, and
carries out the actions it returns, in order: :class:`Connect`, :class:`Forward` bytes to
the broker, :class:`Answer` the client with bytes, :class:`WaitForPool`, :class:`Prepare`
or :class:`Inspect` (an async hook: the shell awaits it and reports back),
:class:`SetDeadline`, :class:`StopReading` / :class:`ResumeReading`, :class:`Note` (a log
line) and :class:`Close` with its cause. It owns no socket, no task and no clock.

Per receive the work is O(1) per frame: the header is peeked in place, a body is decoded
only for the APIs a policy reads (the generation's plan), and the frames that go on are
handed out as slices of the very bytes received (one action per run of them). Requests
and responses keep their order whoever answers (``Session``): the broker, or the proxy
with its own answer.

Its collaborators are the shared policy state it books against, called synchronously:
the memory pool (KIP-72 tickets), the connection quotas' activity timestamps, the traffic
stats, the observation window and the decision recorder.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from policies.api_keys import PRODUCE, SASL_AUTHENTICATE
from policies.close_cause import CloseCause, Closing
from policies.decision import Action, Admission, Decision, Policy
from policies.frame_check import FrameKind, RequestLimit, decide_request_prefix, request_limit
from policies.memory_pool import decide_body_timeout
from policies.response_size import decide_response_prefix
from proxy.protocol import wire
from proxy.protocol.framing import MAX_RECEIVE, RECEIVE_SIZE, FrameRefused, FrameSplitter
from proxy.protocol.session import Pending, Session, State, UnexpectedResponse
from proxy.protocol.wire import Received

# Requests taken from one client and not yet answered to it before the proxy stops
# reading that client (reading resumes at half). Kafka's broker reads one request per
# connection at a time and Java clients keep 5 in flight; this bounds what a client
# that never reads its responses can make the proxy hold.
MAX_PENDING_REQUESTS = 1000
_HTTP_400_BODY = b"This is a Kafka port (kafka-admission-proxy), not HTTP.\n"
HTTP_400 = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_HTTP_400_BODY), _HTTP_400_BODY)
)
_Out = list[Received]


# -- actions ----------------------------------------------------------------------------


class Connect:
    """The first request prefix is a Kafka one: connect the upstream, then report
    ``upstream_ready`` (or ``upstream_unavailable``)."""

    __slots__ = ()


class Forward(NamedTuple):
    """Send ``data`` to the broker; ``sent`` are the requests in it that await a response."""

    data: Received | memoryview
    sent: list[Pending]


class Answer(NamedTuple):
    """Send ``data`` to the client; then report ``delivered(delivered, ...)``."""

    data: Received | memoryview
    delivered: list[Pending]


# The two actions of every round trip, made without NamedTuple's Python-level __new__.
_Fields = tuple[Received | memoryview, list[Pending]]
_new_forward: Callable[[_Fields], Forward] = functools.partial(tuple.__new__, Forward)
_new_answer: Callable[[_Fields], Answer] = functools.partial(tuple.__new__, Answer)


class WaitForPool:
    """Wait until the memory pool grants ``ticket`` (the client is not read meanwhile: TCP
    backpressure); then report ``pool_granted``."""

    __slots__ = ("ticket",)

    def __init__(self, ticket: int) -> None:
        self.ticket = ticket


class Prepare:
    """Await ``rules.prepare(request, hooks)`` (a hook that must ask the broker first); then
    report ``prepared``."""

    __slots__ = ("hooks", "request", "rules")

    def __init__(self, rules: Any, request: Any, hooks: tuple[Any, ...]) -> None:
        self.rules, self.request, self.hooks = rules, request, hooks


class Inspect:
    """Await ``rules.on_response(request, hooks, frame)`` (hooks that read, and may rewrite, a
    response); then report ``inspected`` with what it returned."""

    __slots__ = ("frame", "pending", "rules")

    def __init__(self, rules: Any, pending: Pending, frame: bytes) -> None:
        self.rules, self.pending, self.frame = rules, pending, frame


class SetDeadline:
    """Report ``deadline_passed`` once trio time reaches ``at`` (math.inf: no deadline)."""

    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        self.at = at


class StopReading:
    """Read nothing more from the client until :class:`ResumeReading`."""

    __slots__ = ()


class ResumeReading:
    __slots__ = ()


class Note:
    """A line for the log, rate-limited by ``key``."""

    __slots__ = ("key", "message")

    def __init__(self, key: object, message: str) -> None:
        self.key, self.message = key, message


class Close:
    """End the connection for ``closing``; ``last_words`` go to the client first (bounded in
    time); ``decision`` is the one behind it, when a policy decided it."""

    __slots__ = ("closing", "decision", "last_words")

    def __init__(self, closing: Closing, decision: Decision | None = None, last_words: bytes = b"") -> None:
        self.closing, self.decision, self.last_words = closing, decision, last_words


Actions = list[Any]  # of the classes above
_NOTHING: Actions = []  # returned as is, never added to
_STOP_READING = StopReading()
_RESUME_READING = ResumeReading()
_CONNECT = Connect()
_NEVER = math.inf
_DONE = State.DONE  # read per response batch: a name, not an enum attribute (slow on Python 3.11)
_NO_DEADLINE = SetDeadline(_NEVER)


# -- what it books against --------------------------------------------------------------


class Rules(Protocol):
    """What the core reads of a config generation (proxy.hooks.generation.Generation)."""

    socket_request_max_bytes: int
    sasl_server_max_receive_size: int
    request_body_timeout_s: float
    max_response_size: dict[str, int]
    response_size_mode: Any

    @property
    def plans(self) -> Mapping[tuple[int, int], Any]: ...  # by (API key, API version); every pair has one

    def check_request(self, request: Any, hooks: tuple[Any, ...]) -> Decision | None: ...
    def answer(self, request: Any, decision: Decision) -> bytes: ...


class Pool(Protocol):
    def reserve(self, conn_id: str, size: int, now: float, where: Any) -> Admission: ...
    def release(self, ticket: int | None, now: float) -> None: ...


class Quotas(Protocol):
    def on_request(self, conn_id: str, now: float) -> None: ...
    def on_response(self, conn_id: str, now: float) -> None: ...
    def touched(self, conn_id: str, now: float) -> None: ...


class Recorder(Protocol):
    def record(self, decision: Decision, where: Any = ..., **about: Any) -> None: ...


# (buf, start, end, api_key, api_version, correlation_id, where, coordinator, now) -> the request view hooks read
MakeRequest = Callable[..., Any]


_GRANTED, _PREPARED = 1, 2  # how far a suspended request got
_ANSWERED: Any = object()  # the proxy answered a request; its answer waits behind others


class _Held:
    """A request whose turn is suspended: waiting for pool memory or a prepare hook."""

    __slots__ = ("api_key", "api_version", "client_id", "correlation_id", "plan", "request", "stage", "ticket")

    def __init__(self, api_key: int, api_version: int, correlation_id: int, plan: Any, ticket: int | None) -> None:
        self.api_key, self.api_version, self.correlation_id = api_key, api_version, correlation_id
        self.plan, self.ticket = plan, ticket
        self.stage = _GRANTED
        self.request: Any = None
        self.client_id: str | None = None


class ConnectionCore:
    __slots__ = (
        "_authenticated",
        "_body_deadline",
        "_body_timeout_ms",
        "_coordinator",
        "_given",
        "_held",
        "_held_span",
        "_inspecting",
        "_make_request",
        "_partial_ticket",
        "_pool",
        "_quotas",
        "_recorder",
        "_requests",
        "_responses",
        "_rules",
        "_sasl",
        "_stopping",
        "_waiting_for",
        "bytes_in",
        "closing",
        "conn_id",
        "connected",
        "first_client_id",
        "listener",
        "reading",
        "request_receive_size",
        "requests",
        "response_receive_size",
        "session",
        "stats",
        "upstream_address",
        "where",
        "window",
    )

    def __init__(
        self,
        conn_id: str,
        listener: str,
        *,
        client_tls: bool,
        upstream_tls: bool,
        sasl: bool,
        pool: Pool,
        quotas: Quotas,
        stats: Any,
        window: Any,
        recorder: Recorder,
        where: Any,
        make_request: MakeRequest,
        coordinator: Any = None,
    ) -> None:
        self.conn_id, self.listener, self.where = conn_id, listener, where
        self._pool, self._quotas, self.stats, self.window, self._recorder = pool, quotas, stats, window, recorder
        self._make_request = make_request
        self._coordinator = coordinator  # handed to each request view (hooks that ask the broker first)
        self.session = Session()
        self._requests = FrameSplitter(sniff=not client_tls)
        self._responses = FrameSplitter(sniff=not upstream_tls)
        # Kafka's SASL listeners: until the broker accepts a SaslAuthenticate, frames are bounded by
        # sasl.server.max.receive.size.
        self._sasl = sasl
        self._authenticated = not sasl
        self.connected = False
        self.upstream_address = "unconnected"
        self.reading = True  # False from StopReading until ResumeReading
        self._stopping = False
        self._partial_ticket: int | None = None  # pool memory of the frame being read (KIP-72)
        self._body_deadline = math.inf  # request.body.timeout.ms, armed per partial frame
        self._body_timeout_ms = 0
        self._waiting_for = ""
        self._held: _Held | None = None  # the request a WaitForPool or Prepare suspended
        self._held_span = (0, 0)
        self._rules: Any = None  # the generation it was taken under
        self._inspecting: tuple[Any, _Out, list[Pending]] | None = None  # a response batch an Inspect suspended
        self._given: tuple[_Out, list[Pending]] = ([], [])  # what that batch had taken, once it goes on
        self.requests = 0
        self.bytes_in = 0
        self.first_client_id: str | None = None
        self.closing: Closing | None = None  # why it ended, once it has
        # How much to ask each socket for next: set after every batch (no call per receive).
        self.request_receive_size = RECEIVE_SIZE
        self.response_receive_size = RECEIVE_SIZE

    # -- hints for the shell --------------------------------------------------------------

    def _receive_sizes(self) -> None:
        """How much to ask each socket for next (read by the shell after every batch)."""
        splitter = self._requests
        if not splitter.frame_size:
            self.request_receive_size = RECEIVE_SIZE
        elif self.session.in_flight >= MAX_PENDING_REQUESTS:
            # At the cap: the rest of this frame only, so that the cap holds reading right after it
            # (a receive ending mid-frame otherwise read on past the cap, 64 KiB at a time).
            self.request_receive_size = min(splitter.wanted, MAX_RECEIVE)
        else:
            self.request_receive_size = max(RECEIVE_SIZE, min(splitter.wanted, MAX_RECEIVE))

    # -- events: the client and the upstream link -----------------------------------------

    def _client_edge(self, data: Received, rules: Rules) -> Actions:
        """The client closed its side (b""), or sent bytes before the upstream is connected."""
        self.bytes_in += len(data)
        splitter = self._requests
        if not data:
            if not splitter.idle:
                return [self._end(CloseCause.TRUNCATED_FRAME, splitter.truncated())]
            self.session.client_left()
            return [self._end(CloseCause.CLIENT_CLOSED)]
        splitter.feed(data)
        # Not connected yet. The first request decides what this is before any broker is involved: an
        # HTTP probe is answered even while the broker is down, and a client that never speaks costs
        # no upstream.
        if not splitter.prefix_ready:
            return []
        try:
            splitter.check_prefix(self._request_limit(rules).size)
        except FrameRefused as exc:
            return [self._refuse_prefix(exc, rules)]
        return [_CONNECT]

    def upstream_ready(self, address: str, rules: Rules, now: float) -> Actions:
        self.connected = True
        self.upstream_address = address
        return self._take(rules, now)

    def upstream_unavailable(self, reason: str, *, no_identity: bool = False) -> Actions:
        return [self._end(CloseCause.NO_CLIENT_IDENTITY if no_identity else CloseCause.UPSTREAM_UNAVAILABLE, reason)]

    def pool_granted(self, now: float) -> Actions:
        """The ticket of the last :class:`WaitForPool` was granted."""
        if self._held is None:  # the memory for a frame's body: read on
            self._waiting_for = "its body"
            return []
        return self._take(self._rules, now)

    def prepared(self, now: float) -> Actions:
        """The last :class:`Prepare` finished."""
        return self._take(self._rules, now)

    def deadline_passed(self, now: float) -> Actions:
        """Trio time reached the last :class:`SetDeadline`: ``request.body.timeout.ms``."""
        if now < self._body_deadline:
            return []
        decision = decide_body_timeout(self._requests.frame_size, self._body_timeout_ms, self._waiting_for)
        self._recorder.record(decision, self.where)
        return [self._end(CloseCause.REQUEST_BODY_TIMEOUT, decision.reason, decision)]

    def stop(self) -> Actions:
        """Graceful shutdown: finish the frame being read, answer what is in flight, close."""
        self._stopping = True
        if self._requests.idle and self._held is None:
            self.session.stop()
            if self.session.state is State.DONE:
                return [self._end(CloseCause.DRAINED)]
        return []

    def closed_by(self, closing: Closing) -> None:
        """The shell ended it (from outside, or on an I/O error); the first cause is the one kept."""
        if self.closing is None:
            self.closing = closing

    # -- client -> broker -----------------------------------------------------------------

    def _take(self, rules: Rules, now: float) -> Actions:
        """The suspended batch goes on (no new bytes)."""
        return self.client_bytes(None, rules, now)

    def client_bytes(self, data: Received | None, rules: Rules, now: float) -> Actions:
        """Bytes the client sent (b"": it closed its side). Every whole request that has arrived
        is taken: the runs that go on become one Forward; a request that must wait (pool memory,
        a prepare hook) suspends the batch. (None: no new bytes, a suspended batch goes on.)"""
        if data is not None:
            if not data or not self.connected:
                return self._client_edge(data, rules)
            self.bytes_in += len(data)
            self._requests.feed(data)
        session, splitter = self.session, self._requests
        buf = splitter.buffer
        buf_end, end = len(buf), -1  # a frame ending at buf_end used it up: no next_frame call to learn that
        actions: Actions = []
        out: _Out = []
        sent: list[Pending] = []
        run_start = run_end = -1  # the run of frames that go on as one slice of buf
        max_bytes = rules.socket_request_max_bytes if self._authenticated else self._request_limit(rules).size
        held, self._held = self._held, None
        try:
            while session.taking_requests and end != buf_end:
                if held is None:
                    try:
                        span = splitter.next_frame(max_bytes)
                    except FrameRefused as exc:
                        result: Any = self._refuse_prefix(exc, rules)
                    else:
                        if span is None:
                            break
                        start, end = span
                        result = self._take_request(rules, buf, start, end, now, sent, None)
                else:
                    start, end = self._held_span
                    result = self._take_request(rules, buf, start, end, now, sent, held)
                    held = None
                if result is None:  # it goes on to the broker
                    if run_end != start:
                        if run_start >= 0:
                            out.append(memoryview(buf)[run_start:run_end])
                        run_start = start
                    run_end = end
                    continue
                if result.__class__ is Close:  # what was taken in this batch never reaches the broker
                    actions.append(result)
                    return actions
                # Rare: what was taken before goes on first.
                if run_start >= 0:
                    out.append(memoryview(buf)[run_start:run_end])
                    run_start = run_end = -1
                if out:
                    actions.append(_new_forward((out[0] if len(out) == 1 else b"".join(out), sent)))
                    out, sent = [], []
                if result is _ANSWERED:
                    continue
                actions.append(result)
                if result.__class__ is not Answer:  # suspended
                    return actions
        except wire.MalformedFrame as exc:
            actions.append(self._end(CloseCause.MALFORMED_FRAME, str(exc)))
            return actions
        if run_start >= 0:  # a run that is the whole receive goes on as it came (no view made)
            out.append(buf if run_end - run_start == buf_end else memoryview(buf)[run_start:run_end])
        if out:
            actions.append(_new_forward((out[0] if len(out) == 1 else b"".join(out), sent)))
        if not splitter.frame_size and self._body_deadline != _NEVER:
            self._body_deadline = _NEVER  # the frame it was armed for is whole
            actions.append(_NO_DEADLINE)
        if self._stopping and splitter.idle:
            session.stop()
        if not session.taking_requests:
            if session.state is State.DONE:
                actions.append(self._end(CloseCause.DRAINED))
            elif self.reading:
                self.reading = False  # draining: the responses end the connection
                actions.append(_STOP_READING)
            return actions
        if splitter.frame_size:  # inside a frame whose body is still to come
            self._receive_sizes()
            if self._body_deadline == _NEVER:
                self._body_deadline = now + rules.request_body_timeout_s
                self._body_timeout_ms = round(rules.request_body_timeout_s * 1000)
                actions.append(SetDeadline(self._body_deadline))
            if self._partial_ticket is None:  # KIP-72: memory for the body before reading it
                admission = self._pool.reserve(self.conn_id, splitter.frame_size, now, self.where)
                self._partial_ticket = admission.ticket
                if admission.waits:
                    self._waiting_for = "pool memory"
                    actions.append(WaitForPool(admission.ticket))  # type: ignore[arg-type]
                    return actions
            self._waiting_for = "its body"
            return actions
        if self.request_receive_size != RECEIVE_SIZE:
            self.request_receive_size = RECEIVE_SIZE
        if len(session.pending) >= MAX_PENDING_REQUESTS and self.reading:  # session.in_flight, without the call
            self.reading = False  # delivered() resumes it once half are answered
            actions.append(_STOP_READING)
        return actions

    def _take_request(
        self, rules: Rules, buf: Received, start: int, end: int, now: float, sent: list[Pending], held: _Held | None
    ) -> Any:
        """One request frame: None when it goes on to the broker (its Pending, when a response is to
        come, added to ``sent``); else the action it needs (WaitForPool, Prepare, Answer, Close), or
        _ANSWERED when the proxy answered it behind others."""
        size = end - start
        if held is None:
            api_key, api_version, correlation_id = wire.peek_head(buf, start)
            self.requests += 1
            plan = rules.plans[(api_key, api_version)]
            stats = self.stats
            stats.requests[plan.counted_as] = stats.requests.get(plan.counted_as, 0) + 1
            stats.request_bytes += size
            if not plan.readable:
                return self._end(
                    CloseCause.UNREADABLE_VERSION,
                    f"{wire.api_name(api_key)} v{api_version} is not a version the proxy can read; "
                    "the client ignored the versions it was offered",
                )
            ticket = self._partial_ticket  # reserved before its body was read
            self._partial_ticket = None
            if ticket is None:
                admission = self._pool.reserve(self.conn_id, size - 4, now, self.where)
                ticket = admission.ticket
                if (
                    admission.decision is not None and admission.waits
                ):  # its socket is not read meanwhile (TCP backpressure)
                    self._suspend(_Held(api_key, api_version, correlation_id, plan, ticket), start, end, rules)
                    return WaitForPool(ticket)  # type: ignore[arg-type]
            stage = 0
            request = client_id = None
        else:
            api_key, api_version, correlation_id = held.api_key, held.api_version, held.correlation_id
            plan, ticket, stage, request, client_id = held.plan, held.ticket, held.stage, held.request, held.client_id
        if stage < _PREPARED:
            if plan.request_hooks or plan.response_hooks:
                request = self._make_request(
                    buf, start, end, api_key, api_version, correlation_id, self.where, self._coordinator, now
                )
            window = self.window
            if window is not None:  # the audit's observation windows: sizes per client id and API
                client_id = request.client_id if request is not None else wire.peek_client_id(buf, start)
                window.on_request(self.listener, client_id, plan.api_name, size)
                if self.first_client_id is None:
                    self.first_client_id = client_id  # names the client in the connection's close event
            if plan.prepare_hooks and request is not None:
                if held is None:
                    held = _Held(api_key, api_version, correlation_id, plan, ticket)
                held.stage, held.request, held.client_id = _PREPARED, request, client_id
                self._suspend(held, start, end, rules)
                return Prepare(rules, request, plan.prepare_hooks)
        if request is not None and plan.request_hooks:
            decision = rules.check_request(request, plan.request_hooks)
            if decision is not None:
                return self._answer(rules, request, decision, ticket, client_id, plan.api_name)
        if (
            api_key == PRODUCE
            and (request.produce_head() if request is not None else wire.produce_head(buf, start, api_version))[1] == 0
        ):
            # acks=0: no response will come; the bytes are in hand and go out in this batch.
            self.session.forwarded_without_answer(correlation_id)
            self._quotas.touched(self.conn_id, now)
            self._pool.release(ticket, now)
            return None
        pending = Pending(correlation_id, api_key, api_version, size, ticket, client_id, plan.api_name)
        if plan.response_hooks:
            pending.on_response = (request, plan.response_hooks)
        self.session.forwarded(pending)
        self._quotas.on_request(self.conn_id, now)
        sent.append(pending)
        return None

    def _suspend(self, held: _Held, start: int, end: int, rules: Rules) -> None:
        self._held, self._held_span, self._rules = held, (start, end), rules

    def _answer(
        self, rules: Rules, request: Any, decision: Decision, ticket: int | None, client_id: str | None, api_name: str
    ) -> Any:
        """An enforced decision on a request: the proxy's own answer, in order; or, when no answer
        can be given, the end of the connection."""
        if decision.action is Action.CLOSE:
            return self._end(CloseCause.of_policy(decision.policy), decision.reason, decision)
        pending = Pending(
            request.correlation_id,
            request.api_key,
            request.api_version,
            request.end - request.start,
            ticket,
            answer=rules.answer(request, decision),
            client_id=client_id,
            api_name=api_name,
            close_after=decision.close_after,
            close_cause=CloseCause.of_policy(decision.policy).value,
            close_reason=decision.reason,
        )
        self._quotas.on_request(self.conn_id, request.now)
        if not self.session.answered_by_proxy(pending):
            return _ANSWERED  # written once what is ahead of it is
        return self._answers_ready()

    def _answers_ready(self) -> Answer:
        """The proxy's own answers now at the head of the line."""
        session = self.session
        delivered: list[Pending] = []
        out: _Out = []
        while session.answers_ready():
            answered = session.delivered()
            delivered.append(answered)
            out.append(answered.answer)  # type: ignore[arg-type]
        return _new_answer((out[0] if len(out) == 1 else b"".join(out), delivered))

    def _refuse_prefix(self, refused: FrameRefused, rules: Rules) -> Close:
        """A request length prefix no Kafka request has: recorded, then the connection ends, as
        Kafka ends it (HTTP is told, in HTTP, that this is a Kafka port)."""
        verdict = refused.verdict
        limit = self._request_limit(rules)
        decision = decide_request_prefix(verdict, limit.size, limit.key)
        self._recorder.record(decision, self.where, size=verdict.size)
        if verdict.kind is FrameKind.HTTP:
            return self._end(CloseCause.CLIENT_HTTP_ON_KAFKA_PORT, decision.reason, decision, HTTP_400)
        if verdict.kind is FrameKind.TLS_RECORD:
            return self._end(CloseCause.CLIENT_TLS_ON_PLAINTEXT, decision.reason, decision)
        cause = CloseCause.REQUEST_TOO_LARGE if verdict.kind is FrameKind.TOO_LARGE else CloseCause.REQUEST_INVALID_SIZE
        return self._end(cause, f"{decision.reason} (first bytes {refused.head.hex()})", decision)

    def _request_limit(self, rules: Rules) -> RequestLimit:
        return request_limit(
            rules.socket_request_max_bytes, rules.sasl_server_max_receive_size, authenticated=self._authenticated
        )

    # -- broker -> client -----------------------------------------------------------------

    def inspected(self, changed: bytes | None) -> Actions:
        """The last :class:`Inspect` returned ``changed`` (None: the response as the broker sent it)."""
        assert self._inspecting is not None
        inspect, out, delivered = self._inspecting
        self._inspecting = None
        pending = inspect.pending
        if changed is not None:
            pending.response_size = len(changed)
        out.append(changed if changed is not None else inspect.frame)
        delivered.append(self.session.delivered())
        self._queued_answers(out, delivered)
        self._given = (out, delivered)
        return self.broker_bytes(None, inspect.rules, 0.0)

    def broker_bytes(self, data: Received | None, rules: Rules, now: float) -> Actions:
        """Bytes the broker sent (b"": it closed the connection). Every whole response that has
        arrived is matched to its request; what goes to the client becomes one Answer. A response
        a hook reads suspends the batch (Inspect). (None: no new bytes, a suspended batch goes on.)"""
        if data is not None:
            if not data:
                return [self._end(CloseCause.UPSTREAM_CLOSED, f"broker {self.upstream_address} closed the connection")]
            self._responses.feed(data)
            out: _Out = []
            delivered: list[Pending] = []
        else:
            out, delivered = self._given
        session, splitter = self.session, self._responses
        limit = rules.max_response_size[self.listener]
        buf = splitter.buffer
        buf_end, end = len(buf), -1  # a frame ending at buf_end used it up: no next_frame call to learn that
        run_start = run_end = -1
        actions: Actions = []
        try:
            while end != buf_end:
                try:
                    span = splitter.next_frame(limit)
                except FrameRefused as exc:
                    close = self._refuse_response(exc, rules, limit)
                    if close is not None:
                        actions.append(close)
                        return actions
                    splitter.admit(exc.verdict.size)  # observe mode: let it through
                    continue
                if span is None:
                    break
                start, end = span
                pending = session.on_response(wire.response_correlation_id(buf, start))
                if pending is not None:
                    pending.response_size = end - start
                    if pending.api_key == SASL_AUTHENTICATE:
                        note = self._sasl_authenticate_answered(buf, start, end, pending.api_version)
                        if note is not None:
                            actions.append(note)
                    if pending.on_response is None:
                        if run_end != start:
                            if run_start >= 0:
                                out.append(memoryview(buf)[run_start:run_end])
                            run_start = start
                        run_end = end
                        delivered.append(session.delivered())
                        if session.pending and session.pending[0].answer is not None:
                            out.append(memoryview(buf)[run_start:run_end])
                            run_start = run_end = -1
                            self._queued_answers(out, delivered)
                        continue
                if run_start >= 0:
                    out.append(memoryview(buf)[run_start:run_end])
                    run_start = run_end = -1
                if pending is None:
                    continue  # an answer to acks=0 Produce (Tansu sends them): the client expects none
                frame = bytes(buf[start:end])
                inspect = Inspect(rules, pending, frame)
                self._inspecting = (inspect, out, delivered)
                actions.append(inspect)
                return actions
        except (UnexpectedResponse, wire.MalformedFrame) as exc:
            cause = (
                CloseCause.UNEXPECTED_RESPONSE if isinstance(exc, UnexpectedResponse) else CloseCause.MALFORMED_FRAME
            )
            actions.append(self._end(cause, str(exc)))
            return actions
        if run_start >= 0:  # a run that is the whole receive goes on as it came (no view made)
            out.append(buf if run_end - run_start == buf_end else memoryview(buf)[run_start:run_end])
        if out:
            actions.append(_new_answer((out[0] if len(out) == 1 else b"".join(out), delivered)))
        # Nothing of a next frame held (the common case): the usual read size.
        self.response_receive_size = (
            RECEIVE_SIZE if end == buf_end else max(RECEIVE_SIZE, min(splitter.wanted, MAX_RECEIVE))
        )
        if session.state is _DONE:
            actions.append(self._end(CloseCause.DRAINED))
        return actions

    def _queued_answers(self, out: _Out, delivered: list[Pending]) -> None:
        """The proxy's own answers queued behind what was just delivered."""
        session = self.session
        while session.answers_ready():
            answered = session.delivered()
            delivered.append(answered)
            out.append(answered.answer)  # type: ignore[arg-type]

    def _refuse_response(self, refused: FrameRefused, rules: Rules, limit: int) -> Close | None:
        """A response length the proxy must not read: recorded; enforced, it ends the connection."""
        verdict = refused.verdict
        head = self.session.pending[0] if self.session.pending else None
        about = (
            f"response to {wire.api_name(head.api_key)} v{head.api_version} correlation id {head.correlation_id}"
            if head is not None
            else "unsolicited response"
        )
        decision = decide_response_prefix(verdict, limit, rules.response_size_mode, about)
        if decision.policy is Policy.PROTOCOL and verdict.kind is FrameKind.TLS_RECORD:
            self._recorder.record(decision, self.where, upstream=self.upstream_address)
            return self._end(CloseCause.UPSTREAM_TLS_ON_PLAINTEXT, decision.reason, decision)
        self._recorder.record(
            decision,
            self.where,
            upstream=self.upstream_address,
            api_key=head.api_key if head else None,
            api_version=head.api_version if head else None,
            correlation_id=head.correlation_id if head else None,
        )
        if not decision.enforced:
            return None
        cause = (
            CloseCause.RESPONSE_TOO_LARGE
            if decision.policy is Policy.RESPONSE_SIZE
            else CloseCause.RESPONSE_INVALID_SIZE
        )
        return self._end(cause, decision.reason, decision)

    def _sasl_authenticate_answered(self, buf: Received, start: int, end: int, api_version: int) -> Note | None:
        """SASL passes through: the broker's answer says whether the client is authenticated."""
        if self._sasl:
            if not self._authenticated:
                self._authenticated = _sasl_authenticated(buf, start, end, api_version)
            return None
        return Note(
            (self.listener, "sasl_unmarked"),
            f"listener {self.listener} carries SASL authentication but is not marked sasl: true: frames before "
            "authentication are bounded by socket.request.max.bytes, not sasl.server.max.receive.size",
        )

    # -- the client took what it was sent ---------------------------------------------------

    def delivered(self, delivered: list[Pending], now: float, response_seconds: float) -> Actions:
        """An :class:`Answer` is with the client: release the memory of what it answered, mark
        activity, time it; resume reading once half of the cap is answered."""
        stats, quotas, pool, window, conn_id = self.stats, self._quotas, self._pool, self.window, self.conn_id
        close_after: Pending | None = None
        for pending in delivered:
            stats.observe_latency(pending.request_seconds + response_seconds)
            if window is not None:
                size = pending.response_size or len(pending.answer or b"")
                window.on_response(self.listener, pending.client_id, pending.api_name, size)
            quotas.on_response(conn_id, now)
            pool.release(pending.ticket, now)
            if pending.close_after and close_after is None:
                close_after = pending
        if close_after is not None:
            cause = CloseCause(close_after.close_cause)
            return [self._end(cause, f"{close_after.close_reason}; closed after the answer")]
        if not self.reading and self.session.taking_requests and self.session.in_flight <= MAX_PENDING_REQUESTS // 2:
            self.reading = True
            return [_RESUME_READING]
        return _NOTHING

    def unanswered(self) -> list[Pending]:
        """Requests whose responses never came (sent or not), once it has ended: the hooks that read
        their responses let go of what they held for them (a group join's slot)."""
        return [pending for pending in self.session.pending if pending.on_response is not None]

    def _end(
        self, cause: CloseCause, reason: str = "", decision: Decision | None = None, last_words: bytes = b""
    ) -> Close:
        closing = Closing(cause, reason)
        if self.closing is None:
            self.closing = closing
        return Close(closing, decision, last_words)


def _sasl_authenticated(buf: Received, start: int, end: int, api_version: int) -> bool:
    """The broker accepted the client's SASL authentication (SaslAuthenticate error code 0)."""
    try:
        return bool(wire.decode_response(bytes(buf[start:end]), SASL_AUTHENTICATE, api_version).body.error_code == 0)
    except wire.MalformedFrame:
        return False  # unreadable: the client stays bounded as unauthenticated
