"""Real kio request entities for any API at any version, built from the kio
schemas alone, plus the KIP-1233 test matrix over them: every identifier field of
every request version kio knows, with the limit and error code of the table
written by hand from the KIP (tests/kip1233_table.py), never the policy's own.

Why: the identifier-limit policy and the generic error-response builder must
hold for every API they cover, at every version kio knows, so their unit tests
need a valid request of each without writing one by hand per API and version.

``make_entity`` fills every field of a kio dataclass with a small valid value:
two elements in every collection, partition indexes 0, 1, ..., and distinct
strings per element (``x0``/``x1`` in string arrays, ``n0``/``n0-1`` for element
names), so a response can be matched back to the request element it echoes.
Any concrete path (``topics[1].name``, ``groups[0]``) can be given its own
value. ``make_request`` then round-trips the entity through kio's encoder and
decoder, so a test sees what the proxy would decode off the wire.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import re
import types
import uuid
from collections.abc import Mapping
from typing import Any, Union, get_args, get_origin, get_type_hints

import pytest
from kio.index import load_request_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer

from tests.kip1233_table import COORDINATOR_KEY, KIP_1233_FIELDS, Expected


def unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); any other type -> (type, False)."""
    if get_origin(tp) in (types.UnionType, Union):
        return next(a for a in get_args(tp) if a is not type(None)), True
    return tp, False


def _scalar(kafka_type: str, base: Any, nullable: bool) -> Any:
    if kafka_type in ("int8", "int16", "int32", "int64", "uint16", "error_code"):
        return base(0)  # error_code: ErrorCode.none
    if kafka_type == "string":
        return "x"
    if kafka_type == "bool":
        return False
    if kafka_type in ("bytes", "records"):
        return None if nullable else b""
    if kafka_type == "uuid":
        return uuid.UUID(int=7)
    if kafka_type == "float64":
        return 0.0
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(seconds=1)
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(0, tz=datetime.UTC)
    raise AssertionError(kafka_type)


def make_entity(cls: Any, values: Mapping[str, Any], path: str = "", count: int = 2) -> Any:
    """``count`` elements in every collection, partition indexes 0..count-1,
    strings "x" (``x<i>`` in string arrays, ``n<indexes>`` for element names)
    unless ``values`` names their concrete path (``topics[1].name``, ``groups[0]``)."""
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        p = f"{path}.{f.name}" if path else f.name
        tp, nullable = unwrap_optional(hints[f.name])
        kafka_type = f.metadata.get("kafka_type", "")
        if get_origin(tp) is tuple:
            elem, _ = unwrap_optional(get_args(tp)[0])
            items = []
            for i in range(count):
                ep = f"{p}[{i}]"
                if dataclasses.is_dataclass(elem):
                    items.append(make_entity(elem, values, ep, count))
                elif ep in values:
                    items.append(values[ep])
                elif kafka_type == "string":
                    items.append(f"x{i}")
                else:
                    items.append(elem(i) if kafka_type == "int32" else _scalar(kafka_type, elem, False))
            kwargs[f.name] = tuple(items)
        elif dataclasses.is_dataclass(tp):
            kwargs[f.name] = make_entity(tp, values, p, count)
        elif p in values:
            kwargs[f.name] = values[p]
        elif f.name in ("partition_index", "index"):
            kwargs[f.name] = tp(int(re.findall(r"\[(\d+)\]", path)[-1]) if "[" in path else 0)
        elif f.name in ("name", "resource_name") and "[" in path:
            kwargs[f.name] = "n" + "-".join(re.findall(r"\[(\d+)\]", path))
        else:
            kwargs[f.name] = _scalar(kafka_type, tp, nullable)
    return cls(**kwargs)


def encode(entity: Any) -> bytes:
    """The kio wire encoding of ``entity`` (no frame, no header)."""
    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


def wire_roundtrip(entity: Any) -> Any:
    """Encode with kio and decode again: what the proxy would see on the wire."""
    data = encode(entity)
    decoded, size = entity_reader(type(entity))(data, 0)
    assert size == len(data)
    return decoded


def make_request(api_key: int, version: int, values: Mapping[str, Any] | None = None) -> Any:
    """A decoded request body of ``api_key`` at ``version``; see ``make_entity``."""
    return wire_roundtrip(make_entity(load_request_schema(api_key, version), values or {}))


def versions(api_key: int) -> list[int]:
    """The lowest, a middle and the highest version kio knows for ``api_key``."""
    known = sorted(schema_name_map[api_key_map[api_key]])
    return sorted({known[0], known[len(known) // 2], known[-1]})


def all_versions(api_key: int) -> list[int]:
    """Every version kio knows for ``api_key``."""
    return sorted(schema_name_map[api_key_map[api_key]])


def string_fields(cls: Any, prefix: str = "") -> list[str]:
    """Every string field of a kio entity, as a path (``topics[].partitions[].committed_metadata``)."""
    hints = get_type_hints(cls)
    found: list[str] = []
    for f in dataclasses.fields(cls):
        tp, _ = unwrap_optional(hints[f.name])
        if get_origin(tp) is tuple:
            inner, _ = unwrap_optional(get_args(tp)[0])
            if dataclasses.is_dataclass(inner):
                found += string_fields(inner, f"{prefix}{f.name}[].")
            elif f.metadata.get("kafka_type") == "string":
                found.append(f"{prefix}{f.name}[]")
        elif dataclasses.is_dataclass(tp):
            found += string_fields(tp, f"{prefix}{f.name}.")
        elif f.metadata.get("kafka_type") == "string":
            found.append(prefix + f.name)
    return found


@dataclasses.dataclass(frozen=True)
class IdentifierCase:
    """One identifier field of one request version, with what KIP-1233 expects of it
    (from the hand-written table in tests/kip1233_table.py)."""

    path: str
    expected: Expected
    key_type: int | None = None  # FindCoordinator: the key type that makes the key this kind

    @property
    def kind(self) -> str:
        return self.expected.kind

    def values(self, value: str) -> dict[str, Any]:
        """The request values that put ``value`` in element 1 of this field."""
        values: dict[str, Any] = {self.path.replace("[]", "[1]"): value}
        if self.key_type is not None:
            values["key_type"] = self.key_type
        return values


def identifier_cases(api_key: int, version: int) -> list[IdentifierCase]:
    """The KIP-1233 identifier fields of this request version that kio says exist."""
    schema = load_request_schema(api_key, version)
    present = set(string_fields(schema))
    has_key_type = "key_type" in {f.name for f in dataclasses.fields(schema)}
    cases = []
    for path, expected in KIP_1233_FIELDS.get(api_key_map[api_key], {}).items():
        if path not in present:
            continue
        if isinstance(expected, Expected):
            cases.append(IdentifierCase(path, expected))
        else:
            assert expected is COORDINATOR_KEY
            if not has_key_type:  # FindCoordinator v0: the key is a group id
                cases.append(IdentifierCase(path, expected[0]))
                continue
            cases += [IdentifierCase(path, e, key_type) for key_type, e in expected.items() if e is not None]
    return cases


def _case_id(api_key: int, version: int, case: IdentifierCase) -> str:
    key_type = "" if case.key_type is None else f"-key_type{case.key_type}"
    return f"{api_key_map[api_key]}-v{version}-{case.path}{key_type}"


# Every KIP-1233 identifier field of every request version kio knows (hand table, not the policy's).
IDENTIFIER_RULE_CASES = [
    pytest.param(api_key, version, case, id=_case_id(api_key, version, case))
    for api_key in sorted(api_key_map)
    for version in all_versions(api_key)
    for case in identifier_cases(api_key, version)
]
