"""The shell side of the group size policy (KIP-389, KIP-848): which group
requests and responses are decoded, what the policy is told about each, and
the answer the proxy writes when it refuses a join (the broker never sees it).

Requests and responses of JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit and ConsumerGroupHeartbeat are small and infrequent, so decoding
them costs nothing on the Produce/Fetch hot path.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import trio
from kio.index import load_request_schema
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from policies.group_size import Admit, GroupKind, GroupSizePolicy, Refuse, Throttle
from policies.mode import Mode

from . import wire
from .audit import AuditSink
from .config import Policies
from .error_responses import build_error_response, response_header_for
from .framing import FrameReader
from .metrics import Metrics
from .upstream import UpstreamLink, UpstreamUnavailable

log = logging.getLogger("kafka_admission_proxy.groups")

OFFSET_COMMIT, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP, CONSUMER_GROUP_HEARTBEAT = 8, 11, 12, 13, 14, 68
GROUP_APIS = frozenset({OFFSET_COMMIT, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP, CONSUMER_GROUP_HEARTBEAT})
_EXPIRY_INTERVAL_S = 1.0
_RECONCILE_TIMEOUT_S = 3.0
DESCRIBE_GROUPS, CONSUMER_GROUP_DESCRIBE = 15, 69


async def _describe(stream: trio.abc.Stream, join_api: int, group_id: str) -> Any:
    """One describe request on its own connection to the coordinator; the group's entry."""
    if join_api == JOIN_GROUP:
        api, version = DESCRIBE_GROUPS, 5
        schema: Any = load_request_schema(api, version)
        request = schema(groups=(group_id,), include_authorized_operations=False)
    else:
        api, version = CONSUMER_GROUP_DESCRIBE, 0
        schema = load_request_schema(api, version)
        request = schema(group_ids=(group_id,), include_authorized_operations=False)
    await stream.send_all(wire.encode_frame(wire.request_header_for(api, version, 1, "kafka-admission-proxy"), request))
    reader = FrameReader(stream, plaintext=True)
    verdict = await reader.next_prefix(_DESCRIBE_MAX_BYTES)
    if verdict is None or not verdict.admitted:
        raise wire.MalformedFrame(f"describe answered with {verdict}")
    return wire.decode_response(await reader.read_frame(verdict.size), api, version).body.groups[0]


_DESCRIBE_MAX_BYTES = 16 * 1024 * 1024
_KNOWN_STATES = {
    GroupKind.CLASSIC: {"Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"},
    GroupKind.CONSUMER: {"empty", "assigning", "reconciling", "stable", "dead"},
}


@dataclass(frozen=True, slots=True)
class GroupRequest:
    """What the response needs to be matched with: the decoded request and the join's ticket."""

    body: Any
    ticket: int | None


def _ms(value: Any) -> int | None:
    return int(value.total_seconds() * 1000) if isinstance(value, datetime.timedelta) else None


