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


def coordinator_group(bootstrap: str, group: str) -> tuple[str, int]:
    """The state and the members of ``group`` as the broker itself reports them (DescribeGroups
    sent to it directly)."""
    from kio.index import load_request_schema

    from tests.raw_kafka import RawConnection, frame

    request = load_request_schema(15, 5)(groups=(group,), include_authorized_operations=False)
    with RawConnection(bootstrap) as conn:
        conn.send(frame(15, 5, 1, request))
        described = conn.read_response(15, 5).body.groups[0]
    assert described.error_code == 0
    return described.group_state, len(described.members)


def coordinator_members(bootstrap: str, group: str) -> int:
    return coordinator_group(bootstrap, group)[1]


def settled(bootstrap: str, group: str, members: int) -> bool:
    """Whether the coordinator reports ``group`` Stable with ``members`` members. Every consumer
    holding an assignment is not enough before a join that must be refused: Tansu sometimes settles
    in two rounds, a member keeps its partitions until its heartbeat hears of the next one, and a
    join phase admits by other rules (as in Kafka: only the members awaiting join count)."""
    return coordinator_group(bootstrap, group) == ("Stable", members)


def test_the_third_confluent_consumer_is_refused_and_a_freed_slot_is_reused(tansu, start_proxy) -> None:  # type: ignore[no-untyped-def]
    proxy = start_proxy(tansu.bootstrap, policies=CAP)
    topic, group = unique("gs"), unique("capped")
    create_topic(proxy.bootstrap, topic, partitions=4)
    first = Member(proxy.bootstrap, topic, group)
    second = Member(proxy.bootstrap, topic, group)
    try:
        assert wait_for(lambda: first.has_assignment() and second.has_assignment())
        assert wait_for(lambda: settled(tansu.bootstrap, group, 2))
        joins_before = proxy.metric("kafka_admission_requests_total", api="join_group")
        third = Member(proxy.bootstrap, topic, group)
        assert wait_for(lambda: refused(third)), third.errors
        assert (
            proxy.metric(
                "kafka_admission_decisions_total", policy="group_size", action="refuse", limit="group.max.size"
            )
            >= 1
        )
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
        # One leaves: a new consumer can join. Its join rebalances the group, and the one member
        # left (second) rejoins, with its member id, a group then at its cap: a known member's
        # rejoin is admitted (Kafka's group.hasMember), so the four partitions end up split 2 / 2.
        first.stop()
        refusals = proxy.metric("kafka_admission_decisions_total", policy="group_size", action="refuse")
        fourth = Member(proxy.bootstrap, topic, group)
        assert wait_for(lambda: len(fourth.partitions) == 2 and len(second.partitions) == 2, timeout=40), (
            fourth.errors,
            second.errors,
        )
        assert not refused(fourth) and not refused(second)
        assert proxy.metric("kafka_admission_decisions_total", policy="group_size", action="refuse") == refusals
        assert coordinator_members(tansu.bootstrap, group) == 2
        fourth.stop()
    finally:
        second.stop()


def test_a_static_member_restarting_in_a_full_group_waits_for_its_old_session_to_end(tansu, start_proxy) -> None:  # type: ignore[no-untyped-def]
    """As Apache Kafka does: refused while its old incarnation holds the slot. (That it joins once
    the old session ends is checked against Apache Kafka itself, in tests/apache_kafka.)"""
    # At debug the proxy's log names each join's decision: a failure's report shows it (seen once, in CI)
    proxy = start_proxy(tansu.bootstrap, policies=CAP, extra_args=["--log-level", "DEBUG"])
    topic, group = unique("static"), unique("static-group")
    create_topic(proxy.bootstrap, topic, partitions=2)
    a = Member(proxy.bootstrap, topic, group, **{"group.instance.id": "a"})
    b = Member(proxy.bootstrap, topic, group, **{"group.instance.id": "b"})
    try:
        assert wait_for(lambda: a.has_assignment() and b.has_assignment())
        assert wait_for(lambda: settled(tansu.bootstrap, group, 2))  # else a join phase admits its new incarnation
        assert a.has_assignment() and b.has_assignment()
        a.stop()  # a static member leaves without LeaveGroup ...
        again = Member(proxy.bootstrap, topic, group, **{"group.instance.id": "a"})  # ... and comes back
        assert wait_for(lambda: refused(again)), (again.errors, again.partitions, b.partitions)
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
    from kafka.errors import GroupMaxSizeReachedError
    from kafka.errors import KafkaError as KafkaPythonError

    proxy = start_proxy(tansu.bootstrap, policies=CAP)
    topic, group = unique("kp-gs"), unique("kp-capped")
    create_topic(proxy.bootstrap, topic, partitions=3)

    def consumer() -> KafkaConsumer:
        return KafkaConsumer(
            topic,
            bootstrap_servers=proxy.bootstrap,
            group_id=group,
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
            consumer_timeout_ms=1000,
        )

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
        # kafka-python rejoins right after its first sync, and Tansu answers those rejoins with the
        # same generation: the proxy must see that no join phase ran (policies/group_size.py,
        # JOINS_ANSWERED_AT_ONCE), or it admits the third and refuses a member that rejoins last.
        assert wait_for(lambda: settled(tansu.bootstrap, group, 2))
        third = consumer()
        with pytest.raises(KafkaPythonError) as info:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                third.poll(timeout_ms=500)
        assert isinstance(info.value, GroupMaxSizeReachedError)
        assert info.value.errno == 81  # GROUP_MAX_SIZE_REACHED, by code
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
        assert wait_for(lambda: settled(tansu.bootstrap, group, 2))
        time.sleep(0.5)  # past the reconcile interval
        c = Member(first_proxy.bootstrap, topic, group)
        assert wait_for(lambda: refused(c)), c.errors
        assert coordinator_members(tansu.bootstrap, group) == 2
        assert "reconciled group size with the coordinator" in first_proxy.log()
        c.stop()
        b.stop()
    finally:
        a.stop()


