"""Checks a 4-byte Kafka length prefix before anything is allocated for the frame.

Mirrors Kafka's ``NetworkReceive``: a size above ``socket.request.max.bytes``
(or below zero) is refused before its body is read; before a client on a SASL
listener has authenticated, the bound is ``sasl.server.max.receive.size``, as
Kafka's ``SaslServerAuthenticator`` reads. It also names the bytes a Kafka port
should never see as a length: a TLS record (KIP-498: the alert ``15 03 03 00``
reads as 352,518,912) and the start of an HTTP request.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from policies.decision import Action, Decision, Policy
from policies.mode import Mode
from policies.properties import SASL_SERVER_MAX_RECEIVE_SIZE, SOCKET_REQUEST_MAX_BYTES


class FrameKind(enum.Enum):
    KAFKA = "kafka"
    TOO_LARGE = "too_large"
    INVALID_SIZE = "invalid_size"
    TLS_RECORD = "tls_record"
    HTTP = "http"


@dataclass(frozen=True, slots=True)
class FrameVerdict:
    kind: FrameKind
    size: int

    @property
    def admitted(self) -> bool:
        return self.kind is FrameKind.KAFKA


# TLS record content types (change_cipher_spec, alert, handshake, application_data)
# followed by major version 3: what a TLS peer sends first or answers with.
_TLS_CONTENT_TYPES = frozenset({0x14, 0x15, 0x16, 0x17})
_HTTP_METHODS = (b"GET ", b"POST", b"PUT ", b"HEAD", b"DELE", b"OPTI", b"PATC", b"CONN", b"PRI ")


def looks_like_tls(prefix: bytes) -> bool:
    """The bytes start a TLS record (any TLS 1.x version)."""
    return len(prefix) >= 3 and prefix[0] in _TLS_CONTENT_TYPES and prefix[1] == 3 and prefix[2] <= 4


def looks_like_http(prefix: bytes) -> bool:
    """The bytes start an HTTP/1 request (or HTTP/2's preface)."""
    return prefix[:4] in _HTTP_METHODS


def check_length_prefix(prefix: bytes, max_bytes: int, *, plaintext: bool = True) -> FrameVerdict:
    """Decide on a frame from its first four bytes alone.

    ``plaintext`` says whether the bytes came off a plaintext socket; inside TLS
    a TLS-looking prefix is just a large length.
    """
    if len(prefix) != 4:
        raise ValueError("a Kafka length prefix is exactly 4 bytes")
    size = int.from_bytes(prefix, "big", signed=True)
    if plaintext and looks_like_tls(prefix):
        return FrameVerdict(FrameKind.TLS_RECORD, size)
    if plaintext and looks_like_http(prefix):
        return FrameVerdict(FrameKind.HTTP, size)
    if size <= 0:
        return FrameVerdict(FrameKind.INVALID_SIZE, size)
    if size > max_bytes:
        return FrameVerdict(FrameKind.TOO_LARGE, size)
    return FrameVerdict(FrameKind.KAFKA, size)


@dataclass(frozen=True, slots=True)
class RequestLimit:
    """The largest request frame a connection may send now, and the Kafka property that sets it."""

    key: str
    size: int


def request_limit(
    socket_request_max_bytes: int, sasl_server_max_receive_size: int, *, authenticated: bool
) -> RequestLimit:
    """Kafka's ``SaslServerAuthenticator`` reads every frame before and during SASL
    authentication with ``sasl.server.max.receive.size`` as its bound, and the channel
    reads with ``socket.request.max.bytes`` once it is authenticated. Only a SASL
    listener has that phase: on PLAINTEXT and SSL Kafka authenticates at once (as
    ANONYMOUS, or by the TLS handshake's certificate). The smaller bound applies, so the
    memory pool, sized to ``socket.request.max.bytes``, always fits a frame."""
    if authenticated or socket_request_max_bytes <= sasl_server_max_receive_size:
        return RequestLimit(SOCKET_REQUEST_MAX_BYTES, socket_request_max_bytes)
    return RequestLimit(SASL_SERVER_MAX_RECEIVE_SIZE, sasl_server_max_receive_size)


def decide_request_prefix(verdict: FrameVerdict, limit: int, limit_key: str = SOCKET_REQUEST_MAX_BYTES) -> Decision:
    """The decision on a request prefix ``check_length_prefix`` did not admit under
    ``limit_key``: the connection is closed (a frame that is not read cannot be answered),
    in every mode, as Kafka closes it. A TLS record or an HTTP request is named as the
    protocol mistake it is."""
    if verdict.admitted:
        raise ValueError(f"a {verdict.size}-byte Kafka frame was admitted: there is nothing to decide")
    if verdict.kind is FrameKind.TLS_RECORD:
        reason = "client speaks TLS on a plaintext link; use TLS only on a TLS listener"
        return Decision(Policy.PROTOCOL, Action.CLOSE, Mode.ENFORCE, "client_tls_on_plaintext", reason, subject=_CLIENT)
    if verdict.kind is FrameKind.HTTP:
        reason = "HTTP request on a Kafka port"
        return Decision(Policy.PROTOCOL, Action.CLOSE, Mode.ENFORCE, "http_on_kafka_port", reason, subject=_CLIENT)
    when = " before SASL authentication" if limit_key == SASL_SERVER_MAX_RECEIVE_SIZE else ""
    return Decision(
        Policy.REQUEST_SIZE,
        Action.CLOSE,
        Mode.ENFORCE,
        limit_key,
        f"request length prefix {verdict.size} refused{when} ({verdict.kind.value}; {limit_key}={limit})",
        limit=limit,
        subject={"size": verdict.size},
    )


_CLIENT = {"direction": "client"}


def decide_client_hello(head: bytes) -> Decision | None:
    """The first bytes (up to 5) of a connection to a TLS listener: None when they can begin a TLS
    handshake; else a CLOSE naming the plaintext client, before the TLS library answers it with an
    alert the client would read as a 352 MB length."""
    if not head or looks_like_tls(head) or head[0] == 0x16:  # 0x16: a ClientHello begins
        return None
    what = "an HTTP request" if looks_like_http(head) else f"plaintext (first bytes {head.hex()})"
    reason = f"client sent {what} to a TLS listener; it needs TLS"
    return Decision(Policy.PROTOCOL, Action.CLOSE, Mode.ENFORCE, "client_plaintext_on_tls", reason, subject=_CLIENT)