class GroupTracking:
    def __init__(self, policies: Policies, metrics: Metrics, audit: AuditSink) -> None:
        self._metrics = metrics
        self._audit = audit
        config = policies.group_size_config()
        self.mode = policies.mode_of(policies.group_size_mode)
        self.policy = GroupSizePolicy(config, mode=Mode(self.mode))
        # Tracking costs decoding group traffic: only when a limit is set.
        self.enabled = (
            config.group_max_size < policies.int_max
            or config.group_consumer_max_size < policies.int_max
            or config.join_rate_per_minute > 0
        )
        self.decoded_api_keys = GROUP_APIS if self.enabled else frozenset()
        metrics.registry.register(_GroupCollector(self.policy))

    def on_request(
        self, header: wire.RequestHeader, body: Any, listener: str, peer: str
    ) -> tuple[bytes | None, GroupRequest | None]:
        """(an answer that refuses the request, or None to forward; what its response needs)."""
        now = trio.current_time()
        api = header.api_key
        if api == JOIN_GROUP:
            decision = self.policy.on_join_request(
                body.group_id,
                body.member_id,
                getattr(body, "group_instance_id", None),
                now,
                session_timeout_ms=_ms(body.session_timeout),
                rebalance_timeout_ms=_ms(getattr(body, "rebalance_timeout", None)),
                require_known_member_id=header.api_version >= 4,
                protocols=hash(tuple((p.name, p.metadata) for p in body.protocols)),
            )
        elif api == CONSUMER_GROUP_HEARTBEAT:
            decision = self.policy.on_consumer_heartbeat_request(
                body.group_id, body.member_id, body.member_epoch, body.instance_id, now
            )
        else:
            if api == SYNC_GROUP:
                self.policy.on_sync_request(
                    body.group_id, body.member_id, now, group_instance_id=getattr(body, "group_instance_id", None)
                )
            return None, GroupRequest(body, None)
        if isinstance(decision, Admit):
            if decision.would_refuse or decision.would_throttle:
                observed = decision.would_refuse or decision.would_throttle
                assert observed is not None
                self._decided(
                    header, body, "refuse" if decision.would_refuse else "throttle", observed.reason, listener, peer
                )
            return None, GroupRequest(body, decision.ticket)
        kind = "refuse" if isinstance(decision, Refuse) else "throttle"
        self._decided(header, body, kind, decision.reason, listener, peer)
        return self._answer(header, body, decision), None

    def on_response(self, api_key: int, api_version: int, request: GroupRequest, frame: bytes) -> None:
        body = wire.decode_response(frame, api_key, api_version).body
        req = request.body
        now = trio.current_time()
        instance_id = getattr(req, "group_instance_id", None)
        policy = self.policy
        if api_key == JOIN_GROUP:
            members = [(m.member_id, getattr(m, "group_instance_id", None)) for m in body.members] or None
            log.debug(
                "join_group answered",
                extra={
                    "group": req.group_id,
                    "error": int(body.error_code),
                    "member": body.member_id,
                    "members": len(body.members),
                },
            )
            policy.on_join_response(
                req.group_id,
                req.member_id,
                instance_id,
                int(body.error_code),
                body.member_id,
                int(body.generation_id),
                now,
                leader_id=body.leader,
                members=members,
                ticket=request.ticket,
                session_timeout_ms=_ms(req.session_timeout),
            )
        elif api_key in (SYNC_GROUP, HEARTBEAT):
            settle = policy.on_sync_response if api_key == SYNC_GROUP else policy.on_heartbeat_response
            settle(
                req.group_id,
                req.member_id,
                int(body.error_code),
                now,
                group_instance_id=instance_id,
                generation_id=int(req.generation_id),
            )
        elif api_key == LEAVE_GROUP:
            if api_version >= 3:
                left = [(m.member_id, m.group_instance_id) for m in body.members if int(m.error_code) == 0]
            else:
                left = [(req.member_id, None)] if int(body.error_code) == 0 else []
            policy.on_leave_group(req.group_id, left, now)
        elif api_key == OFFSET_COMMIT:
            errors = [int(p.error_code) for t in body.topics for p in t.partitions if int(p.error_code)]
            generation = getattr(req, "generation_id_or_member_epoch", getattr(req, "generation_id", None))
            policy.on_offset_commit_response(
                req.group_id,
                getattr(req, "member_id", ""),
                errors[0] if errors else 0,
                now,
                group_instance_id=instance_id,
                generation_id=int(generation) if generation is not None else None,
            )
        elif api_key == CONSUMER_GROUP_HEARTBEAT:
            policy.on_consumer_heartbeat_response(
                req.group_id,
                req.member_id,
                int(body.error_code),
                body.member_id,
                int(body.member_epoch),
                now,
                instance_id=req.instance_id,
                ticket=request.ticket,
            )

    async def reconcile(
        self, api_key: int, api_version: int, frame: bytes, connect: Callable[[], Awaitable[UpstreamLink]]
    ) -> None:
        """Before a join near the cap, ask the coordinator how big the group is (DescribeGroups,
        or ConsumerGroupDescribe): other proxies, or this one before a restart, may have
        admitted members this one never saw. Best effort: a failed describe only logs."""
        if api_key not in (JOIN_GROUP, CONSUMER_GROUP_HEARTBEAT):
            return
        body = wire.decode_request(frame, api_key, api_version)
        if api_key == CONSUMER_GROUP_HEARTBEAT and body.member_epoch != 0:
            return  # only joins can be refused
        sent_at = trio.current_time()
        if not self.policy.needs_reconcile(body.group_id, sent_at):
            return
        self.policy.reconcile_started(body.group_id, sent_at)
        try:
            with trio.fail_after(_RECONCILE_TIMEOUT_S):
                link = await connect()
                try:
                    described = await _describe(link.stream, api_key, body.group_id)
                finally:
                    await trio.aclose_forcefully(link.stream)
        except (OSError, trio.TooSlowError, trio.BrokenResourceError, UpstreamUnavailable, wire.MalformedFrame) as exc:
            log.warning("could not describe group to reconcile its size: %r", exc)
            return
        if int(described.error_code) != 0:
            return
        instance = "group_instance_id" if api_key == JOIN_GROUP else "instance_id"
        members = [(m.member_id, getattr(m, instance, None)) for m in described.members]
        kind = GroupKind.CLASSIC if api_key == JOIN_GROUP else GroupKind.CONSUMER
        # Only Kafka's own state names are trusted (Tansu reports e.g. "Assigning" for classic groups).
        state = described.group_state if described.group_state in _KNOWN_STATES[kind] else None
        self.policy.observe_group_size(
            body.group_id, members, trio.current_time(), state=state, kind=kind, sent_at=sent_at
        )
        log.info(
            "reconciled group size with the coordinator",
            extra={"members": len(members), "state": described.group_state},
        )

    async def expire_forever(self) -> None:
        """Session expiry and idle-group eviction: bounded memory, counts that follow the coordinator."""
        while True:
            await trio.sleep(_EXPIRY_INTERVAL_S)
            self.policy.expire(trio.current_time())

    def _answer(self, header: wire.RequestHeader, body: Any, decision: Refuse | Throttle) -> bytes:
        message = decision.reason if header.api_key == CONSUMER_GROUP_HEARTBEAT else None
        response = build_error_response(body, decision.error_code, message)
        if isinstance(decision, Throttle):
            response = dataclasses.replace(
                response, throttle_time=datetime.timedelta(milliseconds=decision.throttle_ms)
            )
        if header.api_key == JOIN_GROUP:
            response = dataclasses.replace(response, member_id="")  # as Kafka: a refused member gets no id
        return wire.encode_frame(
            response_header_for(header.api_key, header.api_version, header.correlation_id), response
        )

    def _decided(self, header: wire.RequestHeader, body: Any, kind: str, reason: str, listener: str, peer: str) -> None:
        api = wire.api_name(header.api_key)
        self._metrics.group_refusals.labels(api, kind, self.mode).inc()
        self._audit.emit(
            "group_admission",
            listener=listener,
            peer=peer,
            api=api,
            decision=kind,
            mode=self.mode,
            reason=reason,
            group_id=body.group_id,
            member_id=body.member_id,
            client_id=header.client_id,
        )
        verb = f"would {kind}" if self.mode == "observe" else kind
        log.warning("%s %s to group: %s", verb, api, reason, extra={"peer": peer, "listener": listener})


class _GroupCollector(Collector):
    """Groups tracked and the distribution of their sizes (no group ids as labels)."""

    _BUCKETS = (1, 2, 5, 10, 20, 50, 100, 500, 1000)

    def __init__(self, policy: GroupSizePolicy) -> None:
        self._policy = policy

    def collect(self) -> Iterator[GaugeMetricFamily | HistogramMetricFamily]:
        yield GaugeMetricFamily(
            "kafka_admission_groups_tracked", "Consumer groups tracked", value=self._policy.groups_tracked
        )
        sizes = list(self._policy.member_counts())
        buckets = [(str(b), float(sum(1 for s in sizes if s <= b))) for b in self._BUCKETS]
        buckets.append(("+Inf", float(len(sizes))))
        yield HistogramMetricFamily(
            "kafka_admission_group_members", "Members per tracked group", buckets=buckets, sum_value=float(sum(sizes))
        )
