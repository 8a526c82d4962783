"""Real frames to mutate: for every API the proxy decodes and every version kio
knows, a valid request and a valid response, built from kio's schemas
(``tests.kio_entities.make_entity``) and encoded by kio, headers included."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.static.primitive import i32

from policies.identifier_limits import IDENTIFIER_FIELDS
from proxy.protocol import wire
from tests.kio_entities import make_entity

# Group tracking (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
# ConsumerGroupHeartbeat, and the describes of reconciliation), address rewriting
# (Metadata, FindCoordinator, DescribeCluster), ApiVersions capping, and every
# API whose identifiers KIP-1233 checks.
DECODED_APIS = tuple(sorted({11, 14, 12, 13, 8, 68, 15, 69, 3, 10, 60, 18, *IDENTIFIER_FIELDS}))


@dataclass(frozen=True)
class Base:
    api_key: int
    version: int
    response: bool
    frame: bytes

    @property
    def name(self) -> str:
        return f"{wire.api_name(self.api_key)} v{self.version} {'response' if self.response else 'request'}"

    def decode(self, frame: bytes) -> object:
        if self.response:
            return wire.decode_response(frame, self.api_key, self.version)
        return wire.decode_request(frame, self.api_key, self.version)


def _frame(api_key: int, version: int, response: bool) -> bytes:
    schema = (load_response_schema if response else load_request_schema)(api_key, version)
    if response:
        header = schema.__header_schema__(correlation_id=i32(7))
    else:
        header = wire.request_header_for(api_key, version, 7, "fuzz-client")
    return wire.encode_frame(header, make_entity(schema, {}))


@functools.cache
def wire_corpus() -> tuple[Base, ...]:
    """Every decoded API x every version x request and response, each checked to decode."""
    bases = []
    for api_key in DECODED_APIS:
        for version in sorted(schema_name_map[api_key_map[api_key]]):
            for response in (False, True):
                base = Base(api_key, version, response, _frame(api_key, version, response))
                base.decode(base.frame)  # a valid base, or the corpus is wrong
                bases.append(base)
    return tuple(bases)
