"""Error responses for any request, built from kio's schemas instead of by hand.

:func:`build_error_response` takes a decoded request entity (any API, any
version) and returns the response entity a broker would send to refuse the
whole request, as Kafka's ``AbstractRequest.getErrorResponse`` does:

* If the response has a top-level ``error_code`` it carries the error (with
  ``error_message`` where the version has one); every collection is empty.
* Otherwise the response's collections mirror the request's (response
  ``results`` <- request ``resources``, ``topics[].partitions[]`` <-
  ``topics[].partitions[]``, ...) down to the first level whose elements have
  an error code: each such element gets the error and the request element's
  identifying fields (names, ids, partition indexes, keys); its own
  collections stay empty.
* Every other field takes its schema default, else Kafka's "unknown" value
  for a few fields (``node_id``, ``port``, ``producer_id``, offsets: -1),
  else zero / empty / ``None`` (nullable).

Response collections are matched to request collections by name: the
per-API table ``_COLLECTION_SOURCES`` where the names share nothing, then the
same name, then shared name words (``filter_results`` <- ``filters``,
``partition_responses`` <- ``partition_data``), then the one collection left.
A response that can carry an error only through a collection with no request
counterpart raises :class:`UnsupportedErrorResponse` rather than answer with
what would read as success.

``element_errors`` gives single request elements their own error, keyed by
request path as the identifier policy writes it (``"groups[1]"``,
``"topics[0].partitions[2]"``); an element inherits its nearest ancestor's
entry, and a level that carries the error for several elements (a top-level
``error_code``) takes the first entry found beneath it.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import uuid
from collections.abc import Mapping
from functools import cache
from typing import Any, Union, get_args, get_origin, get_type_hints

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.static.primitive import f64, i32, i32Timedelta, i64Timedelta

from policies.api_keys import JOIN_GROUP
from proxy.protocol.wire import encode_frame

__all__ = [
    "ElementError",
    "UnsupportedErrorResponse",
    "build_error_frame",
    "build_error_response",
    "response_header_for",
]

ElementError = tuple[int, str | None]
"""(error code, error message) for one request element."""


class UnsupportedErrorResponse(Exception):
    """The response schema has no place for an error that mirrors this request."""


# Response collection -> request collection, per API key, where the names share nothing.
_COLLECTION_SOURCES: Mapping[tuple[int, str], str] = {
    (0, "responses"): "topic_data",  # Produce
    (30, "results"): "creations",  # CreateAcls
    (32, "results"): "resources",  # DescribeConfigs
    (33, "responses"): "resources",  # AlterConfigs
    (42, "results"): "groups_names",  # DeleteGroups
    (44, "responses"): "resources",  # IncrementalAlterConfigs
    (65, "transaction_states"): "transactional_ids",  # DescribeTransactions
}

# Fields Kafka fills with -1 ("unknown") in error responses when the schema gives no default.
_MINUS_ONE_FIELDS = frozenset(
    {
        "node_id",
        "port",
        "leader_id",
        "leader_epoch",
        "generation_id",
        "producer_id",
        "producer_epoch",
        "committed_offset",
        "base_offset",
        "log_start_offset",
    }
)

# Fields an API's error response sets whatever the request said (Kafka's getErrorResponse).
_ERROR_RESPONSE_FIELDS: Mapping[int, Mapping[str, Any]] = {
    JOIN_GROUP: {"member_id": ""},  # JoinGroup: a refused member gets no member id (UNKNOWN_MEMBER_ID)
}

# Name words that say "collection of" rather than what is in it.
_FILLER_WORDS = frozenset(
    {"by", "and", "below", "v3", "data", "names", "ids", "indexes", "keys"}
    | {"results", "responses", "result", "response"}
)

_INT_TYPES = frozenset({"int8", "int16", "int32", "int64", "uint16"})


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    name: str
    kafka_type: str
    base: Any  # the element / value type, unwrapped from Optional and tuple
    nullable: bool
    array: bool
    entity: bool
    tagged: bool
    default: Any  # dataclasses.MISSING when none


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (types.UnionType, Union):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(get_args(tp)) == 2:
            return args[0], True
    return tp, False


@cache
def _fields(cls: type) -> tuple[_Field, ...]:
    hints = get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp, nullable = _unwrap_optional(hints[f.name])
        array = get_origin(tp) is tuple
        base = get_args(tp)[0] if array else tp
        if array:
            base, _ = _unwrap_optional(base)
        default: Any = f.default
        factory: Any = f.default_factory
        if default is dataclasses.MISSING and factory is not dataclasses.MISSING:
            default = factory()
        out.append(
            _Field(
                name=f.name,
                kafka_type=f.metadata.get("kafka_type", ""),
                base=base,
                nullable=nullable,
                array=array,
                entity=dataclasses.is_dataclass(base),
                tagged="tag" in f.metadata,
                default=default,
            )
        )
    return tuple(out)


def _error_field(cls: type) -> _Field | None:
    """The field that carries an element's error: ``error_code``, else one like ``partition_error_code``."""
    codes = [f for f in _fields(cls) if f.kafka_type == "error_code" and not f.array]
    for f in codes:
        if f.name == "error_code":
            return f
    for f in codes:
        if f.default is dataclasses.MISSING:
            return f
    return codes[0] if codes else None


