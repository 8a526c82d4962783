"""Added cost per request of KIP-1233 identifier checks, in microseconds.

Measures RequestAdmission.check on real kio-encoded frames: a Produce (header
client id plus the peeked transactional id: the hot path), a Metadata request
(header client id only), and a JoinGroup (body decoded and every identifier
checked), each against the same call with the policy disabled. Run:

    .venv/bin/python bench/identifier_check_cost.py
"""

from __future__ import annotations

import datetime
import timeit

from kio.index import load_request_schema

from proxy import wire
from proxy.audit import AuditSink
from proxy.config import parse_config
from proxy.group_tracking import GroupTracking
from proxy.metrics import Metrics
from proxy.request_admission import RequestAdmission

ROUNDS = 200_000


def admission(enabled: bool) -> RequestAdmission:
    config = parse_config(
        {
            "upstream": {"bootstrap_servers": ["127.0.0.1:9092"]},
            "listeners": [{"name": "bench", "bind": "127.0.0.1:1"}],
            "policies": {"resource.identifier.limit.enable": enabled},
        }
    )
    metrics = Metrics()
    audit = AuditSink(config.audit, metrics)
    return RequestAdmission(config.policies, metrics, audit, GroupTracking(config.policies, metrics, audit))


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


def per_call_us(check: RequestAdmission, frame: bytes) -> float:
    header = wire.peek_request_header(frame)
    assert check.check(header, frame, "bench", "127.0.0.1:1") == (None, None)
    best = min(timeit.repeat(lambda: check.check(header, frame, "bench", "peer"), number=ROUNDS, repeat=5))
    return best / ROUNDS * 1e6


def main() -> None:
    on, off = admission(True), admission(False)
    print(f"{'request':50} {'off us':>8} {'on us':>8} {'added us':>9}")
    for name, frame in frames().items():
        disabled, enabled = per_call_us(off, frame), per_call_us(on, frame)
        print(f"{name:50} {disabled:8.2f} {enabled:8.2f} {enabled - disabled:9.2f}")


if __name__ == "__main__":
    main()
