"""KIP-1233 identifier limits (sans-I/O policy) on real kio requests of every
API and every version kio knows, held to the table written by hand from the KIP
(tests/kip1233_table.py), not to the policy's own table."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import pytest
from kio.index import load_request_schema
from kio.schema.index import api_key_map

from policies.api_keys import CREATE_TOPICS, DESCRIBE_GROUPS, FIND_COORDINATOR, JOIN_GROUP
from policies.decision import Action, Decision, Policy
from policies.identifier_kinds import IdentifierKind
from policies.identifier_limits import (
    CONFIG_KEYS,
    IDENTIFIER_FIELDS,
    Breach,
    BreachReason,
    IdentifierLimits,
    check_client_id,
    check_request,
    check_transactional_id,
    decide,
    java_length,
)
from policies.mode import Mode
from tests.kio_entities import (
    IDENTIFIER_RULE_CASES,
    IdentifierCase,
    all_versions,
    identifier_cases,
    make_request,
    string_fields,
    versions,
)
from tests.kip1233_table import KIP_1233_FIELDS, KIP_1233_NOT_CHECKED, NOT_IDENTIFIERS

ON = IdentifierLimits(enabled=True)
EVERY_VERSION = [pytest.param(k, v, id=f"{api_key_map[k]}-v{v}") for k in sorted(api_key_map) for v in all_versions(k)]


# ------------------------------------------------------------ the matrix, against the hand table


def over_value(case: IdentifierCase) -> str:
    return ("t" if case.kind == "topic name" else "m") * (case.expected.limit + 1)


def test_the_hand_table_decides_every_string_field_of_every_request_kio_knows() -> None:
    tables = (KIP_1233_FIELDS, KIP_1233_NOT_CHECKED, NOT_IDENTIFIERS)
    for api_key, api in sorted(api_key_map.items()):
        fields = {p for v in all_versions(api_key) for p in string_fields(load_request_schema(api_key, v))}
        decided = [set(table.get(api, ())) for table in tables]
        undecided = fields - set.union(*decided)
        assert not undecided, f"{api}: {sorted(undecided)} are in no table of tests/kip1233_table.py"
        for i, left in enumerate(decided):
            assert not left - fields, f"{api}: {sorted(left - fields)} are not fields of any version"
            for right in decided[i + 1 :]:
                assert not left & right, f"{api}: {sorted(left & right)} are in two tables"
    assert set().union(*tables) <= set(api_key_map.values())


@pytest.mark.parametrize(("api_key", "version", "case"), IDENTIFIER_RULE_CASES)
def test_an_over_limit_identifier_is_refused_with_the_kips_limit_and_code(
    api_key: int, version: int, case: IdentifierCase
) -> None:
    target = case.path.replace("[]", "[1]")
    value = over_value(case)
    body = make_request(api_key, version, case.values(value))
    breaches = check_request(api_key, version, body, "client-1", ON)
    assert [(b.kind.value, b.path, b.length, b.limit, b.error_code) for b in breaches] == [
        (case.kind, target, len(value), case.expected.limit, case.expected.error_code)
    ], "the policy does not check this field as KIP-1233 says"
    breach = breaches[0]
    assert case.kind in breach.message and str(case.expected.limit) in breach.message
    assert breach.element_path == (target[: target.rfind("]") + 1] if "[" in target else "")


@pytest.mark.parametrize(("api_key", "version"), EVERY_VERSION)
def test_every_identifier_exactly_at_its_limit_passes(api_key: int, version: int) -> None:
    cases = identifier_cases(api_key, version)
    values: dict[str, Any] = {}
    for case in cases:
        for i in range(2):
            values[case.path.replace("[]", f"[{i}]")] = "a" * case.expected.limit
    for key_type in sorted({c.key_type for c in cases if c.key_type is not None}) or [None]:
        if key_type is not None:
            values["key_type"] = key_type
        body = make_request(api_key, version, values)
        assert check_request(api_key, version, body, "c" * 249, ON) == []


@pytest.mark.parametrize(("api_key", "version"), EVERY_VERSION)
def test_strings_that_are_not_kip_identifiers_are_not_checked(api_key: int, version: int) -> None:
    """Every other string field at 5,000 characters (over every limit) is no breach: the
    policy checks nothing the hand table does not name."""
    api = api_key_map[api_key]
    others = {**NOT_IDENTIFIERS.get(api, {}), **KIP_1233_NOT_CHECKED.get(api, {})}
    present = [p for p in string_fields(load_request_schema(api_key, version)) if p in others]
    values = {p.replace("[]", f"[{i}]"): "o" * 5000 for p in present for i in range(2)}
    body = make_request(api_key, version, values)
    assert check_request(api_key, version, body, None, ON) == []


def test_the_policy_checks_only_fields_the_hand_table_names() -> None:
    for api_key, rules in IDENTIFIER_FIELDS.items():
        named = KIP_1233_FIELDS.get(api_key_map[api_key], {})
        assert {r.path for r in rules} <= set(named), api_key_map[api_key]


# ------------------------------------------------------------ specifics


def test_length_is_utf16_code_units_like_java() -> None:
    assert java_length("abc") == 3
    assert java_length("é") == 1
    assert java_length("😀") == 2
    assert java_length("😀" * 130) == 260


def test_an_emoji_group_id_under_the_limit_in_code_points_is_over_it_in_utf16() -> None:
    group_id = "😀" * 130  # 130 code points, 260 UTF-16 units
    assert len(group_id) < 249 < java_length(group_id)
    body = make_request(11, 9, {"group_id": group_id})
    [breach] = check_request(11, 9, body, None, ON)
    assert (breach.kind, breach.path, breach.length, breach.limit, breach.error_code) == (
        IdentifierKind.GROUP_ID,
        "group_id",
        260,
        249,
        42,
    )


def test_124_emoji_are_248_units_and_pass() -> None:
    body = make_request(11, 9, {"group_id": "😀" * 124 + "a"})
    assert check_request(11, 9, body, None, ON) == []


@pytest.mark.parametrize("version", versions(19))
@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("bad/name", BreachReason.INVALID_CHARACTERS),
        ("spaced name", BreachReason.INVALID_CHARACTERS),
        ("ünïcode", BreachReason.INVALID_CHARACTERS),
        ("", BreachReason.ILLEGAL_NAME),
        (".", BreachReason.ILLEGAL_NAME),
        ("..", BreachReason.ILLEGAL_NAME),
        ("t" * 250, BreachReason.TOO_LONG),
    ],
)
def test_illegal_topic_names_are_invalid_topic_exception(version: int, name: str, reason: BreachReason) -> None:
    body = make_request(19, version, {"topics[0].name": name})
    [breach] = check_request(19, version, body, None, ON)
    assert (breach.kind, breach.path, breach.reason, breach.error_code) == (
        IdentifierKind.TOPIC_NAME,
        "topics[0].name",
        reason,
        17,
    )
    assert breach.element_path == "topics[0]"


def test_legal_topic_names_pass() -> None:
    body = make_request(19, 7, {"topics[0].name": "a.b_c-D9", "topics[1].name": "t" * 249})
    assert check_request(19, 7, body, None, ON) == []


@pytest.mark.parametrize(("api_key", "version"), [(8, 2), (8, 10), (28, 0), (28, 5)])
def test_offset_metadata_over_4096_is_offset_metadata_too_large_on_its_partition(api_key: int, version: int) -> None:
    target = "topics[1].partitions[0].committed_metadata"
    body = make_request(
        api_key, version, {target: "m" * 4097, "topics[0].partitions[1].committed_metadata": "m" * 4096}
    )
    [breach] = check_request(api_key, version, body, None, ON)
    assert (breach.kind, breach.path, breach.length, breach.limit, breach.error_code) == (
        IdentifierKind.OFFSET_METADATA,
        target,
        4097,
        4096,
        12,
    )
    assert breach.element_path == "topics[1].partitions[0]"
    assert "offset.metadata.max.bytes" in breach.message


def test_null_offset_metadata_passes() -> None:
    body = make_request(8, 10, {"topics[0].partitions[0].committed_metadata": None})
    assert check_request(8, 10, body, None, ON) == []


def test_the_client_id_header_is_checked_on_every_request() -> None:
    assert check_client_id("c" * 249, ON) is None
    assert check_client_id(None, ON) is None
    breach = check_client_id("c" * 250, ON)
    assert breach == Breach(IdentifierKind.CLIENT_ID, "header.client_id", 250, 249, 42)
    assert breach is not None and breach.element_path == ""
    # also from check_request, first, for an API with no identifier in its body
    assert check_request(3, 12, object(), "c" * 250, ON) == [breach]
    assert check_client_id("😀" * 125, ON) is not None


def test_nothing_is_checked_unless_enabled() -> None:
    off = IdentifierLimits()
    assert off.enabled is False
    body = make_request(11, 9, {"group_id": "g" * 1000})
    assert check_request(11, 9, body, "c" * 1000, off) == []
    assert check_client_id("c" * 1000, off) is None


def test_several_breaches_are_all_reported_in_table_order() -> None:
    body = make_request(
        68, 1, {"group_id": "g" * 250, "member_id": "m" * 37, "instance_id": "i" * 250, "rack_id": "r" * 250}
    )
    kinds = [b.kind for b in check_request(68, 1, body, "c" * 250, ON)]
    assert kinds == [
        IdentifierKind.CLIENT_ID,
        IdentifierKind.GROUP_ID,
        IdentifierKind.MEMBER_ID,
        IdentifierKind.GROUP_INSTANCE_ID,
        IdentifierKind.RACK_ID,
    ]


def test_kip848_member_ids_are_limited_to_36() -> None:
    uuid_text = "8D8AC610-566D-4EF0-9C22-186B2A5ED792"
    assert check_request(68, 1, make_request(68, 1, {"member_id": uuid_text}), None, ON) == []
    [breach] = check_request(68, 1, make_request(68, 1, {"member_id": uuid_text + "0"}), None, ON)
    assert (breach.kind, breach.length, breach.limit, breach.error_code) == (IdentifierKind.MEMBER_ID, 37, 36, 42)


def test_classic_member_ids_are_client_id_dash_uuid_so_allow_286_by_default() -> None:
    broker_generated = "c" * 249 + "-" + "8d8ac610-566d-4ef0-9c22-186b2a5ed792"
    assert java_length(broker_generated) == 286
    body = make_request(11, 9, {"member_id": broker_generated})
    assert check_request(11, 9, body, None, ON) == []
    # the KIP's literal reading: 36 for every member id
    strict = IdentifierLimits(enabled=True, classic_member_id_max_length=36)
    [breach] = check_request(11, 9, make_request(11, 9, {"member_id": "m" * 37}), None, strict)
    assert (breach.kind, breach.length, breach.limit, breach.error_code) == (
        IdentifierKind.CLASSIC_MEMBER_ID,
        37,
        36,
        42,
    )


@pytest.mark.parametrize(
    ("key_type", "kind"),
    [(0, IdentifierKind.GROUP_ID), (1, IdentifierKind.TRANSACTIONAL_ID), (2, None)],
)
@pytest.mark.parametrize("version", [1, 3, 4, 6])
def test_find_coordinator_keys_are_checked_by_key_type(
    key_type: int, kind: IdentifierKind | None, version: int
) -> None:
    path = "key" if version < 4 else "coordinator_keys[0]"
    body = make_request(FIND_COORDINATOR, version, {path: "k" * 250, "key_type": key_type})
    found = [b.kind for b in check_request(FIND_COORDINATOR, version, body, None, ON)]
    assert found == ([kind] if kind else [])


def test_the_error_code_is_configurable_except_for_kafkas_existing_limits() -> None:
    limits = IdentifierLimits(enabled=True, error_code=133)
    assert limits.error_code_for(IdentifierKind.GROUP_ID) == 133
    assert limits.error_code_for(IdentifierKind.TOPIC_NAME) == 17
    assert limits.error_code_for(IdentifierKind.OFFSET_METADATA) == 12
    assert limits.error_code_for(IdentifierKind.MEMBER_ID) == 42


def test_every_limit_has_a_kafka_property_name() -> None:
    assert sorted(CONFIG_KEYS.values()) == sorted(f.name for f in dataclasses.fields(IdentifierLimits))
    limits = IdentifierLimits(True, 100, 40, 36, 200, 1024, 42)
    body = make_request(15, 6, {"groups[0]": "g" * 101})
    [breach] = check_request(15, 6, body, None, limits)
    assert (breach.path, breach.limit) == ("groups[0]", 100)


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"enabled": "true"}, "resource.identifier.limit.enable must be a boolean, got 'true'"),
        ({"max_length": -1}, "resource.identifier.max.length must be an integer 0-2147483647, got -1"),
        ({"member_id_max_length": 36.5}, "member.id.max.length must be an integer 0-2147483647, got 36.5"),
        ({"offset_metadata_max_bytes": 2**31}, "offset.metadata.max.bytes must be an integer 0-2147483647"),
        ({"topic_name_max_length": True}, "topic.name.max.length must be an integer"),
        ({"error_code": 0}, "resource.identifier.limit.error.code must be a Kafka error code 1-32767, got 0"),
        ({"error_code": True}, "resource.identifier.limit.error.code must be a Kafka error code 1-32767, got True"),
    ],
)
def test_bad_limits_name_the_key(limits: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        IdentifierLimits(**limits)
    assert str(info.value).startswith(message)


def test_the_policy_only_uses_attributes() -> None:
    body = types.SimpleNamespace(groups=("ok", "g" * 250), include_authorized_operations=False)
    [breach] = check_request(15, 0, body, None, ON)
    assert breach.path == "groups[1]"
    # absent or null fields are skipped, not errors
    assert check_request(11, 9, types.SimpleNamespace(group_instance_id=None), None, ON) == []


# ------------------------------------------------------------ the decision


def test_no_breach_is_no_decision() -> None:
    assert decide([], Mode.ENFORCE) is None
    assert decide([], Mode.OBSERVE, expects_response=False) is None


def test_a_client_id_over_the_limit_refuses_the_request_and_closes_after_the_answer() -> None:
    body = make_request(DESCRIBE_GROUPS, 5, {"groups[0]": "ok", "groups[1]": "g" * 250})
    breaches = check_request(DESCRIBE_GROUPS, 5, body, "c" * 251, ON)
    client, group = breaches

    decision = decide(breaches, Mode.ENFORCE)

    assert decision == Decision(
        Policy.IDENTIFIER_LIMITS,
        Action.REFUSE,
        Mode.ENFORCE,
        "resource.identifier.max.length",
        "client id (header.client_id) is 251 characters long, over the limit of 249 "
        "(resource.identifier.max.length, KIP-1233)",
        limit=249,
        error_code=42,
        close_after=True,
        # the header has no element of its own: only the group is answered with its own error
        element_errors={"groups[1]": (42, group.message)},
        subject={
            "identifier_kind": "client_id",
            "identifier_length": 251,
            "identifier": "c" * 251,
            "breaches": [
                {"kind": "client_id", "path": "header.client_id", "length": 251, "limit": 249},
                {"kind": "group_id", "path": "groups[1]", "length": 250, "limit": 249},
            ],
        },
    )
    assert decision.reason == client.message and decision.enforced


def test_a_breach_in_an_element_refuses_with_its_own_code_and_keeps_the_connection() -> None:
    body = make_request(CREATE_TOPICS, 7, {"topics[0].name": "fine", "topics[1].name": "bad/name"})
    breaches = check_request(CREATE_TOPICS, 7, body, "client-1", ON)

    decision = decide(breaches, Mode.ENFORCE)

    assert decision is not None and decision.action is Action.REFUSE
    assert (decision.error_code, decision.limit_key, decision.limit) == (17, "topic.name.max.length", 249)
    assert not decision.close_after and not decision.victims
    assert decision.element_errors == {"topics[1]": (17, breaches[0].message)}
    assert decision.subject["identifier_kind"] == "topic_name"
    assert decision.subject["identifier_length"] == 8
    assert decision.subject["identifier"] == "bad/name"


def test_an_audit_event_keeps_the_first_300_characters_of_the_identifier() -> None:
    breach = check_transactional_id("t" * 400, ON)
    assert breach is not None and breach.value == "t" * 400
    decision = decide([breach], Mode.OBSERVE)
    assert decision is not None and decision.subject["identifier"] == "t" * 300


def test_the_configured_error_code_is_answered_for_kip_1233_identifiers() -> None:
    limits = IdentifierLimits(enabled=True, error_code=133)
    body = make_request(DESCRIBE_GROUPS, 5, {"groups[0]": "g" * 250})
    decision = decide(check_request(DESCRIBE_GROUPS, 5, body, None, limits), Mode.ENFORCE)
    assert decision is not None and decision.error_code == 133
    assert decision.element_errors == {"groups[0]": (133, decision.reason)}


def test_a_request_that_expects_no_response_closes_the_connection() -> None:
    breach = check_transactional_id("t" * 250, ON)  # Produce acks=0: peeked, never answered
    assert breach is not None

    decision = decide([breach], Mode.ENFORCE, expects_response=False)

    assert decision == Decision(
        Policy.IDENTIFIER_LIMITS,
        Action.CLOSE,
        Mode.ENFORCE,
        "resource.identifier.max.length",
        breach.message,
        limit=249,
        subject={
            "identifier_kind": "transactional_id",
            "identifier_length": 250,
            "identifier": "t" * 250,
            "breaches": [{"kind": "transactional_id", "path": "transactional_id", "length": 250, "limit": 249}],
        },
    )
    assert decision.error_code is None and not decision.element_errors


def test_observe_mode_decides_the_same_and_is_not_enforced() -> None:
    body = make_request(JOIN_GROUP, 9, {"group_id": "g" * 250})
    breaches = check_request(JOIN_GROUP, 9, body, "c" * 250, ON)
    enforced = decide(breaches, Mode.ENFORCE)
    observed = decide(breaches, Mode.OBSERVE)
    assert enforced is not None and observed is not None
    assert observed == dataclasses.replace(enforced, mode=Mode.OBSERVE)
    assert enforced.enforced and not observed.enforced


def test_identifiers_lists_every_checked_identifier_of_a_body_with_its_kind() -> None:
    from policies.identifier_limits import identifiers

    body = make_request(11, 9, {"group_id": "orders", "member_id": "m-1", "group_instance_id": None})
    found = dict(identifiers(11, 9, body))
    assert found[IdentifierKind.GROUP_ID] == "orders"
    assert found[IdentifierKind.CLASSIC_MEMBER_ID] == "m-1"
    assert IdentifierKind.GROUP_INSTANCE_ID not in found  # null: nothing to measure
