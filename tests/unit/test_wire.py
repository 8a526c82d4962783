"""Header peeks and Produce acks on kio-encoded requests: bodies stay undecoded."""

import datetime

import pytest
from kio.index import load_request_schema

from proxy.protocol import wire


def produce_frame(version: int, acks: int, transactional_id: str | None = "txn-1") -> bytes:
    schema = load_request_schema(0, version)
    kwargs = {"acks": acks, "timeout": datetime.timedelta(seconds=1), "topic_data": ()}
    if version >= 3:
        kwargs["transactional_id"] = transactional_id
    header = wire.request_header_for(0, version, 42, "producer-1")
    return wire.encode_frame(header, schema(**kwargs))


@pytest.mark.parametrize("version", [3, 8, 9, 11])
@pytest.mark.parametrize("acks", [0, 1, -1])
def test_produce_acks_are_found_in_every_version(version: int, acks: int) -> None:
    frame = produce_frame(version, acks)
    assert wire.produce_head(frame, 0, version) == (("txn-1" if version >= 3 else None), acks)
    header = wire.read_request_header(frame)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        0,
        version,
        42,
        "producer-1",
    )


def test_frames_are_read_in_place_at_their_offset_in_a_receive() -> None:
    first, second = produce_frame(8, 1), produce_frame(9, 0)
    received = first + second
    assert wire.peek_head(received, len(first)) == (0, 9, 42)
    assert wire.peek_client_id(received, len(first)) == "producer-1"
    assert wire.produce_head(received, len(first), 9) == ("txn-1", 0)


def test_header_tagged_fields_are_skipped_to_find_acks() -> None:
    # Request header v2 with two tagged fields (tag 0: 3 bytes, tag 5: 1 byte) before the body.
    frame = produce_frame(9, -1)
    client_id_end = 4 + 8 + 2 + len("producer-1")
    assert frame[client_id_end] == 0  # no tagged fields as kio writes it
    tagged = bytes([2, 0, 3]) + b"abc" + bytes([5, 1]) + b"z"
    body = frame[client_id_end + 1 :]
    rebuilt = frame[4:client_id_end] + tagged + body
    rebuilt = len(rebuilt).to_bytes(4, "big") + rebuilt
    assert wire.produce_head(rebuilt, 0, 9) == ("txn-1", -1)


@pytest.mark.parametrize("version", [0, 2])
def test_produce_acks_of_versions_older_than_the_codec_are_found(version: int) -> None:
    # kio knows Produce from v3 only; v0-2 start their body with acks (int16).
    from kio.schema.request_header.v1.header import RequestHeader

    header = RequestHeader(request_api_key=0, request_api_version=version, correlation_id=1, client_id="c")
    frame = wire.encode_frame(header)
    body = (0).to_bytes(2, "big") + (1000).to_bytes(4, "big") + (0).to_bytes(4, "big")
    frame = (len(frame) - 4 + len(body)).to_bytes(4, "big") + frame[4:] + body
    assert wire.produce_head(frame, 0, version) == (None, 0)


def test_null_transactional_id_is_skipped() -> None:
    assert wire.produce_head(produce_frame(9, 0, transactional_id=None), 0, 9) == (None, 0)


def test_null_client_id_is_peeked_as_none() -> None:
    schema = load_request_schema(3, 1)
    frame = wire.encode_frame(wire.request_header_for(3, 1, 5, None), schema(topics=None))
    assert wire.peek_client_id(frame, 0) is None


def test_a_frame_too_short_for_a_header_is_malformed() -> None:
    with pytest.raises(wire.MalformedFrame):
        wire.peek_head(b"\0\0\0\3\0\1\0", 0)
    with pytest.raises(wire.MalformedFrame):
        wire.produce_head(b"\0\0\0\x0a\0\0\0\x09\0\0\0\1\0\x09", 0, 9)


def test_response_correlation_id_is_read_without_decoding() -> None:
    assert wire.response_correlation_id(b"\0\0\0\x08\0\0\x01\x00rest", 0) == 256


def test_the_codec_knows_only_the_versions_it_has_schemas_for() -> None:
    assert wire.codec_knows(3, 12)
    assert not wire.codec_knows(3, -1)  # negative versions are no versions
    assert not wire.codec_knows(0, 2)  # Produce v0-2: gone from Kafka 4's schemas
    assert not wire.codec_knows(1000, 0)
    known = set(wire.known_versions())
    assert (3, 12) in known and (0, 2) not in known
    assert len(known) < 400


def produce_with_header_tags(count: int, tags: bytes) -> bytes:
    """A Produce v9 frame whose header claims ``count`` tagged fields, ``tags`` after the count."""
    frame = produce_frame(9, -1)
    client_id_end = 4 + 8 + 2 + len("producer-1")
    count_bytes = bytearray()
    while True:  # unsigned varint
        count_bytes.append((count & 0x7F) | (0x80 if count > 0x7F else 0))
        count >>= 7
        if not count:
            break
    rebuilt = frame[4:client_id_end] + bytes(count_bytes) + tags + frame[client_id_end + 1 :]
    return len(rebuilt).to_bytes(4, "big") + rebuilt


def test_a_header_claiming_millions_of_tagged_fields_is_refused_at_once() -> None:
    # 50 million 2-byte (tag 0, size 0) fields would be 100 MB of zeros: refused by the count alone.
    frame = produce_with_header_tags(50_000_000, b"\0" * 64)
    with pytest.raises(wire.MalformedFrame, match="50000000 tagged fields in a request header"):
        wire.produce_head(frame, 0, 9)


def test_header_tagged_fields_are_read_only_within_their_frame() -> None:
    # 64 tagged fields are allowed, but this frame ends after 10 of them; the next frame
    # in the same receive (bytes of zeros here) is not read as their continuation.
    frame = produce_with_header_tags(64, b"\0" * 20)[: 4 + 8 + 2 + len("producer-1") + 1 + 20]
    frame = (len(frame) - 4).to_bytes(4, "big") + frame[4:]
    with pytest.raises(wire.MalformedFrame, match="past the end of its frame"):
        wire.produce_head(frame + b"\0" * 1000, 0, 9)


def test_acks_past_the_end_of_the_frame_are_not_read() -> None:
    frame = produce_frame(9, 1)
    acks_at = frame.index(b"txn-1") + len("txn-1")
    cut = frame[:acks_at]
    cut = (len(cut) - 4).to_bytes(4, "big") + cut[4:]
    with pytest.raises(wire.MalformedFrame, match="no acks before the end of the frame"):
        wire.produce_head(cut + frame, 0, 9)  # the next frame's bytes are not its acks
