"""KIP-389 / KIP-848 through the proxy: real consumers in one group, a cap of 2;
the third join is answered GROUP_MAX_SIZE_REACHED by the proxy (the broker never
sees it), the first two keep consuming, and a slot freed by a leave is reused."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError

from tests.audit_files import read_events
from tests.clients import Member, create_topic, produce, refused, unique, wait_for
from tests.conftest import wait_until

CAP = {"group.max.size": 2}


def coordinator_members(bootstrap: str, group: str) -> int:
    """Members of ``group`` as the broker itself reports them (DescribeGroups sent to it directly)."""
    from kio.index import load_request_schema

    from tests.raw_kafka import RawConnection, frame

    request = load_request_schema(15, 5)(groups=(group,), include_authorized_operations=False)
    with RawConnection(bootstrap) as conn:
        conn.send(frame(15, 5, 1, request))
        described = conn.read_response(15, 5).body.groups[0]
    assert described.error_code == 0
    return len(described.members)


def test_the_third_confluent_consumer_is_refused_and_a_freed_slot_is_reused(tansu, start_proxy) -> None:  # type: ignore[no-untyped-def]
    proxy = start_proxy(tansu.bootstrap, policies=CAP)
    topic, group = unique("gs"), unique("capped")
    create_topic(proxy.bootstrap, topic, partitions=4)
    first = Member(proxy.bootstrap, topic, group)
    second = Member(proxy.bootstrap, topic, group)
    try:
        assert wait_for(lambda: first.has_assignment() and second.has_assignment())
        joins_before = proxy.metric("kafka_admission_requests_total", api="join_group")
        third = Member(proxy.bootstrap, topic, group)
        assert wait_for(lambda: refused(third)), third.errors
        assert proxy.metric(
            "kafka_admission_decisions_total", policy="group_size", action="refuse", limit="group.max.size"
        ) >= 1
        # librdkafka reports the refusal as an error and keeps retrying the join (every retry refused).
        assert third.errors[0].code() == KafkaError.GROUP_MAX_SIZE_REACHED
        assert not third.assigned
        # The broker never saw the third join: its coordinator has exactly the two members.
        assert coordinator_members(tansu.bootstrap, group) == 2
        # The two keep consuming.
        produce(proxy.bootstrap, topic, 40)
        assert wait_for(lambda: first.records + second.records >= 40)
        assert joins_before >= 2
        third.stop()
        # One leaves: a new consumer can join.
        first.stop()
        fourth = Member(proxy.bootstrap, topic, group)
        assert wait_for(lambda: fourth.has_assignment(), timeout=40), fourth.errors
        assert not refused(fourth)
        fourth.stop()
    finally:
        second.stop()


def test_a_static_member_restarting_in_a_full_group_waits_for_its_old_session_to_end(tansu, start_proxy) -> None:  # type: ignore[no-untyped-def]
    """As Apache Kafka does: refused while its old incarnation holds the slot. (That it joins once
    the old session ends is checked against Apache Kafka itself, in tests/apache_kafka.)"""
    proxy = start_proxy(tansu.bootstrap, policies=CAP)
    topic, group = unique("static"), unique("static-group")
    create_topic(proxy.bootstrap, topic, partitions=2)
    a = Member(proxy.bootstrap, topic, group, **{"group.instance.id": "a"})
    b = Member(proxy.bootstrap, topic, group, **{"group.instance.id": "b"})
    try:
        assert wait_for(lambda: a.has_assignment() and b.has_assignment())
        a.stop()  # a static member leaves without LeaveGroup ...
        again = Member(proxy.bootstrap, topic, group, **{"group.instance.id": "a"})  # ... and comes back
        assert wait_for(lambda: refused(again))
        assert not again.has_assignment() and b.has_assignment()
        again.stop()
    finally:
        b.stop()


def test_observe_mode_lets_the_third_join_and_audits_it(tansu, start_proxy, tmp_path) -> None:  # type: ignore[no-untyped-def]
    audit = tmp_path / "audit"
    proxy = start_proxy(tansu.bootstrap, policies={**CAP, "group.size.mode": "observe"}, audit={"path": str(audit)})
    topic, group = unique("obs"), unique("observed")
    create_topic(proxy.bootstrap, topic, partitions=3)
    members = [Member(proxy.bootstrap, topic, group) for _ in range(3)]
    try:
        assert wait_for(lambda: all(m.has_assignment() for m in members), timeout=40)
        assert not any(refused(m) for m in members)
        refusals = proxy.metric("kafka_admission_decisions_total", policy="group_size", action="refuse", mode="observe")
        assert refusals >= 1
        assert wait_until(lambda: [e for e in read_events(audit) if e.get("policy") == "group_size"])
    finally:
        for m in members:
            m.stop()


def test_kafka_python_third_consumer_is_refused(tansu, start_proxy) -> None:  # type: ignore[no-untyped-def]
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError as KafkaPythonError

    proxy = start_proxy(tansu.bootstrap, policies=CAP)
    topic, group = unique("kp-gs"), unique("kp-capped")
    create_topic(proxy.bootstrap, topic, partitions=3)

    def consumer() -> KafkaConsumer:
        return KafkaConsumer(topic, bootstrap_servers=proxy.bootstrap, group_id=group, session_timeout_ms=6000,
                             heartbeat_interval_ms=1000, consumer_timeout_ms=1000)

    members = [consumer(), consumer()]
    stop = threading.Event()

    def keep_polling(c: KafkaConsumer) -> None:
        while not stop.is_set():
            c.poll(timeout_ms=200)

    threads = [threading.Thread(target=keep_polling, args=(c,), daemon=True) for c in members]
    for t in threads:
        t.start()
    try:
        assert wait_for(lambda: all(c.assignment() for c in members), timeout=40)
        third = consumer()
        with pytest.raises(KafkaPythonError) as info:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                third.poll(timeout_ms=500)
        assert "GroupMaxSizeReached" in type(info.value).__name__ or "81" in str(info.value)
        third.close()
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        for c in members:
            c.close()


def test_two_proxies_in_front_of_one_broker_reconcile_the_group_size(tansu, start_proxy) -> None:  # type: ignore[no-untyped-def]
    """Each proxy sees only its own consumers; before admitting a join near the cap it asks the
    coordinator (DescribeGroups), learns the member the other proxy admitted, and refuses."""
    policies = {**CAP, "group.reconcile.interval.ms": 200}
    first_proxy = start_proxy(tansu.bootstrap, policies=policies)
    second_proxy = start_proxy(tansu.bootstrap, policies=policies)
    topic, group = unique("multi"), unique("two-proxies")
    create_topic(first_proxy.bootstrap, topic, partitions=2)
    a = Member(first_proxy.bootstrap, topic, group)
    try:
        assert wait_for(lambda: a.has_assignment())
        b = Member(second_proxy.bootstrap, topic, group)
        assert wait_for(lambda: b.has_assignment() and a.has_assignment(), timeout=40)
        time.sleep(0.5)  # past the reconcile interval
        c = Member(first_proxy.bootstrap, topic, group)
        assert wait_for(lambda: refused(c)), c.errors
        assert coordinator_members(tansu.bootstrap, group) == 2
        assert "reconciled group size with the coordinator" in first_proxy.log()
        c.stop()
        b.stop()
    finally:
        a.stop()
