"""The generic error-response builder: for every identifier field of every request
version kio knows (KIP-1233's table, tests/kip1233_table.py), a breach found by the policy
becomes a response frame that kio decodes with the error where Kafka puts it."""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Iterator
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader

from policies.identifier_limits import IdentifierLimits, check_request
from proxy.protocol import wire
from proxy.protocol.error_responses import (
    UnsupportedErrorResponse,
    build_error_frame,
    build_error_response,
    response_header_for,
)
from tests.kio_entities import IDENTIFIER_RULE_CASES, encode, make_request

ON = IdentifierLimits(enabled=True)


# --------------------------- where Kafka puts the error, written out per API (not derived)

TOP = "error_code"


def placement(api_key: int, version: int) -> tuple[str, dict[str, str]]:
    """(error code path pattern in the response, {response id path: request id path})."""
    per_partition_commit = (
        "topics[].partitions[].error_code",
        {"topics[1].partitions[1].partition_index": "topics[1].partitions[1].partition_index"},
    )
    share_state = (  # the share coordinator's state APIs have no top-level error
        "results[].partitions[].error_code",
        {
            "results[1].topic_id": "topics[1].topic_id",
            "results[1].partitions[1].partition": "topics[1].partitions[1].partition",
        },
    )
    table: dict[int, tuple[str, dict[str, str]]] = {
        0: (
            "responses[].partition_responses[].error_code",
            {
                "responses[1].partition_responses[1].index": "topic_data[1].partition_data[1].index",
                **({"responses[1].name": "topic_data[1].name"} if version < 13 else {}),
            },
        ),
        8: per_partition_commit,
        28: per_partition_commit,
        15: ("groups[].error_code", {"groups[1].group_id": "groups[1]"}),
        19: ("topics[].error_code", {"topics[1].name": "topics[1].name"}),
        30: ("results[].error_code", {}),
        31: ("filter_results[].error_code", {}),
        32: (
            "results[].error_code",
            {
                "results[1].resource_name": "resources[1].resource_name",
                "results[1].resource_type": "resources[1].resource_type",
            },
        ),
        33: ("responses[].error_code", {"responses[1].resource_name": "resources[1].resource_name"}),
        44: ("responses[].error_code", {"responses[1].resource_name": "resources[1].resource_name"}),
        42: ("results[].error_code", {"results[1].group_id": "groups_names[1]"}),
        65: ("transaction_states[].error_code", {"transaction_states[1].transactional_id": "transactional_ids[1]"}),
        69: ("groups[].error_code", {"groups[1].group_id": "group_ids[1]"}),
        77: ("groups[].error_code", {"groups[1].group_id": "group_ids[1]"}),
        **dict.fromkeys((83, 84, 85, 86, 87), share_state),
        89: ("groups[].error_code", {"groups[1].group_id": "group_ids[1]"}),
        90: ("groups[].error_code", {"groups[1].group_id": "groups[1].group_id"}),
    }
    if api_key == 9:  # OffsetFetch
        if version < 2:
            return (
                "topics[].partitions[].error_code",
                {
                    "topics[1].name": "topics[1].name",
                    "topics[1].partitions[1].partition_index": "topics[1].partition_indexes[1]",
                },
            )
        if version < 8:
            return TOP, {}
        return "groups[].error_code", {"groups[1].group_id": "groups[1].group_id"}
    if api_key == 10:  # FindCoordinator
        return (
            (TOP, {}) if version < 4 else ("coordinators[].error_code", {"coordinators[1].key": "coordinator_keys[1]"})
        )
    if api_key == 24 and version < 4:  # AddPartitionsToTxn
        topics = "results_by_topic_v3_and_below"
        return (
            f"{topics}[].results_by_partition[].partition_error_code",
            {
                f"{topics}[1].name": "v3_and_below_topics[1].name",
                f"{topics}[1].results_by_partition[1].partition_index": "v3_and_below_topics[1].partitions[1]",
            },
        )
    return table.get(api_key, (TOP, {}))


def walk(obj: Any, pattern: str) -> Iterator[tuple[str, Any, Any]]:
    """(path, value, owner) for every value the pattern reaches ("a[].b[].c")."""

    def go(o: Any, segs: list[str], path: str, owner: Any) -> Iterator[tuple[str, Any, Any]]:
        if not segs:
            yield path, o, owner
            return
        head, rest = segs[0], segs[1:]
        name = head.removesuffix("[]")
        value = getattr(o, name)
        p = f"{path}.{name}" if path else name
        if head.endswith("[]"):
            for i, item in enumerate(value or ()):
                yield from go(item, rest, f"{p}[{i}]", item)
        else:
            yield from go(value, rest, p, o)

    return go(obj, pattern.split("."), "", obj)


