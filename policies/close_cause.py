"""Why a connection ended: one value per cause, for the metrics and the audit alike.

Each value is the label ``kafka_admission_connection_failures_total{cause}`` counts an
abnormal end under and the ``reason`` of the audit's connection close event. The causes
that follow a connection-quota decision (an LRU eviction, idle expiry, a lowered cap)
carry the Kafka property behind it: :meth:`Closing.label` gives ``"evicted:
max.connections"`` or ``"closed: connections.max.idle.ms"``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from policies.decision import Policy


class CloseCause(enum.Enum):
    # the connection ended normally (not counted as a failure)
    CLIENT_CLOSED = "client_closed"
    DRAINED = "drained"  # a graceful shutdown answered everything in flight
    BROKER_CLOSED = "broker_closed"  # passthrough: the broker ended the relay
    EVICTED = "evicted"  # LRU eviction to admit another connection (+ the cap)
    CLOSED_BY_LIMIT = "closed"  # a connection quota closed it: idle expiry, a lowered cap (+ the property)
    # the connection failed (counted by cause)
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    UPSTREAM_CLOSED = "upstream_closed"
    NO_CLIENT_IDENTITY = "no_client_identity"
    TLS_HANDSHAKE = "tls_handshake"
    CLIENT_PLAINTEXT_ON_TLS = "client_plaintext_on_tls"
    CLIENT_TLS_ON_PLAINTEXT = "client_tls_on_plaintext"
    CLIENT_HTTP_ON_KAFKA_PORT = "client_http_on_kafka_port"
    REQUEST_TOO_LARGE = "request_too_large"
    REQUEST_INVALID_SIZE = "request_invalid_size"
    TRUNCATED_FRAME = "truncated_frame"
    UNREADABLE_VERSION = "unreadable_version"
    REQUEST_BODY_TIMEOUT = "request_body_timeout"
    UPSTREAM_TLS_ON_PLAINTEXT = "upstream_tls_on_plaintext"
    RESPONSE_TOO_LARGE = "response_too_large"
    RESPONSE_INVALID_SIZE = "response_invalid_size"
    IDENTIFIER_LIMITS = "identifier_limits"  # a request closed by the policy of its name
    GROUP_SIZE = "group_size"
    BROKEN = "broken"  # a reset, a failed TLS record, a send the peer stopped taking
    MALFORMED_FRAME = "malformed_frame"
    UNEXPECTED_RESPONSE = "unexpected_response"
    INTERNAL_ERROR = "internal_error"

    @classmethod
    def of_policy(cls, policy: Policy) -> CloseCause:
        """The cause of a close a request hook's policy decided (``Action.CLOSE`` or ``close_after``)."""
        return _OF_POLICY.get(policy, cls.INTERNAL_ERROR)


_OF_POLICY = {Policy.IDENTIFIER_LIMITS: CloseCause.IDENTIFIER_LIMITS, Policy.GROUP_SIZE: CloseCause.GROUP_SIZE}
_NORMAL = frozenset(
    {
        CloseCause.CLIENT_CLOSED,
        CloseCause.DRAINED,
        CloseCause.BROKER_CLOSED,
        CloseCause.EVICTED,
        CloseCause.CLOSED_BY_LIMIT,
    }
)


@dataclass(frozen=True, slots=True)
class Closing:
    """A connection's end: its cause, the property behind a quota's close, and one line saying why
    (``detail`` tells apart lines of one cause that say different things)."""

    cause: CloseCause
    reason: str = ""
    limit_key: str = ""
    detail: str = ""

    @property
    def label(self) -> str:
        """The metric label and the audit close event's ``reason``."""
        return f"{self.cause.value}: {self.limit_key}" if self.limit_key else self.cause.value

    @property
    def failure(self) -> bool:
        """Counted in ``kafka_admission_connection_failures_total`` (an end the client did not ask for
        and no policy chose)."""
        return self.cause not in _NORMAL
