"""The Kafka properties the report evaluates and recommends, by their Kafka
names (the proxy's own ``policies`` keys, :class:`proxy.config.model.Policies`), with
the policy each belongs to and Kafka's default as the proxy applies it.

Identifier kinds map to their KIP-1233 limit the way
:data:`policies.identifier_limits.LIMIT_KEYS` does; audit events spell a kind
either as the enum's name (``client_id``) or its text (``client id``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from pyspark.sql import Column
from pyspark.sql import functions as F

from policies.identifier_limits import LIMIT_KEYS as IDENTIFIER_LIMIT_KEYS
from proxy.config.model import Policies

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
        Limit("group.max.size", "group_size", "refuse", "members"),
        Limit("group.consumer.max.size", "group_size", "refuse", "members"),
        Limit("max.connections", "connections", "refuse_or_evict", "connections"),
        Limit("max.ssl.connections", "connections", "refuse_or_evict", "connections"),
        Limit("max.connections.per.ip", "connections", "refuse", "connections"),
        Limit("queued.max.request.bytes", "memory_pool", "wait", "bytes"),
        Limit("socket.request.max.bytes", "request_size", "close", "bytes"),
        Limit("max.response.size", "response_size", "close", "bytes"),
        Limit("resource.identifier.max.length", "identifier_limits", "refuse", "characters"),
        Limit("member.id.max.length", "identifier_limits", "refuse", "characters"),
        Limit("classic.member.id.max.length", "identifier_limits", "refuse", "characters"),
        Limit("topic.name.max.length", "identifier_limits", "refuse", "characters"),
        Limit("offset.metadata.max.bytes", "identifier_limits", "refuse", "characters"),
    )
}

# Kafka's defaults, as the proxy's config applies them.
KAFKA_DEFAULTS: Final[dict[str, int]] = {key: int(value) for key, value in Policies().flat().items() if key in LIMITS}


def normalized_kind(kind: str) -> str:
    """``"client id"``, ``"CLIENT_ID"``, ``"client-id"`` -> ``"client_id"`` (as :func:`identifier_limit_key`)."""
    return kind.lower().translate(_SEPARATORS)


_SEPARATORS: Final = str.maketrans(" -.", "___")
_KIND_TO_KEY: Final[dict[str, str]] = {
    **{normalized_kind(kind.name): key for kind, key in IDENTIFIER_LIMIT_KEYS.items()},
    **{normalized_kind(kind.value): key for kind, key in IDENTIFIER_LIMIT_KEYS.items()},
}
IDENTIFIER_KEYS: Final[tuple[str, ...]] = tuple(dict.fromkeys(IDENTIFIER_LIMIT_KEYS.values()))
_GENERAL_KEY: Final = "resource.identifier.max.length"


def limit_key_of(kind: str) -> str:
    """The KIP-1233 property that limits identifiers of ``kind``; unknown kinds: the general one."""
    return _KIND_TO_KEY.get(normalized_kind(kind), _GENERAL_KEY)


def identifier_limit_key(kind: Column, kinds: Iterable[str]) -> Column:
    """:func:`limit_key_of` for a column of kinds, any of ``kinds`` (the kinds there are: each is looked
    up here once and matched per row as it is written; Spark's ``translate`` of every row's kind, to
    normalize it there, built its table again for each row)."""
    table = F.create_map(*[F.lit(x) for k in sorted(set(kinds)) for x in (k, limit_key_of(k))])
    return F.coalesce(F.try_element_at(table, kind), F.lit(_GENERAL_KEY))
