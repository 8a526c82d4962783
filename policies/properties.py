"""The broker properties the proxy takes, the one home for their names, defaults and meaning.

Names and defaults are Kafka's (``KafkaConfig``, ``SocketServerConfigs``, ``GroupCoordinatorConfig``
and the KIPs named below), so a value can be copied from ``server.properties``; the few the proxy
adds say "Beyond Kafka". The bounds are Kafka's ``ConfigDef`` validators. The proxy's config
(``proxy/config/model.py``) parses the ``policies:`` section with these, the policies name them in
their decisions, and the report (``pipeline/``) evaluates and recommends them.

Names are plain ``str`` constants, as in :mod:`policies.api_keys`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from policies.api_keys import INT_MAX

# Java's Long.MIN_VALUE and MAX_VALUE: the bounds of Kafka's LONG properties.
LONG_MIN: Final = -(2**63)
LONG_MAX: Final = 2**63 - 1
# Kafka's per-listener form of a property: ``listener.name.<listener>.<property>``.
LISTENER_PREFIX: Final = "listener.name."

SOCKET_REQUEST_MAX_BYTES: Final = "socket.request.max.bytes"
SASL_SERVER_MAX_RECEIVE_SIZE: Final = "sasl.server.max.receive.size"
MAX_RESPONSE_SIZE: Final = "max.response.size"
MAX_CONNECTIONS: Final = "max.connections"
MAX_CONNECTIONS_PER_IP: Final = "max.connections.per.ip"
MAX_CONNECTIONS_PER_IP_OVERRIDES: Final = "max.connections.per.ip.overrides"
MAX_SSL_CONNECTIONS: Final = "max.ssl.connections"
CONNECTIONS_MAX_IDLE_MS: Final = "connections.max.idle.ms"
MAX_CONNECTIONS_WAIT_MS: Final = "max.connections.wait.ms"
MAX_SSL_HANDSHAKES_PER_TURN: Final = "max.ssl.handshakes.per.turn"
GROUP_MAX_SIZE: Final = "group.max.size"
GROUP_CONSUMER_MAX_SIZE: Final = "group.consumer.max.size"
GROUP_JOIN_RATE_PER_MINUTE: Final = "group.join.rate.per.minute"
GROUP_MIN_SESSION_TIMEOUT_MS: Final = "group.min.session.timeout.ms"
GROUP_MAX_SESSION_TIMEOUT_MS: Final = "group.max.session.timeout.ms"
GROUP_RECONCILE_INTERVAL_MS: Final = "group.reconcile.interval.ms"
QUEUED_MAX_REQUEST_BYTES: Final = "queued.max.request.bytes"
QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION: Final = "queued.max.request.bytes.per.connection"
REQUEST_BODY_TIMEOUT_MS: Final = "request.body.timeout.ms"
RESOURCE_IDENTIFIER_LIMIT_ENABLE: Final = "resource.identifier.limit.enable"
RESOURCE_IDENTIFIER_MAX_LENGTH: Final = "resource.identifier.max.length"
MEMBER_ID_MAX_LENGTH: Final = "member.id.max.length"
CLASSIC_MEMBER_ID_MAX_LENGTH: Final = "classic.member.id.max.length"
TOPIC_NAME_MAX_LENGTH: Final = "topic.name.max.length"
OFFSET_METADATA_MAX_BYTES: Final = "offset.metadata.max.bytes"
RESOURCE_IDENTIFIER_LIMIT_ERROR_CODE: Final = "resource.identifier.limit.error.code"
# Named in messages only: the proxy takes Kafka's default (45000), not a value.
GROUP_CONSUMER_SESSION_TIMEOUT_MS: Final = "group.consumer.session.timeout.ms"


@dataclass(frozen=True, slots=True)
class Property:
    """One property: its name, default (its type is the property's), one-line meaning, and
    the least and greatest integer it takes (None: unbounded there)."""

    name: str
    default: int | bool | str
    meaning: str
    at_least: int | None = None
    at_most: int | None = None


PROPERTIES: Final[Mapping[str, Property]] = {
    p.name: p
    for p in (
        Property(
            SOCKET_REQUEST_MAX_BYTES,
            104_857_600,
            "the largest request frame; a larger one closes its connection (NetworkReceive)",
            1,
            INT_MAX,
        ),
        Property(
            SASL_SERVER_MAX_RECEIVE_SIZE,
            524_288,
            "the largest frame before SASL authentication completes (SaslServerAuthenticator)",
            1,
            INT_MAX,
        ),
        Property(
            MAX_RESPONSE_SIZE,
            104_857_600,
            "KIP-498: the largest response frame forwarded from a broker; a larger one closes the client",
            1,
            INT_MAX,
        ),
        Property(
            MAX_CONNECTIONS,
            INT_MAX,
            "connections at once on the non-protected listeners, together (ConnectionQuotas)",
            0,
            INT_MAX,
        ),
        Property(MAX_CONNECTIONS_PER_IP, INT_MAX, "connections at once from one client address", 0, INT_MAX),
        Property(
            MAX_CONNECTIONS_PER_IP_OVERRIDES,
            "",
            "per-address exceptions to max.connections.per.ip: host:limit, comma-separated",
        ),
        Property(
            MAX_SSL_CONNECTIONS,
            INT_MAX,
            "KIP-1015: TLS connections at once on the non-protected listeners",
            0,
            INT_MAX,
        ),
        Property(
            CONNECTIONS_MAX_IDLE_MS,
            600_000,
            "a connection with no request in flight idle longer than this is closed (Selector); -1: never",
            -1,
        ),
        Property(
            MAX_CONNECTIONS_WAIT_MS,
            30_000,
            "Beyond Kafka: how long a connection may wait in the backlog for a slot before it is closed",
            1,
            INT_MAX,
        ),
        Property(
            MAX_SSL_HANDSHAKES_PER_TURN,
            4,
            "Beyond Kafka: TLS handshakes computed between two turns of the established connections",
            1,
            INT_MAX,
        ),
        Property(GROUP_MAX_SIZE, INT_MAX, "KIP-389: members of a classic consumer group", 1, INT_MAX),
        Property(GROUP_CONSUMER_MAX_SIZE, INT_MAX, "KIP-848: members of a consumer-protocol group", 1, INT_MAX),
        Property(
            GROUP_JOIN_RATE_PER_MINUTE,
            -1,
            "Beyond Kafka: joins per minute per group, beyond which a join is throttled; -1: off",
            -1,
            INT_MAX,
        ),
        Property(
            GROUP_MIN_SESSION_TIMEOUT_MS,
            6_000,
            "the shortest session timeout a classic member may ask",
            0,
            INT_MAX,
        ),
        Property(
            GROUP_MAX_SESSION_TIMEOUT_MS,
            1_800_000,
            "the longest session timeout a classic member may ask",
            1,
            INT_MAX,
        ),
        Property(
            GROUP_RECONCILE_INTERVAL_MS,
            60_000,
            "Beyond Kafka: how often a group near its cap is counted again at its coordinator",
            1,
            INT_MAX,
        ),
        Property(
            QUEUED_MAX_REQUEST_BYTES,
            -1,
            "KIP-72: bytes of requests read and not yet answered, all connections together; -1: off",
            -1,
            LONG_MAX,
        ),
        Property(
            QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION,
            -1,
            "Beyond Kafka: the share of queued.max.request.bytes one connection may hold; -1: off",
            -1,
            LONG_MAX,
        ),
        Property(
            REQUEST_BODY_TIMEOUT_MS,
            10_000,
            "Beyond Kafka: how long the rest of a request may take to arrive once its length is read",
            1,
            INT_MAX,
        ),
        Property(RESOURCE_IDENTIFIER_LIMIT_ENABLE, False, "KIP-1233: identifier lengths are checked"),
        Property(
            RESOURCE_IDENTIFIER_MAX_LENGTH,
            249,
            "KIP-1233: the longest group id, client id, transactional id and the like",
            0,
            INT_MAX,
        ),
        Property(MEMBER_ID_MAX_LENGTH, 36, "KIP-1233: the longest member id a client sets", 0, INT_MAX),
        Property(
            CLASSIC_MEMBER_ID_MAX_LENGTH,
            249 + 1 + 36,
            "KIP-1233: the longest classic member id (client id, '-', a UUID)",
            0,
            INT_MAX,
        ),
        Property(TOPIC_NAME_MAX_LENGTH, 249, "KIP-1233: the longest topic name", 0, INT_MAX),
        Property(OFFSET_METADATA_MAX_BYTES, 4_096, "the longest offset commit metadata", 0, INT_MAX),
        Property(
            RESOURCE_IDENTIFIER_LIMIT_ERROR_CODE,
            42,
            "KIP-1233: the error code a too-long identifier is refused with (42: INVALID_REQUEST)",
            1,
            32_767,
        ),
    )
}


def int_default(name: str) -> int:
    """The default of the integer property ``name``."""
    value = PROPERTIES[name].default
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} is not an integer property")
    return value


def per_listener(listener: str, name: str) -> str:
    """Kafka's key for ``name`` on one listener, e.g. ``listener.name.external.max.connections``."""
    return f"{LISTENER_PREFIX}{listener}.{name}"


def check_values(values: Mapping[str, object]) -> None:
    """Raise ``ValueError`` naming the key if a value is not one its property takes: a known
    name, the type of its default (a bool is no integer), within its bounds."""
    for name, value in values.items():
        prop = PROPERTIES.get(name)
        if prop is None:
            raise ValueError(f"{name} is not a property the proxy takes")
        kind = type(prop.default)
        if type(value) is not kind:
            raise ValueError(f"{name} must be of type {kind.__name__}, got {value!r}")
        if isinstance(value, int) and not isinstance(value, bool):
            if prop.at_least is not None and value < prop.at_least:
                raise ValueError(f"{name} must be >= {prop.at_least}, got {value}")
            if prop.at_most is not None and value > prop.at_most:
                raise ValueError(f"{name} must be <= {prop.at_most}, got {value}")
