"""KIP-389 / KIP-848 through the proxy: real consumers in one group, a cap of 2;
the third join is answered GROUP_MAX_SIZE_REACHED by the proxy (the broker never
sees it), the first two keep consuming, and a slot freed by a leave is reused."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError

from tests.audit_files import read_events
from tests.clients import GROUP_CONF, create_topic, produce, unique
from tests.conftest import wait_until

CAP = {"group.max.size": 2}


class Member:
    """A confluent-kafka consumer polling in its own thread."""

    def __init__(self, bootstrap: str, topic: str, group: str, **conf: object) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **GROUP_CONF, **conf})
        # Assignment is recorded by callbacks on the polling thread: a confluent-kafka
        # consumer must not be called from two threads at once.
        self.consumer.subscribe([topic], on_assign=self._assigned, on_revoke=self._revoked)
        self.records = 0
        self.errors: list[KafkaError] = []
        self.assigned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            message = self.consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                self.errors.append(message.error())
                if message.error().fatal():
                    break
                continue
            self.records += 1
        self.consumer.close()

    def _assigned(self, _consumer: Consumer, partitions: list) -> None:  # type: ignore[type-arg]
        self.assigned = bool(partitions)

    def _revoked(self, _consumer: Consumer, _partitions: list) -> None:  # type: ignore[type-arg]
        self.assigned = False

    def has_assignment(self) -> bool:
        return self.assigned

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def wait_for(predicate, timeout: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


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


def refused(member: Member) -> bool:
    return any(e.code() == KafkaError.GROUP_MAX_SIZE_REACHED for e in member.errors)


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
        assert proxy.metric("kafka_admission_group_refusals_total", api="join_group", decision="refuse") >= 1
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


def test_a_static_member_that_restarts_is_not_counted_twice(tansu, start_proxy) -> None:  # type: ignore[no-untyped-def]
    proxy = start_proxy(tansu.bootstrap, policies=CAP)
    topic, group = unique("static"), unique("static-group")
    create_topic(proxy.bootstrap, topic, partitions=2)
    a = Member(proxy.bootstrap, topic, group, **{"group.instance.id": "a"})
    b = Member(proxy.bootstrap, topic, group, **{"group.instance.id": "b"})
    try:
        assert wait_for(lambda: a.has_assignment() and b.has_assignment())
        a.stop()  # a static member leaves without LeaveGroup ...
        again = Member(proxy.bootstrap, topic, group, **{"group.instance.id": "a"})  # ... and comes back
        assert wait_for(lambda: again.has_assignment(), timeout=40), again.errors
        assert not refused(again)
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
        assert proxy.metric("kafka_admission_group_refusals_total", decision="refuse", mode="observe") >= 1
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