def _message_field(cls: type) -> _Field | None:
    return next((f for f in _fields(cls) if f.name == "error_message" and not f.array), None)


@cache
def _can_carry_error(cls: type) -> bool:
    if _error_field(cls) is not None:
        return True
    return any(f.array and f.entity and not f.tagged and _can_carry_error(f.base) for f in _fields(cls))


def _zero(f: _Field) -> Any:
    """Value for a field Kafka would leave at its default."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.array:
        return None if f.nullable else ()
    if f.nullable:
        return None
    return _zero_value(f)


def _zero_value(f: _Field) -> Any:
    kafka_type, base = f.kafka_type, f.base
    if f.entity:
        return _default_entity(base)
    if kafka_type in _INT_TYPES:
        return base(-1 if f.name in _MINUS_ONE_FIELDS and kafka_type != "uint16" else 0)
    if kafka_type == "bool":
        return False
    if kafka_type == "string":
        return ""
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type == "uuid":
        return uuid.UUID(int=0)
    if kafka_type == "error_code":
        return ErrorCode.none
    if kafka_type == "float64":
        return f64(0.0)
    if kafka_type == "timedelta_i32":
        return i32Timedelta.parse(datetime.timedelta(0))
    if kafka_type == "timedelta_i64":
        return i64Timedelta.parse(datetime.timedelta(0))
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(0, tz=datetime.UTC)
    raise UnsupportedErrorResponse(f"no default for {f.name} of kafka type {kafka_type!r}")


def _default_entity(cls: type) -> Any:
    return cls(**{f.name: _zero(f) for f in _fields(cls)})


def _is_entity(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _type_of(value: Any) -> type:
    cls: type = type(value)
    return cls


def _is_identifying(name: str) -> bool:
    return name in ("name", "index", "key", "topic") or name.endswith(("_id", "_name", "_index", "_type"))


def _words(name: str) -> frozenset[str]:
    words = set()
    for word in name.split("_"):
        if word in _FILLER_WORDS:
            continue
        words.add(word[:-1] if len(word) > 3 and word.endswith("s") else word)
    return frozenset(words)


def _request_collections(request: Any) -> dict[str, _Field]:
    if not _is_entity(request):
        return {}
    return {f.name: f for f in _fields(_type_of(request)) if f.array}


def _source_collection(api_key: int, response_field: str, request: Any, taken: set[str]) -> _Field | None:
    candidates = {name: f for name, f in _request_collections(request).items() if name not in taken}
    override = _COLLECTION_SOURCES.get((api_key, response_field))
    if override is not None and override in candidates:
        return candidates[override]
    if response_field in candidates:
        return candidates[response_field]
    wanted = _words(response_field)
    scored = sorted(((len(wanted & _words(name)), name) for name in candidates), reverse=True)
    if scored and scored[0][0] > 0 and (len(scored) == 1 or scored[1][0] < scored[0][0]):
        return candidates[scored[0][1]]
    if len(candidates) == 1:
        return next(iter(candidates.values()))
    return None


@dataclasses.dataclass(slots=True)
class _Context:
    api_key: int
    code: int
    message: str | None
    element_errors: Mapping[str, ElementError]

    def error_at(self, path: str) -> ElementError:
        """Own or nearest ancestor's entry; else the first entry beneath; else the request's error."""
        probe = path
        while True:
            if probe in self.element_errors:
                return self.element_errors[probe]
            if not probe:
                break
            cut = probe.rfind(".")
            probe = probe[:cut] if cut >= 0 else ""
        for key in sorted(self.element_errors):
            if not path or key.startswith(path + "."):
                return self.element_errors[key]
        return self.code, self.message


def _error_code(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        raise UnsupportedErrorResponse(f"error code {code} is unknown to kio, so cannot be encoded") from None


def _build(cls: type, request: Any, path: str, ctx: _Context, top: bool) -> Any:
    fields = _fields(cls)
    error_field = _error_field(cls)
    values: dict[str, Any] = {}
    if error_field is not None:
        code, message = ctx.error_at(path)
        message_field = _message_field(cls)
        values[error_field.name] = _error_code(code)
        if message_field is not None:
            values[message_field.name] = message
        for f in fields:
            if f.name in values:
                continue
            values[f.name] = _zero(f) if top else _copied_or_zero(f, request, fields)
        return cls(**values)

    taken: set[str] = set()
    for f in fields:
        if f.array and f.entity and not f.tagged and _can_carry_error(f.base):
            source = _source_collection(ctx.api_key, f.name, request, taken)
            if source is None:
                raise UnsupportedErrorResponse(
                    f"{cls.__name__}.{f.name} carries errors but no request collection matches it"
                )
            taken.add(source.name)
            items = getattr(request, source.name) or ()
            prefix = f"{path}.{source.name}" if path else source.name
            values[f.name] = tuple(
                _build(f.base, item, f"{prefix}[{index}]", ctx, top=False) for index, item in enumerate(items)
            )
        else:
            values[f.name] = _zero(f) if top else _copied_or_zero(f, request, fields)
    return cls(**values)


def _copied_or_zero(f: _Field, request: Any, fields: tuple[_Field, ...]) -> Any:
    """A response element's field from its request element when it identifies the element."""
    if f.array or f.entity or not _is_identifying(f.name):
        return _zero(f)
    if _is_entity(request):
        source = next((s for s in _fields(_type_of(request)) if s.name == f.name), None)
        if source is not None and not source.array and source.kafka_type == f.kafka_type:
            value = getattr(request, f.name)
            if value is not None or f.nullable:
                return value
        return _zero(f)
    # A primitive request element (a group id, a coordinator key, a partition index)
    # fills the response element's first identifying field of its kind.
    kind = "string" if isinstance(request, str) else "int32" if isinstance(request, int) else None
    first = next(
        (
            g
            for g in fields
            if _is_identifying(g.name) and not g.array and g.kafka_type == kind and g.name != "error_message"
        ),
        None,
    )
    return request if first is not None and first.name == f.name else _zero(f)


