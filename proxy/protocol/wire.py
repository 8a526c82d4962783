"""Kafka wire helpers on top of kio: peek a request's header and Produce's first
fields at fixed offsets (the hot path: no entity is built), and decode and
re-encode the few bodies a policy must read or change.

A frame here is the whole thing on the wire, 4-byte length prefix included; the
peeks read it in place, as ``(buffer, start)`` with ``start`` at its prefix.
"""

from __future__ import annotations

import functools
import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kio._kio_native import read_compact_string_nullable, read_nullable_legacy_string, read_unsigned_varint
from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from proxy.protocol.count_guard import MAX_TAGGED_FIELDS, check_counts

# What a receive gives, or a frame gathered across receives (a read-only view: kio reads only those);
# frames are read in place.
Received = bytes | bytearray | memoryview
_HEAD = struct.Struct(">hhi")  # api_key, api_version, correlation_id: request header v1/v2 after the prefix
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
# Produce became flexible (request header v2, compact strings) at v9; transactional ids came at v3.
_PRODUCE_FIRST_FLEXIBLE = 9
_PRODUCE_FIRST_TRANSACTIONAL = 3


class MalformedFrame(Exception):
    """A frame that does not parse as a Kafka request or response."""


def api_name(api_key: int) -> str:
    return api_key_map.get(api_key, "unknown")


@functools.cache  # asked per API entry of every ApiVersions response the proxy rewrites
def max_known_version(api_key: int) -> int | None:
    """The newest version of an API that kio (and so this proxy) can decode."""
    name = api_key_map.get(api_key)
    if name is None:
        return None
    return max(schema_name_map[name])


def codec_knows(api_key: int, api_version: int) -> bool:
    """kio has a schema for this version (not only one at least as new: Kafka 4 dropped old ones)."""
    name = api_key_map.get(api_key)
    return name is not None and api_version in schema_name_map[name]


def known_versions() -> Iterator[tuple[int, int]]:
    """Every (API key, version) kio can decode: about 300, a bounded set."""
    for api_key, name in api_key_map.items():
        for api_version in schema_name_map[name]:
            yield api_key, api_version


def peek_head(buf: Received, start: int) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of the request frame at ``start``."""
    try:
        api_key, api_version, correlation_id = _HEAD.unpack_from(buf, start + 4)
        return api_key, api_version, correlation_id
    except struct.error:
        raise MalformedFrame("request too short for a request header") from None


def peek_client_id(buf: Received, start: int) -> str | None:
    """The request header's client id (a nullable string, in header v1 and v2 alike)."""
    try:
        return read_nullable_legacy_string(buf, start + 12)[0]
    except Exception as exc:  # kio raises on short or invalid buffers
        raise MalformedFrame(f"request header's client id does not parse: {exc}") from None


def produce_head(buf: Received, start: int, api_version: int) -> tuple[str | None, int]:
    """(transactional id, acks) of the Produce request at ``start``: its first fields,
    read in place; the records are never touched."""
    flexible = api_version >= _PRODUCE_FIRST_FLEXIBLE
    transactional_id = None
    try:
        (size,) = _INT32.unpack_from(buf, start)
        end = start + 4 + size  # the frame's own length: nothing past it is read
        # The body begins after the client id, and in header v2 after the tagged fields too (a
        # count the client sends: at most MAX_TAGGED_FIELDS of them, each inside the frame).
        # Found here, not by a helper: this runs per Produce.
        (length,) = _INT16.unpack_from(buf, start + 12)
        offset = start + 14 + max(length, 0)
        if flexible:
            count, size = read_unsigned_varint(buf, offset)
            offset += size
            if count > MAX_TAGGED_FIELDS:
                raise MalformedFrame(f"{count} tagged fields in a request header (at most {MAX_TAGGED_FIELDS})")
            for _ in range(count):
                _, size = read_unsigned_varint(buf, offset)  # tag
                offset += size
                field_size, size = read_unsigned_varint(buf, offset)
                offset += size + field_size
                if offset > end:
                    break
        if offset > end:
            raise MalformedFrame("request header runs past the end of its frame")
        if flexible:
            transactional_id, size = read_compact_string_nullable(buf, offset)
            offset += size
        elif api_version >= _PRODUCE_FIRST_TRANSACTIONAL:
            transactional_id, size = read_nullable_legacy_string(buf, offset)
            offset += size
        if offset + 2 > end:
            raise MalformedFrame("no acks before the end of the frame")
        (acks,) = _INT16.unpack_from(buf, offset)
    except Exception as exc:
        raise MalformedFrame(f"produce request does not parse: {exc}") from None
    return transactional_id, acks


def response_correlation_id(buf: Received, start: int) -> int:
    try:
        value: int = _INT32.unpack_from(buf, start + 4)[0]
    except struct.error:
        raise MalformedFrame("response too short for a correlation id") from None
    return value


def _decode(frame: bytes, api_key: int, api_version: int, response: bool) -> tuple[Any, Any]:
    """(header, body) of a whole frame, by the kio schema for that API, version and direction."""
    what = "response" if response else "request"
    try:
        schema = (load_response_schema if response else load_request_schema)(api_key, api_version)
        check_counts(schema.__header_schema__, schema, frame, request=not response)  # before kio, which trusts them
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


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """A request's header fields, for building answers to it."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def read_request_header(frame: bytes) -> RequestHeader:
    """The header of a whole request frame (tests and cold paths)."""
    api_key, api_version, correlation_id = peek_head(frame, 0)
    return RequestHeader(api_key, api_version, correlation_id, peek_client_id(frame, 0))
