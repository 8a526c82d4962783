"""Refuse a frame whose array counts or string/bytes lengths promise more than the
frame holds, before kio decodes it.

kio (0.6.5) reserves memory for an array's elements as soon as it reads the count
from the wire, so a 50-byte JoinGroup that claims 4 billion protocols makes it ask
for tens of gigabytes, and a failed allocation aborts the process. Kafka had the
same hole (KAFKA-14063) and closed it the same way: no count may exceed the bytes
left in the frame (every element takes at least one byte). This walks the kio
schema of the frame, reading only lengths and counts, never building an entity;
it runs only for the few APIs the proxy decodes (``wire`` calls it before kio).
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

from kio._kio_native import read_unsigned_varint
from kio.serial._introspect import EntityField, EntityTupleField, PrimitiveTupleField, classify_field, is_optional


class CountTooLarge(ValueError):
    """A count or length in the frame promises more bytes than the frame has."""

_FIXED = {
    "int8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "float64": 8,
    "uuid": 16,
}
_LENGTH_PREFIXED = frozenset({"string", "bytes", "records"})


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    kafka_type: str  # "" for an entity
    array: bool
    entity: Any  # the nested entity class, or None
    nullable_entity: bool  # a nullable struct: an int8 marker first (-1: null)


@cache
def _fields(cls: type) -> tuple[_Field, ...]:
    """The fields read in sequence (tagged fields live in the tagged section)."""
    out = []
    for f in dataclasses.fields(cls):
        if "tag" in f.metadata:
            continue
        kind = classify_field(f)
        entity = kind.type_ if isinstance(kind, EntityField | EntityTupleField) else None
        array = isinstance(kind, EntityTupleField | PrimitiveTupleField)
        nullable_entity = entity is not None and not array and is_optional(f)
        out.append(_Field(f.metadata.get("kafka_type", ""), array, entity, nullable_entity))
    return tuple(out)


class _Reader:
    __slots__ = ("buf", "end", "flexible", "pos")

    def __init__(self, buf: bytes, pos: int, end: int, flexible: bool) -> None:
        self.buf, self.pos, self.end, self.flexible = buf, pos, end, flexible

    def left(self) -> int:
        return self.end - self.pos

    def take(self, n: int) -> None:
        if n > self.left():
            raise CountTooLarge(f"a field of {n} bytes where {self.left()} are left")
        self.pos += n

    def uvarint(self) -> int:
        try:
            value, size = read_unsigned_varint(self.buf, self.pos)
        except Exception as exc:
            raise CountTooLarge(f"a varint does not parse: {exc}") from None
        self.take(size)
        return int(value)

    def signed(self, size: int) -> int:
        start = self.pos
        self.take(size)
        return int.from_bytes(self.buf[start : self.pos], "big", signed=True)

    def count(self) -> int:
        """An array's element count (null: 0), refused if the frame cannot hold that many."""
        n = self.uvarint() - 1 if self.flexible else self.signed(4)
        if n > self.left():
            raise CountTooLarge(f"an array of {n} elements where {self.left()} bytes are left")
        return max(n, 0)

    def length_prefixed(self, kafka_type: str) -> None:
        if self.flexible:
            n = self.uvarint() - 1
        else:
            n = self.signed(2 if kafka_type == "string" else 4)
        if n > 0:
            self.take(n)

    def tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.take(self.uvarint())

    def value(self, field: _Field) -> None:
        if field.entity is not None:
            if field.nullable_entity and self.signed(1) < 0:
                return
            self.entity(field.entity)
        elif field.kafka_type in _LENGTH_PREFIXED:
            self.length_prefixed(field.kafka_type)
        else:
            self.take(_FIXED[field.kafka_type])

    def entity(self, cls: type) -> None:
        for field in _fields(cls):
            if field.array:
                for _ in range(self.count()):
                    self.value(field)
            else:
                self.value(field)
        if self.flexible:
            self.tagged_fields()


def check_counts(header_schema: type, schema: type, frame: bytes) -> None:
    """Raise CountTooLarge if the whole frame (prefix, header, body) claims more than it holds."""
    flexible = bool(getattr(schema, "__flexible__", False))
    reader = _Reader(frame, 4, len(frame), flexible=False)
    # The header: a request's client id is a legacy nullable string even in header v2
    # (Kafka keeps it readable by every broker); v2 and response v1 end in tagged fields.
    for field in _fields(header_schema):
        reader.value(field)
    if flexible:
        reader.tagged_fields()
    reader.flexible = flexible
    reader.entity(schema)