def test_a_lowered_cap_shrinks_the_group_at_its_next_rebalance(tansu, start_proxy) -> None:  # type: ignore[no-untyped-def]
    """Four consumers under group.max.size=4; a reload lowers it to 2. As in Kafka the members stay
    until the group's next rebalance (here: one leaves), whose join phase admits the first two to
    rejoin and refuses the last, so the group ends at the new cap. The refused consumer is closed,
    as an application closes on this fatal error (the Java client throws it): Kafka's coordinator
    removes a member that did not rejoin when the join phase ends, Tansu may keep it in the next
    generation until it leaves (seen: the refused member was handed two partitions).

    The one that leaves is the group's leader, on purpose. Tansu (0.6.0) keeps a leader that
    leaves *during* a join phase as the leader (its Forming state's leave removes the member but not
    ``state.leader``): had the refused consumer been the leader, every later JoinGroup answer would
    name the departed member as leader, the two admitted ones would wait in SyncGroup for an
    assignment nobody sends (REBALANCE_IN_PROGRESS every 5 s, for ever). Kafka elects a new leader
    among the members that rejoined. A leader that leaves a *formed* group Tansu does clear, and the
    next join phase's first join, always one the proxy admits, leads."""
    proxy = start_proxy(tansu.bootstrap, policies={"group.max.size": 4})
    topic, group = unique("lowered"), unique("lowered")
    create_topic(proxy.bootstrap, topic, partitions=4)
    # max.poll.interval.ms is the rebalance timeout: the join phase waits that long for the refused one
    quick = {"heartbeat.interval.ms": 500, "max.poll.interval.ms": 10_000}
    # The first to join alone leads the group (Tansu: its first join), and keeps leading while it rejoins.
    leader = Member(proxy.bootstrap, topic, group, **quick)
    members = [leader]
    try:
        assert wait_for(lambda: leader.has_assignment(), timeout=30), leader.errors
        members += [Member(proxy.bootstrap, topic, group, **quick) for _ in range(3)]
        assert wait_for(lambda: all(m.has_assignment() for m in members), timeout=60), [m.errors for m in members]
        proxy.reload(**{"group.max.size": 2})
        assert all(m.has_assignment() for m in members)  # nobody is removed by the reload itself
        assert coordinator_members(tansu.bootstrap, group) == 4
        leader.stop()  # LeaveGroup: the next rebalance
        rejoining = members[1:]
        assert wait_for(lambda: sum(refused(m) for m in rejoining) == 1, timeout=40), [m.errors for m in rejoining]
        staying = [m for m in rejoining if not refused(m)]
        next(m for m in rejoining if refused(m)).stop()
        assert wait_for(lambda: all(len(m.partitions) == 2 for m in staying), timeout=40), [m.errors for m in staying]
        assert wait_for(lambda: coordinator_members(tansu.bootstrap, group) == 2, timeout=30)
        assert (
            proxy.metric(
                "kafka_admission_decisions_total", policy="group_size", action="refuse", limit="group.max.size"
            )
            >= 1
        )
    finally:
        for m in members:
            m.stop()


def test_the_join_rate_paces_new_consumers_and_the_group_still_settles(tansu, start_proxy) -> None:  # type: ignore[no-untyped-def]
    """group.join.rate.per.minute=2 (a bucket of two joins, one more every 30 s): two consumers take
    both tokens; the third is answered COORDINATOR_LOAD_IN_PROGRESS with a throttle time until a
    token comes, then joins. The two already in rejoin that rebalance without a token (throttled,
    a group bigger than the rate took turns for ever: first in, second out, and back). Nobody is
    refused, and the three end up with a partition each."""
    proxy = start_proxy(tansu.bootstrap, policies={"group.join.rate.per.minute": 2})
    topic, group = unique("paced"), unique("paced")
    create_topic(proxy.bootstrap, topic, partitions=3)
    quick = {"heartbeat.interval.ms": 500, "max.poll.interval.ms": 60_000}
    members = [Member(proxy.bootstrap, topic, group, **quick)]
    throttled = {"policy": "group_size", "action": "throttle", "limit": "group.join.rate.per.minute"}
    try:
        assert wait_for(lambda: members[0].has_assignment(), timeout=30), members[0].errors
        members.append(Member(proxy.bootstrap, topic, group, **quick))
        assert wait_for(lambda: all(m.has_assignment() for m in members), timeout=30), [m.errors for m in members]
        assert proxy.metric("kafka_admission_decisions_total", **throttled) == 0
        members.append(Member(proxy.bootstrap, topic, group, **quick))
        assert wait_until(lambda: proxy.metric("kafka_admission_decisions_total", **throttled) >= 1, timeout=30)
        assert not members[2].has_assignment()
        # paced, not refused: in once the bucket has a token again (30 s after the first join)
        assert wait_for(lambda: all(len(m.partitions) == 1 for m in members), timeout=90), [m.errors for m in members]
        assert not any(refused(m) for m in members)
        assert proxy.metric("kafka_admission_decisions_total", policy="group_size", action="refuse") == 0
        assert coordinator_members(tansu.bootstrap, group) == 3
    finally:
        for m in members:
            m.stop()
