"""Real kio request entities for any API at any version, built from the kio
schemas alone, plus the identifier-rule test matrix over them.

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

from policies.identifier_limits import IDENTIFIER_FIELDS


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


# Every identifier rule the policy has, at each of ``versions`` it applies to.
IDENTIFIER_RULE_CASES = [
    pytest.param(api_key, version, rule, id=f"{api_key_map[api_key]}-v{version}-{rule.path}")
    for api_key, rules in IDENTIFIER_FIELDS.items()
    for version in versions(api_key)
    for rule in rules
    if rule.applies_to(version)
]