def get(obj: Any, path: str) -> Any:
    for name, index in re.findall(r"([a-z0-9_]+)(?:\[(\d+)\])?", path):
        obj = getattr(obj, name)
        if index:
            obj = obj[int(index)]
    return obj


def expected_count(pattern: str) -> int:
    return int(2 ** pattern.count("[]"))


@pytest.mark.parametrize(("api_key", "version", "rule"), IDENTIFIER_RULE_CASES)
def test_a_breach_becomes_a_kio_decodable_error_response_in_the_right_place(
    api_key: int, version: int, rule: Any
) -> None:
    limit = rule.expected.limit
    request = make_request(api_key, version, rule.values(("t" if rule.kind == "topic name" else "m") * (limit + 1)))
    [breach] = check_request(api_key, version, request, "client-1", ON)
    assert breach.kind.value == rule.kind

    header = wire.request_header_for(api_key, version, 7_654_321, "client-1")
    frame = build_error_frame(
        header,
        request,
        breach.error_code,
        breach.message,
        element_errors={breach.element_path: (breach.error_code, breach.message)},
    )
    decoded = wire.decode_response(frame, api_key, version)
    assert decoded.header.correlation_id == 7_654_321
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    assert type(decoded.header) is load_response_schema(api_key, version).__header_schema__

    pattern, ids = placement(api_key, version)
    found = list(walk(decoded.body, pattern))
    assert len(found) == expected_count(pattern), pattern
    for _path, code, owner in found:
        assert code == breach.error_code == rule.expected.error_code
        if hasattr(owner, "error_message"):
            assert owner.error_message == breach.message
            assert rule.kind in owner.error_message and str(limit) in owner.error_message
    for response_path, request_path in ids.items():
        assert get(decoded.body, response_path) == get(request, request_path), response_path
    # the response says nothing else went wrong, and holds nothing that looks like data
    codes = [c for _p, c, _o in walk_all_error_codes(decoded.body)]
    assert codes.count(ErrorCode.none) == len(codes) - len(found)
    assert encode(decoded.body) == encode(
        build_error_response(
            request,
            breach.error_code,
            breach.message,
            element_errors={breach.element_path: (breach.error_code, breach.message)},
        )
    )


