"""Added cost per request of KIP-1233 identifier checks, in microseconds.

Measures the config generation's request check (the hooks a request's plan
names, as the connection runs them) on real kio-encoded frames: a Produce (header
client id plus the peeked transactional id: the hot path), a Metadata request
(header client id only), and a JoinGroup (body decoded and every identifier
checked), each against the same call with the policy disabled. Run:

    .venv/bin/python bench/identifier_check_cost.py
"""

from __future__ import annotations

import datetime

import trio
from kio.index import load_request_schema

from policies.group_size import GroupSizePolicy
from proxy.config.model import parse_config
from proxy.evidence.audit import AuditSink
from proxy.evidence.decisions import DecisionRecorder, Where
from proxy.evidence.metrics import Metrics
from proxy.hooks.generation import Generation
from proxy.hooks.request import Request
from proxy.links.brokers import BrokerDirectory
from proxy.protocol import wire

ROUNDS = 200_000


def generation(enabled: bool) -> Generation:
    config = parse_config(
        {
            "upstream": {"bootstrap_servers": ["127.0.0.1:9092"]},
            "listeners": [{"name": "bench", "bind": "127.0.0.1:1"}],
            "policies": {"resource.identifier.limit.enable": enabled},
        }
    )
    metrics = Metrics()
    recorder = DecisionRecorder(metrics, AuditSink(config.audit, metrics))
    groups = GroupSizePolicy(config.policies.group_size_config())
    return Generation(1, config, groups=groups, directory=BrokerDirectory(metrics), recorder=recorder)


def frames() -> dict[str, bytes]:
    produce = load_request_schema(0, 9)(
        transactional_id=None, acks=1, timeout=datetime.timedelta(seconds=30), topic_data=()
    )
    metadata = load_request_schema(3, 12)(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    join = load_request_schema(11, 9)(
        group_id="orders-consumers",
        session_timeout=datetime.timedelta(seconds=45),
        rebalance_timeout=datetime.timedelta(seconds=300),
        member_id="consumer-1-2b9c0e5e-0f3b-4c8e-9f1a",
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(),
        reason=None,
    )
    return {
        "produce v9 (header + peeked transactional id)": wire.encode_frame(
            wire.request_header_for(0, 9, 1, "app-1"), produce
        ),
        "metadata v12 (header client id)": wire.encode_frame(wire.request_header_for(3, 12, 1, "app-1"), metadata),
        "join_group v9 (body decoded and checked)": wire.encode_frame(wire.request_header_for(11, 9, 1, "app-1"), join),
    }


async def _no_coordinator() -> object:
    raise AssertionError("not used")


def per_call_us(gen: Generation, frame: bytes) -> float:
    """One request as the connection takes it: peek, plan, and (if any) the hooks' check."""
    where = Where("bench", "127.0.0.1:1")

    async def take() -> None:
        api_key, version, correlation_id = wire.peek_head(frame, 0)
        plan = gen.plan(api_key, version)
        if plan.request_hooks:
            request = Request(frame, 0, len(frame), api_key, version, correlation_id, where, _no_coordinator, 0.0)  # type: ignore[arg-type]
            assert gen.check_request(request, plan.request_hooks) is None

    async def rounds() -> float:
        best = float("inf")
        for _ in range(5):
            started = trio.current_time()
            for _ in range(ROUNDS):
                await take()
            best = min(best, trio.current_time() - started)
        return best

    return trio.run(rounds) / ROUNDS * 1e6


def main() -> None:
    on, off = generation(True), generation(False)
    print(f"{'request':50} {'off us':>8} {'on us':>8} {'added us':>9}")
    for name, frame in frames().items():
        disabled, enabled = per_call_us(off, frame), per_call_us(on, frame)
        print(f"{name:50} {disabled:8.2f} {enabled:8.2f} {enabled - disabled:9.2f}")


if __name__ == "__main__":
    main()
