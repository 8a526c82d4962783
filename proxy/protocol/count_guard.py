"""Refuse a frame before kio decodes it when its counts could make kio allocate or
work without bound: a count or length that promises more than the frame holds, more
array elements than a request may build, or more tagged fields than any schema has.

kio (0.6.5) reserves memory for an array's elements as soon as it reads the count
from the wire, so a 50-byte JoinGroup that claims 4 billion protocols makes it ask
for tens of gigabytes, and a failed allocation aborts the process. Kafka had the
same hole (KAFKA-14063) and closed it the same way: no count may exceed the bytes
left in the frame (every element takes at least one byte). That alone still lets a
3 MB JoinGroup of 3-byte protocols build a million Python objects (56 MB, seconds of
the event loop, kio's decode holding the GIL), so a request may also build at most
``MAX_REQUEST_ELEMENTS`` array elements and tagged fields in all; a response, which
comes from the broker and may describe a whole cluster, keeps Kafka's rule alone.

This walks the kio schema of the frame, reading only lengths and counts, never
building an entity, and into the tagged fields kio decodes (their arrays are counted
too); it runs only for the few APIs the proxy decodes (``wire`` calls it before kio).
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

from kio._kio_native import read_unsigned_varint
from kio.serial._introspect import EntityField, EntityTupleField, PrimitiveTupleField, classify_field, is_optional

# Kafka's schemas declare at most 4 tagged fields in a struct (ApiVersionsResponse); a
# client may send tags this proxy does not know, but not millions of 2-byte ones.
MAX_TAGGED_FIELDS = 64
# Array elements and tagged fields one request may hold, all arrays and structs
# together: kio then builds at most this many Python objects for the frame's variable
# part (~56-130 bytes each, ~0.3 us each; the walk here ~1 us each). An OffsetCommit of
# 50,000 partitions holds ~50,000; a consumer's JoinGroup, 1-5.
MAX_REQUEST_ELEMENTS = 100_000


class CountTooLarge(ValueError):
    """A count or length in the frame promises more than the frame has or may build."""


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
    fixed: int  # bytes of one value of a fixed-size primitive, else 0


@dataclasses.dataclass(frozen=True, slots=True)
class _Schema:
    fields: tuple[_Field, ...]  # read in sequence
    tagged: dict[int, _Field]  # by tag: read in the tagged section (flexible versions)


def _field(f: dataclasses.Field[Any]) -> _Field:
    kind = classify_field(f)
    entity = kind.type_ if isinstance(kind, EntityField | EntityTupleField) else None
    array = isinstance(kind, EntityTupleField | PrimitiveTupleField)
    nullable_entity = entity is not None and not array and is_optional(f)
    kafka_type = f.metadata.get("kafka_type", "")
    return _Field(kafka_type, array, entity, nullable_entity, _FIXED.get(kafka_type, 0))


@cache
def _schema(cls: type) -> _Schema:
    fields, tagged = [], {}
    for f in dataclasses.fields(cls):
        if "tag" in f.metadata:
            tagged[f.metadata["tag"]] = _field(f)
        else:
            fields.append(_field(f))
    return _Schema(tuple(fields), tagged)


class _Reader:
    __slots__ = ("buf", "elements", "end", "flexible", "pos")

    def __init__(self, buf: bytes, pos: int, end: int, flexible: bool, elements: int) -> None:
        self.buf, self.pos, self.end, self.flexible = buf, pos, end, flexible
        self.elements = elements  # array elements and tagged fields still allowed

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

    def spend(self, n: int, what: str) -> None:
        """Count ``n`` more elements against the frame's allowance, before reading them."""
        if n > self.elements:
            raise CountTooLarge(f"{what} of {n} where {self.elements} more elements are allowed in this frame")
        self.elements -= n

    def count(self) -> int:
        """An array's element count (null: 0), refused if the frame cannot hold that many."""
        n = self.uvarint() - 1 if self.flexible else self.signed(4)
        if n > self.left():
            raise CountTooLarge(f"an array of {n} elements where {self.left()} bytes are left")
        n = max(n, 0)
        self.spend(n, "an array")
        return n

    def length_prefixed(self, kafka_type: str) -> None:
        if self.flexible:
            pos = self.pos
            if pos < self.end and self.buf[pos] < 0x80:  # a one-byte varint: most lengths, read inline
                self.pos = pos + 1
                n = self.buf[pos] - 1
            else:
                n = self.uvarint() - 1
        else:
            n = self.signed(2 if kafka_type == "string" else 4)
        if n > 0:
            self.take(n)

    def tagged_fields(self, tagged: dict[int, _Field]) -> None:
        n = self.uvarint()
        if n > MAX_TAGGED_FIELDS:
            raise CountTooLarge(f"{n} tagged fields in one struct (at most {MAX_TAGGED_FIELDS})")
        self.spend(n, "tagged fields")
        for _ in range(n):
            field = tagged.get(self.uvarint())
            size = self.uvarint()
            if field is None:  # a tag kio does not know: skipped, never decoded
                self.take(size)
                continue
            # kio decodes a known tag's value: walked within its declared size
            end, self.end = self.end, self.pos + size
            if self.end > end:
                raise CountTooLarge(f"a tagged field of {size} bytes where {end - self.pos} are left")
            self.field(field)
            if self.pos != self.end:
                raise CountTooLarge(f"a tagged field of {size} bytes holds {size - self.left()}")
            self.end = end

    def value(self, field: _Field) -> None:
        if field.entity is not None:
            if field.nullable_entity and self.signed(1) < 0:
                return
            self.entity(field.entity)
        elif field.fixed:
            self.take(field.fixed)
        else:
            self.length_prefixed(field.kafka_type)

    def field(self, field: _Field) -> None:
        if not field.array:
            self.value(field)
            return
        n = self.count()
        if field.fixed:  # fixed-size values: the whole array in one step
            self.take(n * field.fixed)
        elif field.entity is not None:
            for _ in range(n):
                self.entity(field.entity)
        else:
            for _ in range(n):
                self.length_prefixed(field.kafka_type)

    def entity(self, cls: type) -> None:
        schema = _schema(cls)
        for field in schema.fields:
            if field.array or field.entity is not None:
                self.field(field)
            elif field.fixed:
                self.take(field.fixed)
            else:
                self.length_prefixed(field.kafka_type)
        if self.flexible:
            pos = self.pos
            if pos < self.end and self.buf[pos] == 0:  # no tagged fields: the usual case, read inline
                self.pos = pos + 1
            else:
                self.tagged_fields(schema.tagged)


def check_counts(header_schema: type, schema: type, frame: bytes, *, request: bool) -> int:
    """The array elements and tagged fields in the whole frame (prefix, header, body);
    CountTooLarge if it claims more than it holds, or (a request) more than
    ``MAX_REQUEST_ELEMENTS`` elements."""
    flexible = bool(getattr(schema, "__flexible__", False))
    # Every element takes at least one byte: a response's allowance is its size.
    elements = min(len(frame), MAX_REQUEST_ELEMENTS) if request else len(frame)
    reader = _Reader(frame, 4, len(frame), flexible=False, elements=elements)
    # The header: a request's client id is a legacy nullable string even in header v2
    # (Kafka keeps it readable by every broker); v2 and response v1 end in tagged fields,
    # but ApiVersions responses keep header v0 even when their body is flexible.
    header = _schema(header_schema)
    for field in header.fields:
        reader.value(field)
    if getattr(header_schema, "__flexible__", False):
        reader.tagged_fields(header.tagged)
    reader.flexible = flexible
    reader.entity(schema)
    return elements - reader.elements
