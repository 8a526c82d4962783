"""KIP-1233: maximum lengths for resource names and identifiers in requests.

Sans-I/O and codec-agnostic: a request body is walked with ``getattr`` along
the field paths in :data:`IDENTIFIER_FIELDS` (names as the kio schemas spell
them), so any object with those attributes works. The checks report
:class:`Breach` es; :func:`decide` turns a request's breaches into one
:class:`policies.decision.Decision` (REFUSE with the error code Kafka would
answer, or CLOSE when no answer is expected), which the shell carries out in
enforce mode and only records in observe mode.

Lengths are Java's ``String.length()``, i.e. UTF-16 code units: a character
outside the Basic Multilingual Plane (an emoji) counts 2. Kafka counts the
offset commit metadata the same way, in spite of the ``.bytes`` in its
property name (``metadata.length() > offsetMetadataMaxSize``).

Limits (:class:`IdentifierLimits`, keys in :data:`CONFIG_KEYS`):

* ``resource.identifier.limit.enable`` (default ``false``, as in Kafka 4.x):
  with it off, nothing is checked.
* ``resource.identifier.max.length`` (249): group id, group instance id,
  client id, transactional id, rack id, config and ACL resource names, ACL
  principal and host.
* ``member.id.max.length`` (36): member ids the client generates (a UUID;
  KIP-848 ConsumerGroupHeartbeat, KIP-932 ShareGroupHeartbeat, ShareFetch and
  ShareAcknowledge, KIP-1071 StreamsGroupHeartbeat).
* ``classic.member.id.max.length`` (286): member ids of the classic group
  protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, and the offset APIs,
  which carry either kind). The broker generates those as
  ``<client.id or group.instance.id>-<UUID>``, up to 249 + 1 + 36 characters,
  so a 36 limit would refuse nearly every classic consumer. Set it to 36 for
  the KIP's literal reading.
* ``topic.name.max.length`` (249, Kafka's fixed ``Topic.MAX_NAME_LENGTH``):
  topic names where topics are created (CreateTopics), which must also be
  ``[a-zA-Z0-9._-]+`` and not ``.`` or ``..``; breaches answer
  INVALID_TOPIC_EXCEPTION (17), as Kafka does today.
* ``offset.metadata.max.bytes`` (4096, Kafka's property): committed offset
  metadata, per partition; breaches answer OFFSET_METADATA_TOO_LARGE (12).
* ``resource.identifier.limit.error.code`` (42, INVALID_REQUEST): the code for
  every other identifier until RESOURCE_IDENTIFIER_TOO_LARGE is assigned.
  Member ids always answer INVALID_REQUEST, as the KIP specifies.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from kio.schema.errors import ErrorCode

from policies.api_keys import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    ALTER_CONFIGS,
    ALTER_SHARE_GROUP_OFFSETS,
    CONSUMER_GROUP_DESCRIBE,
    CONSUMER_GROUP_HEARTBEAT,
    CREATE_ACLS,
    CREATE_TOPICS,
    DELETE_ACLS,
    DELETE_GROUPS,
    DELETE_SHARE_GROUP_OFFSETS,
    DELETE_SHARE_GROUP_STATE,
    DESCRIBE_ACLS,
    DESCRIBE_CONFIGS,
    DESCRIBE_GROUPS,
    DESCRIBE_SHARE_GROUP_OFFSETS,
    DESCRIBE_TRANSACTIONS,
    END_TXN,
    FIND_COORDINATOR,
    HEARTBEAT,
    INCREMENTAL_ALTER_CONFIGS,
    INIT_PRODUCER_ID,
    INITIALIZE_SHARE_GROUP_STATE,
    INT_MAX,
    JOIN_GROUP,
    LEAVE_GROUP,
    OFFSET_COMMIT,
    OFFSET_DELETE,
    OFFSET_FETCH,
    PRODUCE,
    READ_SHARE_GROUP_STATE,
    READ_SHARE_GROUP_STATE_SUMMARY,
    SHARE_ACKNOWLEDGE,
    SHARE_FETCH,
    SHARE_GROUP_DESCRIBE,
    SHARE_GROUP_HEARTBEAT,
    STREAMS_GROUP_DESCRIBE,
    STREAMS_GROUP_HEARTBEAT,
    SYNC_GROUP,
    TXN_OFFSET_COMMIT,
    WRITE_SHARE_GROUP_STATE,
)
from policies.decision import Action, Decision, Policy
from policies.identifier_kinds import LIMIT_KEYS, IdentifierKind
from policies.mode import Mode
from policies.properties import (
    CLASSIC_MEMBER_ID_MAX_LENGTH,
    MEMBER_ID_MAX_LENGTH,
    OFFSET_METADATA_MAX_BYTES,
    PROPERTIES,
    RESOURCE_IDENTIFIER_LIMIT_ENABLE,
    RESOURCE_IDENTIFIER_LIMIT_ERROR_CODE,
    RESOURCE_IDENTIFIER_MAX_LENGTH,
    TOPIC_NAME_MAX_LENGTH,
    int_default,
)

# The Kafka error codes this policy answers with (kio's, as plain ints: they go on the wire and in events).
INVALID_REQUEST: Final = ErrorCode.invalid_request.value
INVALID_TOPIC_EXCEPTION: Final = ErrorCode.invalid_topic_exception.value
OFFSET_METADATA_TOO_LARGE: Final = ErrorCode.offset_metadata_too_large.value


IDENTIFIER_KEPT: Final = 300  # characters of a breaching identifier an audit event keeps


class BreachReason(enum.Enum):
    TOO_LONG = "too_long"
    INVALID_CHARACTERS = "invalid_characters"  # topic names only
    ILLEGAL_NAME = "illegal_name"  # topic names "", "." and ".."


# Property name -> IdentifierLimits attribute (proxy/config/model.py parses the properties; these name them in errors).
CONFIG_KEYS: Final[Mapping[str, str]] = {
    RESOURCE_IDENTIFIER_LIMIT_ENABLE: "enabled",
    RESOURCE_IDENTIFIER_MAX_LENGTH: "max_length",
    MEMBER_ID_MAX_LENGTH: "member_id_max_length",
    CLASSIC_MEMBER_ID_MAX_LENGTH: "classic_member_id_max_length",
    TOPIC_NAME_MAX_LENGTH: "topic_name_max_length",
    OFFSET_METADATA_MAX_BYTES: "offset_metadata_max_bytes",
    RESOURCE_IDENTIFIER_LIMIT_ERROR_CODE: "error_code",
}


@dataclass(frozen=True, slots=True)
class IdentifierLimits:
    enabled: bool = PROPERTIES[RESOURCE_IDENTIFIER_LIMIT_ENABLE].default is True
    max_length: int = int_default(RESOURCE_IDENTIFIER_MAX_LENGTH)
    member_id_max_length: int = int_default(MEMBER_ID_MAX_LENGTH)
    classic_member_id_max_length: int = int_default(CLASSIC_MEMBER_ID_MAX_LENGTH)
    topic_name_max_length: int = int_default(TOPIC_NAME_MAX_LENGTH)
    offset_metadata_max_bytes: int = int_default(OFFSET_METADATA_MAX_BYTES)
    error_code: int = int_default(RESOURCE_IDENTIFIER_LIMIT_ERROR_CODE)

    def __post_init__(self) -> None:
        for name in (
            "max_length",
            "member_id_max_length",
            "classic_member_id_max_length",
            "topic_name_max_length",
            "offset_metadata_max_bytes",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT_MAX:
                raise ValueError(f"{_key_of(name)} must be an integer 0-{INT_MAX}, got {value!r}")
        code = self.error_code
        if isinstance(code, bool) or not isinstance(code, int) or not 1 <= code <= 32767:
            raise ValueError(f"{RESOURCE_IDENTIFIER_LIMIT_ERROR_CODE} must be a Kafka error code 1-32767, got {code!r}")
        if not isinstance(self.enabled, bool):
            raise ValueError(f"{RESOURCE_IDENTIFIER_LIMIT_ENABLE} must be a boolean, got {self.enabled!r}")

    def limit_for(self, kind: IdentifierKind) -> int:
        """The length limit for identifiers of ``kind``."""
        # A dict, not a chain of enum comparisons: on Python 3.11 each enum attribute
        # access costs most of a microsecond, and this runs for every request.
        return int(getattr(self, _LIMIT_ATTRIBUTE.get(kind, "max_length")))

    def error_code_for(self, kind: IdentifierKind) -> int:
        """The Kafka error code a breach of ``kind`` is answered with."""
        return _FIXED_ERROR_CODE.get(kind, self.error_code)


_LIMIT_ATTRIBUTE: Final = {
    IdentifierKind.MEMBER_ID: "member_id_max_length",
    IdentifierKind.CLASSIC_MEMBER_ID: "classic_member_id_max_length",
    IdentifierKind.TOPIC_NAME: "topic_name_max_length",
    IdentifierKind.OFFSET_METADATA: "offset_metadata_max_bytes",
}
_FIXED_ERROR_CODE: Final = {
    IdentifierKind.TOPIC_NAME: INVALID_TOPIC_EXCEPTION,
    IdentifierKind.OFFSET_METADATA: OFFSET_METADATA_TOO_LARGE,
    IdentifierKind.MEMBER_ID: INVALID_REQUEST,
    IdentifierKind.CLASSIC_MEMBER_ID: INVALID_REQUEST,
}


def _key_of(attr: str) -> str:
    return next(key for key, name in CONFIG_KEYS.items() if name == attr)


@dataclass(frozen=True, slots=True)
class FieldRule:
    """One identifier-carrying request field.

    ``path`` is dotted attribute names as in the kio schemas; ``name[]`` walks
    every element of a collection (``groups[]`` alone: the elements are the
    identifiers). ``selector`` names a top-level field whose integer value
    picks the kind (FindCoordinator's ``key_type``); a value missing from the
    mapping means "not checked". Versions are inclusive; ``None`` is open.
    """

    path: str
    kind: IdentifierKind
    min_version: int = 0
    max_version: int | None = None
    selector: tuple[str, Mapping[int, IdentifierKind]] | None = None

    def applies_to(self, api_version: int) -> bool:
        """Whether the field exists in this version of the request."""
        return self.min_version <= api_version and (self.max_version is None or api_version <= self.max_version)


_K = IdentifierKind
# FindCoordinator key_type: 0 group, 1 transaction; 2 (share, "group:topicId:partition") is not checked.
_COORDINATOR_KEY = ("key_type", {0: _K.GROUP_ID, 1: _K.TRANSACTIONAL_ID})


def _rule(
    path: str,
    kind: IdentifierKind,
    min_version: int = 0,
    max_version: int | None = None,
    selector: tuple[str, Mapping[int, IdentifierKind]] | None = None,
) -> FieldRule:
    return FieldRule(path, kind, min_version, max_version, selector)


# Per API key, the request fields that carry identifiers (field names and
# version ranges as in Kafka's message JSON / kio; checked against kio in tests).
IDENTIFIER_FIELDS: Final[Mapping[int, tuple[FieldRule, ...]]] = {
    PRODUCE: (_rule("transactional_id", _K.TRANSACTIONAL_ID, 3),),
    OFFSET_COMMIT: (
        _rule("group_id", _K.GROUP_ID),
        _rule("member_id", _K.CLASSIC_MEMBER_ID, 1),
        _rule("group_instance_id", _K.GROUP_INSTANCE_ID, 7),
        _rule("topics[].partitions[].committed_metadata", _K.OFFSET_METADATA),
    ),
    OFFSET_FETCH: (
        _rule("group_id", _K.GROUP_ID, 0, 7),
        _rule("groups[].group_id", _K.GROUP_ID, 8),
        _rule("groups[].member_id", _K.CLASSIC_MEMBER_ID, 9),
    ),
    FIND_COORDINATOR: (
        _rule("key", _K.GROUP_ID, 0, 3, selector=_COORDINATOR_KEY),
        _rule("coordinator_keys[]", _K.GROUP_ID, 4, selector=_COORDINATOR_KEY),
    ),
    JOIN_GROUP: (
        _rule("group_id", _K.GROUP_ID),
        _rule("member_id", _K.CLASSIC_MEMBER_ID),
        _rule("group_instance_id", _K.GROUP_INSTANCE_ID, 5),
    ),
    HEARTBEAT: (
        _rule("group_id", _K.GROUP_ID),
        _rule("member_id", _K.CLASSIC_MEMBER_ID),
        _rule("group_instance_id", _K.GROUP_INSTANCE_ID, 3),
    ),
    LEAVE_GROUP: (
        _rule("group_id", _K.GROUP_ID),
        _rule("member_id", _K.CLASSIC_MEMBER_ID, 0, 2),
        _rule("members[].member_id", _K.CLASSIC_MEMBER_ID, 3),
        _rule("members[].group_instance_id", _K.GROUP_INSTANCE_ID, 3),
    ),
    SYNC_GROUP: (
        _rule("group_id", _K.GROUP_ID),
        _rule("member_id", _K.CLASSIC_MEMBER_ID),
        _rule("group_instance_id", _K.GROUP_INSTANCE_ID, 3),
        _rule("assignments[].member_id", _K.CLASSIC_MEMBER_ID),
    ),
    DESCRIBE_GROUPS: (_rule("groups[]", _K.GROUP_ID),),
    CREATE_TOPICS: (_rule("topics[].name", _K.TOPIC_NAME),),
    INIT_PRODUCER_ID: (_rule("transactional_id", _K.TRANSACTIONAL_ID),),
    ADD_PARTITIONS_TO_TXN: (
        _rule("v3_and_below_transactional_id", _K.TRANSACTIONAL_ID, 0, 3),
        _rule("transactions[].transactional_id", _K.TRANSACTIONAL_ID, 4),
    ),
    ADD_OFFSETS_TO_TXN: (
        _rule("transactional_id", _K.TRANSACTIONAL_ID),
        _rule("group_id", _K.GROUP_ID),
    ),
    END_TXN: (_rule("transactional_id", _K.TRANSACTIONAL_ID),),
    TXN_OFFSET_COMMIT: (
        _rule("transactional_id", _K.TRANSACTIONAL_ID),
        _rule("group_id", _K.GROUP_ID),
        _rule("member_id", _K.CLASSIC_MEMBER_ID, 3),
        _rule("group_instance_id", _K.GROUP_INSTANCE_ID, 3),
        _rule("topics[].partitions[].committed_metadata", _K.OFFSET_METADATA),
    ),
    DESCRIBE_ACLS: (
        _rule("resource_name_filter", _K.RESOURCE_NAME),
        _rule("principal_filter", _K.PRINCIPAL),
        _rule("host_filter", _K.HOST),
    ),
    CREATE_ACLS: (
        _rule("creations[].resource_name", _K.RESOURCE_NAME),
        _rule("creations[].principal", _K.PRINCIPAL),
        _rule("creations[].host", _K.HOST),
    ),
    DELETE_ACLS: (
        _rule("filters[].resource_name_filter", _K.RESOURCE_NAME),
        _rule("filters[].principal_filter", _K.PRINCIPAL),
        _rule("filters[].host_filter", _K.HOST),
    ),
    DESCRIBE_CONFIGS: (_rule("resources[].resource_name", _K.RESOURCE_NAME),),
    ALTER_CONFIGS: (_rule("resources[].resource_name", _K.RESOURCE_NAME),),
    DELETE_GROUPS: (_rule("groups_names[]", _K.GROUP_ID),),
    INCREMENTAL_ALTER_CONFIGS: (_rule("resources[].resource_name", _K.RESOURCE_NAME),),
    OFFSET_DELETE: (_rule("group_id", _K.GROUP_ID),),
    DESCRIBE_TRANSACTIONS: (_rule("transactional_ids[]", _K.TRANSACTIONAL_ID),),
    CONSUMER_GROUP_HEARTBEAT: (
        _rule("group_id", _K.GROUP_ID),
        _rule("member_id", _K.MEMBER_ID),
        _rule("instance_id", _K.GROUP_INSTANCE_ID),
        _rule("rack_id", _K.RACK_ID),
    ),
    CONSUMER_GROUP_DESCRIBE: (_rule("group_ids[]", _K.GROUP_ID),),
    SHARE_GROUP_HEARTBEAT: (
        _rule("group_id", _K.GROUP_ID),
        _rule("member_id", _K.MEMBER_ID),
        _rule("rack_id", _K.RACK_ID),
    ),
    SHARE_GROUP_DESCRIBE: (_rule("group_ids[]", _K.GROUP_ID),),
    # KIP-932's member ids are the client's UUID, also in the share data-plane APIs.
    SHARE_FETCH: (_rule("group_id", _K.GROUP_ID), _rule("member_id", _K.MEMBER_ID)),
    SHARE_ACKNOWLEDGE: (_rule("group_id", _K.GROUP_ID), _rule("member_id", _K.MEMBER_ID)),
    # The share coordinator's state APIs are served on broker listeners, so clients reach them too.
    INITIALIZE_SHARE_GROUP_STATE: (_rule("group_id", _K.GROUP_ID),),
    READ_SHARE_GROUP_STATE: (_rule("group_id", _K.GROUP_ID),),
    WRITE_SHARE_GROUP_STATE: (_rule("group_id", _K.GROUP_ID),),
    DELETE_SHARE_GROUP_STATE: (_rule("group_id", _K.GROUP_ID),),
    READ_SHARE_GROUP_STATE_SUMMARY: (_rule("group_id", _K.GROUP_ID),),
    STREAMS_GROUP_HEARTBEAT: (  # KIP-1071: the member id is the client's UUID, as in KIP-848
        _rule("group_id", _K.GROUP_ID),
        _rule("member_id", _K.MEMBER_ID),
        _rule("instance_id", _K.GROUP_INSTANCE_ID),
        _rule("rack_id", _K.RACK_ID),
    ),
    STREAMS_GROUP_DESCRIBE: (_rule("group_ids[]", _K.GROUP_ID),),
    DESCRIBE_SHARE_GROUP_OFFSETS: (_rule("groups[].group_id", _K.GROUP_ID),),
    ALTER_SHARE_GROUP_OFFSETS: (_rule("group_id", _K.GROUP_ID),),
    DELETE_SHARE_GROUP_OFFSETS: (_rule("group_id", _K.GROUP_ID),),
}


@dataclass(frozen=True, slots=True)
class Breach:
    """One identifier over its limit (or, for topic names, not a legal name).

    ``path`` locates it in the request: ``group_id``, ``groups[1]``,
    ``topics[0].partitions[2].committed_metadata``, ``header.client_id``.
    ``length`` is in UTF-16 code units (Java ``String.length()``).
    """

    kind: IdentifierKind
    path: str
    length: int
    limit: int
    error_code: int
    reason: BreachReason = BreachReason.TOO_LONG
    message: str = field(default="", compare=False)
    value: str = field(default="", compare=False)  # the identifier itself (the audit names it)

    @property
    def element_path(self) -> str:
        """The innermost collection element holding the identifier ("" for the request itself)."""
        if self.path.startswith("header."):
            return ""
        end = self.path.rfind("]")
        return self.path[: end + 1] if end >= 0 else ""


def java_length(value: str) -> int:
    """``String.length()`` in Java: UTF-16 code units, 2 for a supplementary character."""
    if value.isascii():
        return len(value)
    return len(value) + sum(1 for ch in value if ord(ch) > 0xFFFF)


_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")
_TOPIC_NAME: Final = IdentifierKind.TOPIC_NAME


def _message(kind: IdentifierKind, path: str, length: int, limit: int) -> str:
    # Topic names and offset metadata are limits Kafka has always had; the rest are KIP-1233's.
    source = "" if kind in (IdentifierKind.TOPIC_NAME, IdentifierKind.OFFSET_METADATA) else ", KIP-1233"
    return f"{kind.value} ({path}) is {length} characters long, over the limit of {limit} ({LIMIT_KEYS[kind]}{source})"


def _check_value(kind: IdentifierKind, path: str, value: str, limits: IdentifierLimits) -> Breach | None:
    limit = limits.limit_for(kind)
    length = java_length(value)
    if length <= limit and kind is not _TOPIC_NAME:
        return None  # the common case, decided without building anything
    code = limits.error_code_for(kind)
    if kind is _TOPIC_NAME:
        # Kafka's Topic.validate order: empty, "." / "..", length, characters.
        if value in ("", ".", ".."):
            message = f"topic name ({path}) {value!r} is illegal: it cannot be empty, '.' or '..'"
            return Breach(kind, path, length, limit, code, BreachReason.ILLEGAL_NAME, message, value)
        if length > limit:
            message = _message(kind, path, length, limit)
            return Breach(kind, path, length, limit, code, BreachReason.TOO_LONG, message, value)
        if not _LEGAL_TOPIC.fullmatch(value):
            message = (
                f"topic name ({path}) is illegal: it contains a character other than "
                "ASCII alphanumerics, '.', '_' and '-'"
            )
            return Breach(kind, path, length, limit, code, BreachReason.INVALID_CHARACTERS, message, value)
        return None
    if length > limit:
        message = _message(kind, path, length, limit)
        return Breach(kind, path, length, limit, code, BreachReason.TOO_LONG, message, value)
    return None


_MISSING: Final = object()


def _walk(obj: object, segments: tuple[str, ...], prefix: str) -> Iterator[tuple[str, object]]:
    """(path, value) for every value the segments reach; absent attributes reach nothing."""
    if not segments:
        yield prefix, obj
        return
    head, rest = segments[0], segments[1:]
    is_array = head.endswith("[]")
    name = head[:-2] if is_array else head
    value = getattr(obj, name, _MISSING)
    if value is _MISSING or value is None:
        return
    path = f"{prefix}.{name}" if prefix else name
    if not is_array:
        yield from _walk(value, rest, path)
        return
    if not isinstance(value, tuple | list):
        return
    for index, item in enumerate(value):
        yield from _walk(item, rest, f"{path}[{index}]")


def _kind_for(rule: FieldRule, body: object) -> IdentifierKind | None:
    if rule.selector is None:
        return rule.kind
    attr, kinds = rule.selector
    selected = getattr(body, attr, 0)
    return kinds.get(selected) if isinstance(selected, int) else None


def check_transactional_id(transactional_id: str | None, limits: IdentifierLimits) -> Breach | None:
    """Produce's transactional id, peeked by the shell without decoding the body (hot path)."""
    if not limits.enabled or transactional_id is None:
        return None
    return _check_value(IdentifierKind.TRANSACTIONAL_ID, "transactional_id", transactional_id, limits)


def check_client_id(client_id: str | None, limits: IdentifierLimits) -> Breach | None:
    """The request header's client id (every request has one)."""
    if not limits.enabled or client_id is None:
        return None
    return _check_value(IdentifierKind.CLIENT_ID, "header.client_id", client_id, limits)


def check_request(
    api_key: int,
    api_version: int,
    body: object,
    client_id: str | None,
    limits: IdentifierLimits,
) -> list[Breach]:
    """Every identifier over its limit in one request: header client id first, then body fields in table order."""
    if not limits.enabled:
        return []
    breaches: list[Breach] = []
    header = check_client_id(client_id, limits)
    if header is not None:
        breaches.append(header)
    for kind, path, value in _identifiers_at(api_key, api_version, body):
        breach = _check_value(kind, path, value, limits)
        if breach is not None:
            breaches.append(breach)
    return breaches


def identifiers(api_key: int, api_version: int, body: object) -> Iterator[tuple[IdentifierKind, str]]:
    """Every identifier of the kinds this policy checks in one request body, as (kind, value):
    what an observation window records so that a limit never configured can be weighed."""
    for kind, _, value in _identifiers_at(api_key, api_version, body):
        yield kind, value


def _identifiers_at(api_key: int, api_version: int, body: object) -> Iterator[tuple[IdentifierKind, str, str]]:
    """(kind, path, value) of every identifier in the body, in table order."""
    for rule in IDENTIFIER_FIELDS.get(api_key, ()):
        if not rule.applies_to(api_version):
            continue
        kind = _kind_for(rule, body)
        if kind is None:
            continue
        for path, value in _walk(body, tuple(rule.path.split(".")), ""):
            if isinstance(value, str):
                yield kind, path, value


def decide(
    breaches: list[Breach],
    mode: Mode,
    *,
    expects_response: bool = True,
) -> Decision | None:
    """The decision on a request with these breaches (None: admit).

    Kafka answers such a request with an error response for the breaching elements
    (their own codes; the rest of the request gets the first breach's). A client id
    over the limit taints every later request of the connection, so the connection is
    closed once the answer is written; a request that expects no response (Produce
    with acks=0) cannot be answered, so its connection is closed at once.
    """
    if not breaches:
        return None
    first = breaches[0]
    subject = {
        "identifier_kind": first.kind.name.lower(),
        "identifier_length": first.length,
        "identifier": first.value[:IDENTIFIER_KEPT],
        "breaches": [
            {"kind": b.kind.name.lower(), "path": b.path, "length": b.length, "limit": b.limit} for b in breaches
        ],
    }
    if not expects_response:
        return Decision(
            Policy.IDENTIFIER_LIMITS,
            Action.CLOSE,
            mode,
            LIMIT_KEYS[first.kind],
            first.message,
            limit=first.limit,
            subject=subject,
        )
    return Decision(
        Policy.IDENTIFIER_LIMITS,
        Action.REFUSE,
        mode,
        LIMIT_KEYS[first.kind],
        first.message,
        limit=first.limit,
        error_code=first.error_code,
        close_after=any(b.kind is IdentifierKind.CLIENT_ID for b in breaches),
        element_errors={b.element_path: (b.error_code, b.message) for b in breaches if b.element_path},
        subject=subject,
    )


def checked_api_keys() -> frozenset[int]:
    """The APIs whose bodies carry identifiers (the shell decodes only these)."""
    return frozenset(IDENTIFIER_FIELDS)


__all__ = [
    "CONFIG_KEYS",
    "IDENTIFIER_FIELDS",
    "INVALID_REQUEST",
    "INVALID_TOPIC_EXCEPTION",
    "OFFSET_METADATA_TOO_LARGE",
    "Breach",
    "BreachReason",
    "FieldRule",
    "IdentifierLimits",
    "check_client_id",
    "check_request",
    "check_transactional_id",
    "checked_api_keys",
    "decide",
    "identifiers",
    "java_length",
]
