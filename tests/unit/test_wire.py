"""Header peeks and Produce acks on kio-encoded requests: bodies stay undecoded."""

import datetime

import pytest
from kio.index import load_request_schema

from proxy import wire


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
    assert wire.produce_acks(frame, version) == acks
    header = wire.peek_request_header(frame)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        0, version, 42, "producer-1"
    )


@pytest.mark.parametrize("version", [0, 2])
def test_produce_acks_of_versions_older_than_the_codec_are_found(version: int) -> None:
    # kio knows Produce from v3 only; v0-2 start their body with acks (int16).
    from kio.schema.request_header.v1.header import RequestHeader

    header = RequestHeader(request_api_key=0, request_api_version=version, correlation_id=1, client_id="c")
    frame = wire.encode_frame(header)
    body = (0).to_bytes(2, "big") + (1000).to_bytes(4, "big") + (0).to_bytes(4, "big")
    frame = (len(frame) - 4 + len(body)).to_bytes(4, "big") + frame[4:] + body
    assert wire.produce_acks(frame, version) == 0


def test_null_transactional_id_is_skipped() -> None:
    assert wire.produce_acks(produce_frame(9, 0, transactional_id=None), 9) == 0


def test_null_client_id_is_peeked_as_none() -> None:
    schema = load_request_schema(3, 1)
    frame = wire.encode_frame(wire.request_header_for(3, 1, 5, None), schema(topics=None))
    assert wire.peek_request_header(frame).client_id is None


def test_a_frame_too_short_for_a_header_is_malformed() -> None:
    with pytest.raises(wire.MalformedFrame):
        wire.peek_request_header(b"\0\0\0\3\0\1\0")


def test_response_correlation_id_is_read_without_decoding() -> None:
    assert wire.response_correlation_id(b"\0\0\0\x08\0\0\x01\x00rest") == 256
