"""The Kafka properties the report evaluates and recommends, by their Kafka
names (the proxy's own ``policies`` keys, :mod:`policies.properties`), with
the policy each belongs to and Kafka's default as the proxy applies it.

Identifier kinds map to their KIP-1233 limit the way
:data:`policies.identifier_kinds.LIMIT_KEYS` does; audit events spell a kind
either as the enum's name (``client_id``) or its text (``client id``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from pyspark.sql import Column
from pyspark.sql import functions as F

from policies.identifier_kinds import LIMIT_KEYS as IDENTIFIER_LIMIT_KEYS
from policies.properties import (
    CLASSIC_MEMBER_ID_MAX_LENGTH,
    GROUP_CONSUMER_MAX_SIZE,
    GROUP_MAX_SIZE,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_IP,
    MAX_RESPONSE_SIZE,
    MAX_SSL_CONNECTIONS,
    MEMBER_ID_MAX_LENGTH,
    OFFSET_METADATA_MAX_BYTES,
    QUEUED_MAX_REQUEST_BYTES,
    RESOURCE_IDENTIFIER_MAX_LENGTH,
    SOCKET_REQUEST_MAX_BYTES,
    TOPIC_NAME_MAX_LENGTH,
    int_default,
)

__all__ = ["KAFKA_DEFAULTS", "LIMITS", "Limit", "identifier_limit_key", "limit_key_of", "normalized_kind"]


@dataclass(frozen=True)
class Limit:
    key: str  # the Kafka property name
    policy: str  # the audit events' policy name
    action: str  # what the proxy does at the limit: refuse, wait, close, refuse_or_evict
    unit: str  # members, connections, bytes, characters


LIMITS: Final[dict[str, Limit]] = {
    limit.key: limit
    for limit in (
        Limit(GROUP_MAX_SIZE, "group_size", "refuse", "members"),
        Limit(GROUP_CONSUMER_MAX_SIZE, "group_size", "refuse", "members"),
        Limit(MAX_CONNECTIONS, "connections", "refuse_or_evict", "connections"),
        Limit(MAX_SSL_CONNECTIONS, "connections", "refuse_or_evict", "connections"),
        Limit(MAX_CONNECTIONS_PER_IP, "connections", "refuse", "connections"),
        Limit(QUEUED_MAX_REQUEST_BYTES, "memory_pool", "wait", "bytes"),
        Limit(SOCKET_REQUEST_MAX_BYTES, "request_size", "close", "bytes"),
        Limit(MAX_RESPONSE_SIZE, "response_size", "close", "bytes"),
        Limit(RESOURCE_IDENTIFIER_MAX_LENGTH, "identifier_limits", "refuse", "characters"),
        Limit(MEMBER_ID_MAX_LENGTH, "identifier_limits", "refuse", "characters"),
        Limit(CLASSIC_MEMBER_ID_MAX_LENGTH, "identifier_limits", "refuse", "characters"),
        Limit(TOPIC_NAME_MAX_LENGTH, "identifier_limits", "refuse", "characters"),
        Limit(OFFSET_METADATA_MAX_BYTES, "identifier_limits", "refuse", "characters"),
    )
}

# Kafka's defaults, as the proxy's config applies them.
KAFKA_DEFAULTS: Final[dict[str, int]] = {key: int_default(key) for key in LIMITS}


def normalized_kind(kind: str) -> str:
    """``"client id"``, ``"CLIENT_ID"``, ``"client-id"`` -> ``"client_id"`` (as :func:`identifier_limit_key`)."""
    return kind.lower().translate(_SEPARATORS)


_SEPARATORS: Final = str.maketrans(" -.", "___")
_KIND_TO_KEY: Final[dict[str, str]] = {
    **{normalized_kind(kind.name): key for kind, key in IDENTIFIER_LIMIT_KEYS.items()},
    **{normalized_kind(kind.value): key for kind, key in IDENTIFIER_LIMIT_KEYS.items()},
}
IDENTIFIER_KEYS: Final[tuple[str, ...]] = tuple(dict.fromkeys(IDENTIFIER_LIMIT_KEYS.values()))
_GENERAL_KEY: Final = RESOURCE_IDENTIFIER_MAX_LENGTH


def limit_key_of(kind: str) -> str:
    """The KIP-1233 property that limits identifiers of ``kind``; unknown kinds: the general one."""
    return _KIND_TO_KEY.get(normalized_kind(kind), _GENERAL_KEY)


def identifier_limit_key(kind: Column, kinds: Iterable[str]) -> Column:
    """:func:`limit_key_of` for a column of kinds, any of ``kinds`` (the kinds there are: each is looked
    up here once and matched per row as it is written; Spark's ``translate`` of every row's kind, to
    normalize it there, built its table again for each row)."""
    table = F.create_map(*[F.lit(x) for k in sorted(set(kinds)) for x in (k, limit_key_of(k))])
    return F.coalesce(F.try_element_at(table, kind), F.lit(_GENERAL_KEY))
