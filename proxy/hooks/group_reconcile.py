"""Ask the group coordinator how big a group really is (DescribeGroups for a
classic group, ConsumerGroupDescribe for a KIP-848 one), on a connection of its
own: other proxies, or this one before a restart, may have admitted members this
one never saw. Best effort: an answer that cannot be had is no answer."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio
from kio.index import load_request_schema

from policies.api_keys import CONSUMER_GROUP_DESCRIBE, DESCRIBE_GROUPS, JOIN_GROUP
from policies.frame_check import FrameKind
from proxy.links.transport import Transport
from proxy.links.upstream import UpstreamLink, UpstreamUnavailable
from proxy.protocol import wire
from proxy.protocol.framing import RECEIVE_SIZE, FrameRefused, FrameSplitter

log = logging.getLogger("kafka_admission_proxy.groups")

TIMEOUT_S = 3.0
_MAX_BYTES = 16 * 1024 * 1024
_DESCRIBE = {JOIN_GROUP: (DESCRIBE_GROUPS, 5)}
_CONSUMER_DESCRIBE = (CONSUMER_GROUP_DESCRIBE, 0)


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    members: list[tuple[str, str | None]]  # (member id, instance id)
    state: str


def _request(join_api: int, group_id: str) -> tuple[int, int, bytes]:
    api, version = _DESCRIBE.get(join_api, _CONSUMER_DESCRIBE)
    schema: Any = load_request_schema(api, version)
    if api == DESCRIBE_GROUPS:
        body = schema(groups=(group_id,), include_authorized_operations=False)
    else:
        body = schema(group_ids=(group_id,), include_authorized_operations=False)
    return api, version, wire.encode_frame(wire.request_header_for(api, version, 1, "kafka-admission-proxy"), body)


async def _exchange(transport: Transport, frame: bytes) -> bytes | None:
    """Send one request; its response frame, or None when the broker closes instead
    (a broker that does not know the API, e.g. librdkafka's mock cluster)."""
    await transport.send(frame)
    splitter = FrameSplitter(sniff=False)
    while True:
        span = splitter.next_frame(_MAX_BYTES)
        if span is not None:
            return bytes(splitter.buffer[span[0] : span[1]])
        data = await transport.receive(RECEIVE_SIZE)
        if not data:
            return None
        splitter.feed(data)


async def describe_group(
    connect: Callable[[], Awaitable[UpstreamLink]], join_api: int, group_id: str
) -> DescribedGroup | None:
    """The coordinator's view of the group, or None when it cannot tell (logged at debug:
    the size is then simply not reconciled)."""
    api, version, frame = _request(join_api, group_id)
    try:
        with trio.fail_after(TIMEOUT_S):
            link = await connect()
            try:
                answer = await _exchange(link.transport, frame)
            finally:
                with trio.CancelScope(shield=True):
                    await link.transport.aclose()
        if answer is None:
            log.debug("the coordinator closed instead of answering %s; group size not reconciled", wire.api_name(api))
            return None
        group = wire.decode_response(answer, api, version).body.groups[0]
    except FrameRefused as exc:
        if exc.verdict.kind is FrameKind.TLS_RECORD:
            log.debug("the coordinator answered %s in TLS", wire.api_name(api))
        return None
    except (OSError, trio.TooSlowError, trio.BrokenResourceError, UpstreamUnavailable, wire.MalformedFrame) as exc:
        log.info("could not describe group %r to reconcile its size: %s", group_id, exc)
        return None
    if int(group.error_code) != 0:
        return None
    instance = "group_instance_id" if join_api == JOIN_GROUP else "instance_id"
    return DescribedGroup([(m.member_id, getattr(m, instance, None)) for m in group.members], group.group_state)
