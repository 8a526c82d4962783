"""The guard in front of kio: every valid frame of every API and version passes it,
and a count or length that promises more than the frame holds is refused (Kafka's
KAFKA-14063 rule) before kio can reserve memory for it."""

from __future__ import annotations

import dataclasses
from typing import Any, get_type_hints

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.static.primitive import i32

from proxy import wire
from proxy.count_guard import CountTooLarge, check_counts
from tests.kio_entities import make_entity, unwrap_optional

SCHEMAS = [
    (api_key, version, response)
    for api_key, name in sorted(api_key_map.items())
    for version in sorted(schema_name_map[name])
    for response in (False, True)
]


def schema_of(api_key: int, version: int, response: bool) -> Any:
    return (load_response_schema if response else load_request_schema)(api_key, version)


def frame_of(api_key: int, version: int, response: bool, body: Any) -> bytes:
    schema = schema_of(api_key, version, response)
    header = (
        schema.__header_schema__(correlation_id=i32(7))
        if response
        else wire.request_header_for(api_key, version, 7, "client-1")
    )
    return wire.encode_frame(header, body)


def with_nulls(entity: Any) -> Any:
    """The same entity with every nullable struct and array set to null."""
    hints = get_type_hints(type(entity))
    changes = {f.name: None for f in dataclasses.fields(entity) if unwrap_optional(hints[f.name])[1]}
    return dataclasses.replace(entity, **changes)


@pytest.mark.parametrize(("api_key", "version", "response"), SCHEMAS)
def test_every_valid_frame_of_every_api_and_version_passes(api_key: int, version: int, response: bool) -> None:
    schema = schema_of(api_key, version, response)
    full = make_entity(schema, {})
    for body in (full, with_nulls(full)):
        frame = frame_of(api_key, version, response, body)
        check_counts(schema.__header_schema__, schema, frame)


def test_a_join_group_claiming_four_billion_protocols_is_refused_before_kio_reads_it() -> None:
    schema = load_request_schema(11, 6)
    protocol = type(make_entity(schema, {}).protocols[0])
    body = dataclasses.replace(make_entity(schema, {}), protocols=(protocol(name="PROTO", metadata=b"m"),))
    frame = frame_of(11, 6, False, body)
    at = frame.index(b"\x02\x06PROTO")  # compact array of one protocol (count + 1), then its name
    hostile = frame[:at] + b"\xff\xff\xff\xff\x0f" + frame[at + 1 :]
    hostile = (len(hostile) - 4).to_bytes(4, "big") + hostile[4:]
    with pytest.raises(CountTooLarge, match="an array of 4294967294 elements"):
        check_counts(schema.__header_schema__, schema, hostile)
    with pytest.raises(wire.MalformedFrame):
        wire.decode_request(hostile, 11, 6)


@pytest.mark.parametrize("claimed", [2**31 - 1, 70_000])
def test_a_legacy_array_count_beyond_the_frame_is_refused(claimed: int) -> None:
    schema = load_request_schema(15, 0)  # DescribeGroups v0: one legacy array of group ids
    body = schema(groups=("g",))
    frame = frame_of(15, 0, False, body)
    count_at = len(frame) - 3 - 4  # int32 count, then int16 length and "g"
    hostile = frame[:count_at] + claimed.to_bytes(4, "big") + frame[count_at + 4 :]
    with pytest.raises(CountTooLarge):
        check_counts(schema.__header_schema__, schema, hostile)


def test_a_string_longer_than_the_frame_is_refused() -> None:
    schema = load_request_schema(15, 0)
    frame = frame_of(15, 0, False, schema(groups=("g",)))
    hostile = frame[:-3] + (30_000).to_bytes(2, "big") + b"g"
    with pytest.raises(CountTooLarge, match="a field of 30000 bytes"):
        check_counts(schema.__header_schema__, schema, hostile)
