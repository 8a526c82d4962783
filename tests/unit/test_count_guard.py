"""The guard in front of kio: every valid frame of every API and version passes it,
and a count or length that promises more than the frame holds is refused (Kafka's
KAFKA-14063 rule) before kio can reserve memory for it."""

from __future__ import annotations

import dataclasses
import gc
import tracemalloc
from typing import Any, get_type_hints

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.static.primitive import i32

from proxy.protocol import wire
from proxy.protocol.count_guard import MAX_REQUEST_ELEMENTS, MAX_TAGGED_FIELDS, CountTooLarge, check_counts
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
        check_counts(schema.__header_schema__, schema, frame, request=not response)


def test_a_join_group_claiming_four_billion_protocols_is_refused_before_kio_reads_it() -> None:
    schema = load_request_schema(11, 6)
    protocol = type(make_entity(schema, {}).protocols[0])
    body = dataclasses.replace(make_entity(schema, {}), protocols=(protocol(name="PROTO", metadata=b"m"),))
    frame = frame_of(11, 6, False, body)
    at = frame.index(b"\x02\x06PROTO")  # compact array of one protocol (count + 1), then its name
    hostile = frame[:at] + b"\xff\xff\xff\xff\x0f" + frame[at + 1 :]
    hostile = (len(hostile) - 4).to_bytes(4, "big") + hostile[4:]
    with pytest.raises(CountTooLarge, match="an array of 4294967294 elements"):
        check_counts(schema.__header_schema__, schema, hostile, request=True)
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
        check_counts(schema.__header_schema__, schema, hostile, request=True)


def test_a_string_longer_than_the_frame_is_refused() -> None:
    schema = load_request_schema(15, 0)
    frame = frame_of(15, 0, False, schema(groups=("g",)))
    hostile = frame[:-3] + (30_000).to_bytes(2, "big") + b"g"
    with pytest.raises(CountTooLarge, match="a field of 30000 bytes"):
        check_counts(schema.__header_schema__, schema, hostile, request=True)


def join_group(protocols: int, version: int = 9) -> tuple[Any, bytes]:
    """A JoinGroup of ``protocols`` 3-byte protocols (empty name and metadata, no tags)."""
    schema = load_request_schema(11, version)
    base = make_entity(schema, {})
    protocol = type(base.protocols[0])(name="", metadata=b"")
    return schema, frame_of(11, version, False, dataclasses.replace(base, protocols=(protocol,) * protocols))


def test_a_request_may_build_at_most_max_request_elements() -> None:
    schema, frame = join_group(MAX_REQUEST_ELEMENTS)
    assert check_counts(schema.__header_schema__, schema, frame, request=True) == MAX_REQUEST_ELEMENTS
    schema, frame = join_group(MAX_REQUEST_ELEMENTS + 1)  # 300 KB: Kafka's rule alone lets it by
    with pytest.raises(CountTooLarge, match="an array of 100001 where 100000 more elements are allowed"):
        check_counts(schema.__header_schema__, schema, frame, request=True)
    with pytest.raises(wire.MalformedFrame):
        wire.decode_request(frame, 11, 9)
    # A response (the broker describing its cluster) keeps Kafka's rule alone.
    assert check_counts(schema.__header_schema__, schema, frame, request=False) == MAX_REQUEST_ELEMENTS + 1


def test_elements_are_counted_across_nested_arrays() -> None:
    schema = load_request_schema(8, 9)  # OffsetCommit: topics, each with partitions
    base = make_entity(schema, {})
    topic = base.topics[0]
    half = MAX_REQUEST_ELEMENTS // 2
    body = dataclasses.replace(base, topics=(dataclasses.replace(topic, partitions=topic.partitions[:1] * half),) * 2)
    frame = frame_of(8, 9, False, body)
    with pytest.raises(CountTooLarge, match="more elements are allowed in this frame"):
        check_counts(schema.__header_schema__, schema, frame, request=True)  # 2 + 2 x 50,000


def test_a_struct_with_more_tagged_fields_than_any_schema_is_refused() -> None:
    schema = load_request_schema(12, 4)  # Heartbeat v4: flexible, no arrays
    frame = frame_of(12, 4, False, make_entity(schema, {}))
    assert frame[-1] == 0  # the body's tagged fields: none
    tags = b"".join(bytes([tag, 0]) for tag in range(MAX_TAGGED_FIELDS + 1))  # unknown tags, empty
    hostile = frame[:-1] + bytes([MAX_TAGGED_FIELDS + 1]) + tags
    hostile = (len(hostile) - 4).to_bytes(4, "big") + hostile[4:]
    with pytest.raises(CountTooLarge, match=f"{MAX_TAGGED_FIELDS + 1} tagged fields in one struct"):
        check_counts(schema.__header_schema__, schema, hostile, request=True)
    allowed = frame[:-1] + bytes([MAX_TAGGED_FIELDS]) + tags[:-2]
    allowed = (len(allowed) - 4).to_bytes(4, "big") + allowed[4:]
    assert check_counts(schema.__header_schema__, schema, allowed, request=True) == MAX_TAGGED_FIELDS