def build_error_response(
    request: Any,
    error_code: int,
    message: str | None = None,
    *,
    element_errors: Mapping[str, ElementError] | None = None,
) -> Any:
    """The response entity refusing ``request`` (a kio request entity) with ``error_code``."""
    api_key, version = int(request.__api_key__), int(request.__version__)
    response_cls = load_response_schema(api_key, version)
    if not _can_carry_error(response_cls):
        raise UnsupportedErrorResponse(f"{response_cls.__name__} has no error code field")
    ctx = _Context(api_key, error_code, message, element_errors or {})
    response = _build(response_cls, request, "", ctx, top=True)
    fixed = _ERROR_RESPONSE_FIELDS.get(api_key)
    return dataclasses.replace(response, **fixed) if fixed else response


def response_header_for(api_key: int, api_version: int, correlation_id: int) -> Any:
    """The response header (v0 or v1, as the API version needs) for a correlation id."""
    header_cls = load_response_schema(api_key, api_version).__header_schema__
    return header_cls(correlation_id=i32(correlation_id))


def build_error_frame(
    request_header: Any,
    request_body: Any,
    error_code: int,
    message: str | None = None,
    *,
    element_errors: Mapping[str, ElementError] | None = None,
    throttle_ms: int = 0,
) -> bytes:
    """A whole response frame (length prefix, header, body) refusing the request.

    ``request_header`` is anything with ``correlation_id`` (``wire.RequestHeader``
    or a kio request header). A Produce request with ``acks=0`` expects no
    response at all: Kafka closes the connection instead, and so should the caller.
    """
    response = build_error_response(request_body, error_code, message, element_errors=element_errors)
    if throttle_ms and hasattr(response, "throttle_time"):
        response = dataclasses.replace(response, throttle_time=datetime.timedelta(milliseconds=throttle_ms))
    header_key = getattr(request_header, "api_key", getattr(request_header, "request_api_key", None))
    header_version = getattr(request_header, "api_version", getattr(request_header, "request_api_version", None))
    if (header_key, header_version) not in ((None, None), (response.__api_key__, response.__version__)):
        raise ValueError(
            f"header says api {header_key} v{header_version}, "
            f"body is api {response.__api_key__} v{response.__version__}"
        )
    header = response_header_for(int(response.__api_key__), int(response.__version__), request_header.correlation_id)
    return encode_frame(header, response)
