"""KIP-1233 identifier limits (sans-I/O policy) on real kio requests of every
covered API, at its lowest, a middle and its highest kio version."""

from __future__ import annotations

import dataclasses
import re
import types
from typing import Any, get_args, get_origin, get_type_hints

import pytest
from kio.index import load_request_schema
from kio.schema.index import api_key_map, schema_name_map

from policies.identifier_limits import (
    CONFIG_KEYS,
    FIND_COORDINATOR,
    IDENTIFIER_FIELDS,
    Breach,
    BreachReason,
    IdentifierKind,
    IdentifierLimits,
    check_client_id,
    check_request,
    java_length,
)
from tests.kio_entities import IDENTIFIER_RULE_CASES, make_request, unwrap_optional, versions

ON = IdentifierLimits(enabled=True)


# ------------------------------------------------------------ the matrix


def concrete(pattern: str, index: int) -> str:
    return pattern.replace("[]", f"[{index}]")


def over_value(kind: IdentifierKind, limits: IdentifierLimits = ON) -> str:
    letter = "t" if kind is IdentifierKind.TOPIC_NAME else "m"
    return letter * (limits.limit_for(kind) + 1)


def at_limit_values(api_key: int, version: int, limits: IdentifierLimits = ON) -> dict[str, str]:
    values = {}
    for rule in IDENTIFIER_FIELDS[api_key]:
        if rule.applies_to(version):
            for i in range(2):
                values[concrete(rule.path, i)] = "a" * limits.limit_for(rule.kind)
    return values


def test_every_api_the_brief_names_is_covered() -> None:
    named = {0, 8, 9, 10, 11, 12, 13, 14, 15, 19, 22, 24, 25, 26, 28, 29, 30, 31, 32, 33, 42, 44, 68, 69}
    assert named <= set(IDENTIFIER_FIELDS)


@pytest.mark.parametrize(("api_key", "version", "rule"), IDENTIFIER_RULE_CASES)
def test_an_over_limit_identifier_is_a_breach_of_its_kind(api_key: int, version: int, rule: Any) -> None:
    target = concrete(rule.path, 1)
    value = over_value(rule.kind)
    body = make_request(api_key, version, {target: value})
    breaches = check_request(api_key, version, body, "client-1", ON)
    assert breaches == [Breach(rule.kind, target, len(value), ON.limit_for(rule.kind), ON.error_code_for(rule.kind))]
    breach = breaches[0]
    assert rule.kind.value in breach.message and str(breach.limit) in breach.message
    assert breach.element_path == (target[: target.rfind("]") + 1] if "[" in target else "")


@pytest.mark.parametrize(
    ("api_key", "version"),
    [pytest.param(k, v, id=f"{api_key_map[k]}-v{v}") for k in IDENTIFIER_FIELDS for v in versions(k)],
)
def test_identifiers_exactly_at_their_limits_pass(api_key: int, version: int) -> None:
    body = make_request(api_key, version, at_limit_values(api_key, version))
    assert check_request(api_key, version, body, "c" * 249, ON) == []


def test_the_table_matches_the_kio_schemas_version_by_version() -> None:
    def resolves(cls: Any, segments: list[str]) -> bool:
        head, rest = segments[0], segments[1:]
        name = head.removesuffix("[]")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if name not in fields:
            return False
        tp, _ = unwrap_optional(get_type_hints(cls)[name])
        is_array = get_origin(tp) is tuple
        if is_array != head.endswith("[]"):
            return False
        inner = unwrap_optional(get_args(tp)[0])[0] if is_array else tp
        if not rest:
            return fields[name].metadata["kafka_type"] == "string" and not dataclasses.is_dataclass(inner)
        return dataclasses.is_dataclass(inner) and resolves(inner, rest)

    for api_key, rules in IDENTIFIER_FIELDS.items():
        known = sorted(schema_name_map[api_key_map[api_key]])
        for rule in rules:
            present = [v for v in known if resolves(load_request_schema(api_key, v), rule.path.split("."))]
            assert present == [v for v in known if rule.applies_to(v)], (api_key_map[api_key], rule.path)


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


def test_limits_from_kafka_style_properties() -> None:
    limits = IdentifierLimits.from_properties(
        {
            "resource.identifier.limit.enable": "true",
            "resource.identifier.max.length": "100",
            "member.id.max.length": 40,
            "classic.member.id.max.length": 36,
            "topic.name.max.length": 200,
            "offset.metadata.max.bytes": "1024",
            "resource.identifier.limit.error.code": 42,
        }
    )
    assert limits == IdentifierLimits(True, 100, 40, 36, 200, 1024, 42)
    assert IdentifierLimits.from_properties({}) == IdentifierLimits()
    assert set(CONFIG_KEYS) == {
        "resource.identifier.limit.enable",
        "resource.identifier.max.length",
        "member.id.max.length",
        "classic.member.id.max.length",
        "topic.name.max.length",
        "offset.metadata.max.bytes",
        "resource.identifier.limit.error.code",
    }
    body = make_request(15, 6, {"groups[0]": "g" * 101})
    [breach] = check_request(15, 6, body, None, limits)
    assert (breach.path, breach.limit) == ("groups[0]", 100)


@pytest.mark.parametrize(
    ("props", "key"),
    [
        ({"resource.identifier.limit.enable": "yes"}, "resource.identifier.limit.enable"),
        ({"resource.identifier.max.length": -1}, "resource.identifier.max.length"),
        ({"member.id.max.length": "36.5"}, "member.id.max.length"),
        ({"resource.identifier.limit.error.code": 0}, "resource.identifier.limit.error.code"),
        ({"resource.identifier.limit.error.code": True}, "resource.identifier.limit.error.code"),
        ({"resource.identifier.max.lenght": 1}, "resource.identifier.max.lenght"),
    ],
)
def test_bad_properties_name_the_key(props: dict[str, object], key: str) -> None:
    with pytest.raises(ValueError, match=re.escape(key)):
        IdentifierLimits.from_properties(props)


def test_the_policy_only_uses_attributes() -> None:
    body = types.SimpleNamespace(groups=("ok", "g" * 250), include_authorized_operations=False)
    [breach] = check_request(15, 0, body, None, ON)
    assert breach.path == "groups[1]"
    # absent or null fields are skipped, not errors
    assert check_request(11, 9, types.SimpleNamespace(group_instance_id=None), None, ON) == []
