"""Kafka wire helpers on top of kio: peek request headers, find Produce's acks,
decode and re-encode the few responses the proxy must change.

Bodies are decoded only for the APIs that need it; everything else is bytes.
A frame here is the whole thing on the wire, 4-byte length prefix included.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from kio._kio_native import (
    read_compact_string_nullable,
    read_int16,
    read_int32,
    read_nullable_legacy_string,
)
from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32

PRODUCE = 0
FETCH = 1
METADATA = 3
FIND_COORDINATOR = 10
API_VERSIONS = 18
DESCRIBE_CLUSTER = 60


class MalformedFrame(Exception):
    """A frame that does not parse as a Kafka request or response."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def api_name(api_key: int) -> str:
    return api_key_map.get(api_key, "unknown")


def max_known_version(api_key: int) -> int | None:
    """The newest version of an API that kio (and so this proxy) can decode."""
    name = api_key_map.get(api_key)
    if name is None:
        return None
    return max(schema_name_map[name])


def peek_request_header(frame: bytes) -> RequestHeader:
    """Header fields at fixed positions (request header v1/v2); the body is untouched."""
    try:
        api_key, _ = read_int16(frame, 4)
        api_version, _ = read_int16(frame, 6)
        correlation_id, _ = read_int32(frame, 8)
        client_id, _ = read_nullable_legacy_string(frame, 12)
    except Exception as exc:  # kio raises on short or invalid buffers
        raise MalformedFrame(f"request header does not parse: {exc}") from None
    return RequestHeader(api_key, api_version, correlation_id, client_id)


def response_correlation_id(frame: bytes) -> int:
    try:
        value, _ = read_int32(frame, 4)
    except Exception as exc:
        raise MalformedFrame(f"response too short for a correlation id: {exc}") from None
    return int(value)


# Produce became flexible (request header v2, compact strings) at v9.
_PRODUCE_FIRST_FLEXIBLE = 9


def produce_head(frame: bytes, api_version: int) -> tuple[str | None, int]:
    """(transactional id, acks) of a Produce request: its first fields, nothing else read."""
    flexible = api_version >= _PRODUCE_FIRST_FLEXIBLE
    header_schema = RequestHeaderV2 if flexible else RequestHeaderV1
    transactional_id = None
    try:
        _, size = entity_reader(header_schema)(frame, 4)
        offset = 4 + size
        if flexible:
            transactional_id, size = read_compact_string_nullable(frame, offset)
            offset += size
        elif api_version >= 3:
            transactional_id, size = read_nullable_legacy_string(frame, offset)
            offset += size
        acks, _ = read_int16(frame, offset)
    except Exception as exc:
        raise MalformedFrame(f"produce request does not parse: {exc}") from None
    return transactional_id, int(acks)


def produce_acks(frame: bytes, api_version: int) -> int:
    return produce_head(frame, api_version)[1]


def _decode(frame: bytes, api_key: int, api_version: int, response: bool) -> tuple[Any, Any]:
    """(header, body) of a whole frame, by the kio schema for that API, version and direction."""
    what = "response" if response else "request"
    try:
        schema = (load_response_schema if response else load_request_schema)(api_key, api_version)
        header, hsize = entity_reader(schema.__header_schema__)(frame, 4)
        body, _ = entity_reader(schema)(frame, 4 + hsize)
    except Exception as exc:
        raise MalformedFrame(f"{api_name(api_key)} v{api_version} {what} does not parse: {exc}") from None
    return header, body


def decode_request(frame: bytes, api_key: int, api_version: int) -> Any:
    """The request body as a kio entity (only for the APIs a policy must read)."""
    return _decode(frame, api_key, api_version, response=False)[1]


@dataclass(frozen=True, slots=True)
class DecodedResponse:
    header: Any
    body: Any


def decode_response(frame: bytes, api_key: int, api_version: int) -> DecodedResponse:
    return DecodedResponse(*_decode(frame, api_key, api_version, response=True))


def encode_frame(*entities: Any) -> bytes:
    """A whole frame (length prefix, header, body) from kio entities."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    for entity in entities:
        entity_writer(type(entity))(out, entity)
    frame = out.getbuffer()
    frame[:4] = (len(frame) - 4).to_bytes(4, "big")
    return bytes(frame)


def request_header_for(api_key: int, api_version: int, correlation_id: int, client_id: str | None) -> Any:
    header_cls = load_request_schema(api_key, api_version).__header_schema__
    return header_cls(
        request_api_key=i16(api_key),
        request_api_version=i16(api_version),
        correlation_id=i32(correlation_id),
        client_id=client_id,
    )


__all__ = [
    "API_VERSIONS",
    "DESCRIBE_CLUSTER",
    "FETCH",
    "FIND_COORDINATOR",
    "METADATA",
    "PRODUCE",
    "DecodedResponse",
    "EntityType",
    "MalformedFrame",
    "RequestHeader",
    "api_name",
    "decode_request",
    "decode_response",
    "encode_frame",
    "max_known_version",
    "peek_request_header",
    "produce_acks",
    "produce_head",
    "request_header_for",
    "response_correlation_id",
]