def api_versions_response_with_a_feature() -> tuple[Any, bytes, int]:
    """An ApiVersions v3 response with one supported feature (a tagged array kio decodes),
    and where the feature array's count is."""
    schema = load_response_schema(18, 3)
    module = __import__(schema.__module__, fromlist=["x"])
    body = dataclasses.replace(
        make_entity(schema, {}),
        supported_features=(module.SupportedFeatureKey(name="abc", min_version=1, max_version=2),),
    )
    frame = frame_of(18, 3, True, body)
    at = frame.index(b"\x04abc") - 1
    assert frame[at] == 2  # compact array of one
    return schema, frame, at


def test_a_count_inside_a_tagged_field_kio_decodes_is_checked() -> None:
    # Found while bounding this guard: it skipped known tagged fields, and kio aborted the
    # process (a 34 GB allocation) on this 30-byte ApiVersions response.
    schema, frame, at = api_versions_response_with_a_feature()
    assert check_counts(schema.__header_schema__, schema, frame, request=False) > 0
    hostile = frame[:at] + b"\xff\xff\xff\xff\x0f" + frame[at + 1 :]
    hostile = (len(hostile) - 4).to_bytes(4, "big") + hostile[4:]
    with pytest.raises(CountTooLarge, match="an array of 4294967294 elements"):
        check_counts(schema.__header_schema__, schema, hostile, request=False)
    with pytest.raises(wire.MalformedFrame):
        wire.decode_response(hostile, 18, 3)


def test_a_tagged_field_must_hold_its_value_within_its_size() -> None:
    schema, frame, at = api_versions_response_with_a_feature()
    size_at = at - 1  # the tagged field's size (one varint byte), after its tag 0
    assert frame[size_at - 1] == 0
    for size in (frame[size_at] - 1, frame[size_at] + 1):
        hostile = frame[:size_at] + bytes([size]) + frame[size_at + 1 :]
        with pytest.raises(CountTooLarge, match="field of"):  # too short for its value, or too long
            check_counts(schema.__header_schema__, schema, hostile, request=False)


def costly(entity: Any) -> Any:
    """The element as costly in Python as its wire bytes allow: 2-character strings and
    bytes (1-character ones are cached), large ints, no nested elements."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(entity):
        value = getattr(entity, f.name)
        if isinstance(value, tuple):
            changes[f.name] = ()
        elif isinstance(value, str):
            changes[f.name] = "xy"
        elif isinstance(value, bytes):
            changes[f.name] = b"xy"
        elif type(value) is int and f.metadata.get("kafka_type") in ("int16", "int32", "int64"):
            changes[f.name] = 1000
    return dataclasses.replace(entity, **changes)


# The costliest elements per wire byte and per element, over every array of every request
# API and version the proxy decodes (measured: 250 bytes an element, 23 a frame byte).
@pytest.mark.parametrize(
    ("api_key", "version", "field"),
    [(11, 9, "protocols"), (30, 3, "creations"), (31, 3, "filters"), (13, 4, "members"), (9, 10, "groups")],
)
def test_decoding_a_request_allocates_within_the_stated_bound(api_key: int, version: int, field: str) -> None:
    """RELIABILITY.md: decoding one request allocates at most 64 KiB + 320 bytes per element
    + 2 bytes per frame byte, and a request holds at most MAX_REQUEST_ELEMENTS elements
    (so at most ~31 MiB + twice the frame)."""
    schema = load_request_schema(api_key, version)
    base = make_entity(schema, {})
    element = costly(getattr(base, field)[0])
    n = MAX_REQUEST_ELEMENTS // 10
    frame = frame_of(api_key, version, False, dataclasses.replace(base, **{field: (element,) * n}))
    elements = check_counts(schema.__header_schema__, schema, frame, request=True)
    assert elements >= n
    gc.collect()
    tracemalloc.start()
    try:
        body = wire.decode_request(frame, api_key, version)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(getattr(body, field)) == n
    assert peak <= 64 * 1024 + 320 * elements + 2 * len(frame), f"{peak / elements:.0f} bytes an element"