def walk_all_error_codes(obj: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        p = f"{path}.{f.name}" if path else f.name
        if f.metadata.get("kafka_type") == "error_code":
            yield p, value, obj
        elif isinstance(value, tuple):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    yield from walk_all_error_codes(item, f"{p}[{i}]")
        elif dataclasses.is_dataclass(value):
            yield from walk_all_error_codes(value, p)


# ------------------------------------------------------------ specifics


def test_top_level_errors_leave_kafkas_unknown_values() -> None:
    request = make_request(11, 9, {"group_id": "g" * 250, "member_id": "member-1"})
    response = build_error_response(request, 42, "too long")
    assert response.error_code == ErrorCode.invalid_request
    assert (response.generation_id, response.member_id, response.leader, response.members) == (-1, "", "", ())
    assert response.protocol_name is None
    assert response.throttle_time == datetime.timedelta(0)


def test_find_coordinator_v0_errors_say_no_node() -> None:
    response = build_error_response(make_request(10, 0), 42)
    assert (response.error_code, response.node_id, response.host, response.port) == (42, -1, "", -1)


def test_find_coordinator_v4_coordinators_echo_keys_and_say_no_node() -> None:
    request = make_request(10, 6, {"coordinator_keys[0]": "g1", "coordinator_keys[1]": "g2"})
    response = build_error_response(request, 42, "m", element_errors={"coordinator_keys[1]": (15, "other")})
    assert [(c.key, c.node_id, c.port, c.error_code, c.error_message) for c in response.coordinators] == [
        ("g1", -1, -1, 42, "m"),
        ("g2", -1, -1, 15, "other"),
    ]


def test_offset_metadata_too_large_lands_on_its_own_partition() -> None:
    target = "topics[1].partitions[0].committed_metadata"
    request = make_request(8, 10, {target: "m" * 4097})
    [breach] = check_request(8, 10, request, None, ON)
    assert breach.error_code == 12
    header = wire.request_header_for(8, 10, 3, None)
    frame = build_error_frame(
        header, request, 42, "refused", element_errors={breach.element_path: (12, breach.message)}
    )
    body = wire.decode_response(frame, 8, 10).body
    codes = {(t, p.partition_index): p.error_code for t, topic in enumerate(body.topics) for p in topic.partitions}
    assert codes == {(0, 0): 42, (0, 1): 42, (1, 0): 12, (1, 1): 42}
    assert [t.topic_id for t in body.topics] == [t.topic_id for t in request.topics]


def test_an_invalid_topic_name_is_invalid_topic_exception_on_that_topic() -> None:
    request = make_request(19, 7, {"topics[0].name": "ok-topic", "topics[1].name": "bad/topic"})
    [breach] = check_request(19, 7, request, None, ON)
    assert (breach.error_code, breach.element_path) == (17, "topics[1]")
    response = build_error_response(request, 17, breach.message, element_errors={"topics[1]": (17, breach.message)})
    body = wire.decode_response(wire.encode_frame(response_header_for(19, 7, 1), response), 19, 7).body
    assert [(t.name, t.error_code) for t in body.topics] == [("ok-topic", 17), ("bad/topic", 17)]
    assert body.topics[1].error_message == breach.message
    assert (body.topics[1].num_partitions, body.topics[1].replication_factor) == (-1, -1)  # not echoed


def test_an_element_error_bubbles_up_to_a_top_level_error_code() -> None:
    # AddPartitionsToTxn v4+ carries one top-level error for the whole batch.
    request = make_request(24, 5)
    response = build_error_response(request, 42, "whole", element_errors={"transactions[1]": (12, "one")})
    assert (response.error_code, response.error_code.value, response.results_by_transaction) == (12, 12, ())


def test_no_error_message_field_means_no_message() -> None:
    response = build_error_response(make_request(12, 0), 42, "dropped: heartbeat v0 has no message field")
    assert response.error_code == 42 and not hasattr(response, "error_message")


def test_empty_request_collections_give_empty_responses() -> None:
    schema: Any = load_request_schema(15, 5)
    request = schema(groups=(), include_authorized_operations=False)
    assert build_error_response(request, 42).groups == ()


def test_an_error_code_kio_does_not_know_is_refused() -> None:
    with pytest.raises(UnsupportedErrorResponse, match="9999"):
        build_error_response(make_request(12, 4), 9999)


def test_header_and_body_must_agree() -> None:
    with pytest.raises(ValueError, match="api 12"):
        build_error_frame(wire.request_header_for(12, 4, 1, None), make_request(11, 9), 42)


def test_the_proxys_peeked_header_works_too() -> None:
    request = make_request(12, 4)
    frame = wire.encode_frame(wire.request_header_for(12, 4, 99, "c"), request)
    peeked = wire.read_request_header(frame)
    response_frame = build_error_frame(peeked, request, 42)
    assert wire.response_correlation_id(response_frame, 0) == 99
    assert wire.decode_response(response_frame, 12, 4).body.error_code == 42


def test_api_versions_responses_keep_header_v0() -> None:
    schema: Any = load_request_schema(18, 4)
    request = schema(client_software_name="a", client_software_version="1")
    frame = build_error_frame(wire.request_header_for(18, 4, 5, "c"), request, 35)
    assert len(frame) == 4 + 4 + len(encode(build_error_response(request, 35)))  # no tagged-fields byte
    assert wire.decode_response(frame, 18, 4).body.error_code == 35


ALL_VERSIONS = [  # every kio API at its lowest and highest version
    (k, v)
    for k, name in sorted(api_key_map.items())
    for v in sorted({min(schema_name_map[name]), max(schema_name_map[name])})
]


def test_every_kio_api_either_round_trips_or_says_why() -> None:
    """Generic means generic: no API is special-cased beyond the naming table."""
    built, refused = 0, []
    for api_key, version in ALL_VERSIONS:
        request = make_request(api_key, version)
        try:
            response = build_error_response(request, 42, "refused")
        except UnsupportedErrorResponse as exc:
            refused.append((api_key_map[api_key], version, str(exc)))
            continue
        data = encode(response)
        decoded, size = entity_reader(type(response))(data, 0)
        assert size == len(data)
        assert encode(decoded) == data
        codes = [c for _p, c, _o in walk_all_error_codes(decoded)]
        assert ErrorCode.invalid_request in codes, (api_key_map[api_key], version)
        built += 1
    assert built > 0.9 * len(ALL_VERSIONS), refused
