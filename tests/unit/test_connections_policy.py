"""Connection quotas (sans-I/O): Kafka's ConnectionQuotas and KIP-1015's max.ssl.connections with LRU closing."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from policies.api_keys import INT_MAX
from policies.connections import (
    BOOTSTRAP,
    BrokerKey,
    BrokerQuotas,
    ConnectionLimits,
    ConnectionQuotas,
    OpenCounts,
    SlotLeases,
    bootstrap_broker,
    lease_keys,
    listener_max_connections_key,
)
from policies.decision import Action, Decision, Policy
from policies.mode import Mode
from policies.properties import (
    CONNECTIONS_MAX_IDLE_MS,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_IP,
    MAX_CONNECTIONS_PER_IP_OVERRIDES,
    MAX_SSL_CONNECTIONS,
)

TLS = "external_tls"
PLAIN = "external_plain"
INTERNAL = "replication"


def quotas(mode: Mode = Mode.ENFORCE, protected: tuple[str, ...] = (), **limits: object) -> ConnectionQuotas:
    return ConnectionQuotas(ConnectionLimits(**limits), mode=mode, protected_listeners=protected)  # type: ignore[arg-type]


def accept(
    q: ConnectionQuotas,
    conn_id: str,
    *,
    listener: str = TLS,
    ip: str = "10.0.0.1",
    tls: bool | None = None,
    now: float = 0.0,
) -> Decision | None:
    return q.on_accept(conn_id, listener=listener, ip=ip, tls=(listener != PLAIN) if tls is None else tls, now=now)


def admitted(decision: Decision | None) -> bool:
    """What the shell does with on_accept's answer: admit, or not (yet)."""
    return decision is None or decision.action is Action.EVICT or not decision.enforced


def decided(decision: Decision | None, action: Action, mode: Mode = Mode.ENFORCE) -> Decision:
    assert decision is not None, f"admitted plainly, expected {action}"
    assert (decision.policy, decision.action, decision.mode) == (Policy.CONNECTIONS, action, mode), decision
    return decision


def evicts(decision: Decision | None) -> tuple[str, ...]:
    """The victims of an enforced EVICT."""
    return decided(decision, Action.EVICT).victims


def waits(decision: Decision | None) -> Decision:
    return decided(decision, Action.WAIT)


def refuses(decision: Decision | None) -> Decision:
    return decided(decision, Action.REFUSE)


def closed(closes: list[Decision], mode: Mode = Mode.ENFORCE) -> list[str]:
    """The connections a list of CLOSE decisions names, one each, in order."""
    for close in closes:
        assert (close.policy, close.action, close.mode, len(close.victims)) == (
            Policy.CONNECTIONS,
            Action.CLOSE,
            mode,
            1,
        )
    return [c.victims[0] for c in closes]


def fill_tls(q: ConnectionQuotas, n: int, *, start: float = 0.0) -> list[str]:
    """n idle TLS connections, accepted one second apart: tls-0 is the least recently used."""
    ids = [f"tls-{i}" for i in range(n)]
    for i, conn_id in enumerate(ids):
        assert accept(q, conn_id, ip=f"10.0.{i // 250}.{i % 250}", now=start + i) is None
    return ids


def make_busy(q: ConnectionQuotas, conn_ids: list[str], now: float) -> None:
    for conn_id in conn_ids:
        q.on_request(conn_id, now)


# ---------------------------------------------------------------------------
# KIP-1015: max.ssl.connections


def test_the_51st_tls_connection_evicts_exactly_the_least_recently_used_idle_one() -> None:
    q = quotas(max_ssl_connections=50)
    ids = fill_tls(q, 50)
    q.on_request("tls-0", 100.0)  # tls-0 was accepted first but is the most recently active now
    q.on_response("tls-0", 101.0)

    decision = accept(q, "tls-50", now=102.0)

    assert evicts(decision) == ("tls-1",)
    assert decision is not None
    assert decision.limit_key == MAX_SSL_CONNECTIONS == "max.ssl.connections"
    assert decision.limit == 50
    assert "max.ssl.connections=50 reached" in decision.reason
    # the evicted one is still counted until the shell reports it closed
    assert q.counts().ssl == 51 and q.counts().closing == 1 and q.is_closing("tls-1")
    q.on_closed("tls-1")
    assert q.counts().ssl == 50 and q.counts().closing == 0
    assert "tls-1" not in q and "tls-50" in q and all(c in q for c in ids if c != "tls-1")


def test_a_closing_connection_makes_room_first_and_is_never_named_twice() -> None:
    q = quotas(max_ssl_connections=50)
    fill_tls(q, 50)
    first = accept(q, "new-1", now=60.0)
    second = accept(q, "new-2", now=61.0)  # tls-0 not yet closed by the shell
    assert evicts(first) == ("tls-0",)
    assert evicts(second) == ("tls-1",)
    assert q.counts().ssl == 52 and q.counts().closing == 2
    q.on_closed("tls-0")
    q.on_closed("tls-1")
    assert q.counts().ssl == 50


def test_a_plaintext_connection_is_admitted_while_the_tls_cap_is_full() -> None:
    q = quotas(max_ssl_connections=50)
    fill_tls(q, 50)
    make_busy(q, [f"tls-{i}" for i in range(50)], 60.0)
    waits(accept(q, "tls-50", now=61.0))

    assert accept(q, "plain-0", listener=PLAIN, now=62.0) is None
    assert q.counts().ssl == 50 and q.counts().broker == 51


def test_plaintext_connections_are_never_evicted_for_the_tls_cap() -> None:
    q = quotas(max_ssl_connections=1)
    assert accept(q, "plain-old", listener=PLAIN, now=0.0) is None
    assert accept(q, "tls-0", now=1.0) is None
    q.on_request("tls-0", 2.0)

    decision = accept(q, "tls-1", now=3.0)
    assert waits(decision).limit_key == MAX_SSL_CONNECTIONS
    assert "plain-old" in q and not q.is_closing("plain-old")


def test_busy_connections_are_never_evicted_even_when_least_recently_used() -> None:
    q = quotas(max_ssl_connections=50)
    fill_tls(q, 50)
    make_busy(q, [f"tls-{i}" for i in range(49)], 60.0)  # only tls-49, the newest, is idle

    decision = accept(q, "tls-50", now=61.0)

    assert evicts(decision) == ("tls-49",)
    assert not any(q.is_closing(f"tls-{i}") for i in range(49))


def test_when_every_tls_connection_is_busy_the_next_waits_and_is_admitted_after_one_closes() -> None:
    q = quotas(max_ssl_connections=50)
    fill_tls(q, 50)
    make_busy(q, [f"tls-{i}" for i in range(50)], 60.0)

    decision = waits(accept(q, "tls-50", now=61.0))

    assert decision.limit_key == MAX_SSL_CONNECTIONS and decision.limit == 50
    assert decision.reason == "max.ssl.connections=50 reached; no idle TLS connection to close"
    assert not decision.victims
    assert "tls-50" not in q and q.counts().ssl == 50  # a waiting connection is not counted
    waits(accept(q, "tls-50", now=61.5))  # asked again: still waiting, still not counted
    assert "tls-50" not in q and q.counts().ssl == 50
    assert accept(q, "plain-0", listener=PLAIN, now=61.6) is None  # plaintext is not held up

    q.on_closed("tls-17")
    assert accept(q, "tls-50", now=62.0) is None  # the shell retries the same connection
    assert q.counts().ssl == 50


def test_a_waiting_connection_is_admitted_by_evicting_one_that_turned_idle() -> None:
    q = quotas(max_ssl_connections=3)
    fill_tls(q, 3)
    make_busy(q, ["tls-0", "tls-1", "tls-2"], 10.0)
    waits(accept(q, "tls-3", now=11.0))

    q.on_response("tls-1", 12.0)

    assert evicts(accept(q, "tls-3", now=13.0)) == ("tls-1",)


def test_pipelined_requests_keep_a_connection_busy_until_the_last_response() -> None:
    q = quotas(max_ssl_connections=1)
    accept(q, "a", now=0.0)
    q.on_request("a", 1.0)
    q.on_request("a", 1.0)
    q.on_response("a", 2.0)
    assert q.in_flight("a") == 1
    waits(accept(q, "b", now=3.0))
    q.on_response("a", 4.0)
    assert q.in_flight("a") == 0 and accept(q, "b", now=5.0) == Decision(
        Policy.CONNECTIONS,
        Action.EVICT,
        Mode.ENFORCE,
        MAX_SSL_CONNECTIONS,
        q_reason(MAX_SSL_CONNECTIONS, 1),
        limit=1,
        victims=("a",),
    )


def q_reason(key: str, limit: int) -> str:
    return f"{key}={limit} reached: closing the least recently used idle connection"


# ---------------------------------------------------------------------------
# max.connections.per.ip and max.connections.per.ip.overrides


def test_a_connection_over_max_connections_per_ip_is_refused_at_once() -> None:
    q = quotas(max_connections_per_ip=2)
    assert accept(q, "a", ip="127.0.0.1") is None
    assert accept(q, "b", ip="127.0.0.1") is None

    decision = accept(q, "c", ip="127.0.0.1")

    assert decision == Decision(
        Policy.CONNECTIONS,
        Action.REFUSE,
        Mode.ENFORCE,
        MAX_CONNECTIONS_PER_IP,
        "max.connections.per.ip=2 reached for 127.0.0.1",
        limit=2,
        subject={"ip": "127.0.0.1"},
    )
    assert not admitted(decision) and "c" not in q and q.ip_count("127.0.0.1") == 2
    assert accept(q, "d", ip="127.0.0.3") is None  # other addresses are unaffected


def test_an_override_raises_the_limit_for_one_address() -> None:
    q = quotas(max_connections_per_ip=1, max_connections_per_ip_overrides={"127.0.0.2": 3})
    assert accept(q, "a1", ip="127.0.0.1") is None
    refuses(accept(q, "a2", ip="127.0.0.1"))
    for i in range(3):
        assert accept(q, f"b{i}", ip="127.0.0.2") is None

    decision = refuses(accept(q, "b3", ip="127.0.0.2"))

    assert decision.limit_key == MAX_CONNECTIONS_PER_IP_OVERRIDES and decision.limit == 3
    assert decision.reason == "max.connections.per.ip.overrides[127.0.0.2]=3 reached for 127.0.0.2"


def test_an_override_of_zero_refuses_an_address_entirely() -> None:
    q = quotas(max_connections_per_ip_overrides={"192.0.2.9": 0})
    refuses(accept(q, "x", ip="192.0.2.9"))
    assert accept(q, "y", ip="192.0.2.10") is None


def test_the_per_ip_limit_never_evicts_idle_connections_of_that_address() -> None:
    q = quotas(max_connections_per_ip=1)
    accept(q, "old-idle", ip="127.0.0.1", now=0.0)
    refuses(accept(q, "new", ip="127.0.0.1", now=1000.0))
    assert not q.is_closing("old-idle") and q.counts().closing == 0
    q.on_closed("old-idle")
    assert accept(q, "new", ip="127.0.0.1", now=1001.0) is None


def test_the_per_ip_limit_is_checked_before_evicting_for_a_cap() -> None:
    q = quotas(max_ssl_connections=1, max_connections_per_ip=1)
    accept(q, "a", ip="127.0.0.1")
    refuses(accept(q, "b", ip="127.0.0.1"))  # not EVICT a
    assert not q.is_closing("a")


def test_the_per_ip_limit_counts_protected_listeners_and_closing_connections() -> None:
    q = quotas(protected=(INTERNAL,), max_connections_per_ip=2, max_ssl_connections=1)
    accept(q, "r", listener=INTERNAL, ip="10.1.1.1", tls=False)
    accept(q, "a", ip="10.1.1.1")
    refuses(accept(q, "b", ip="10.1.1.1"))
    assert evicts(accept(q, "c", ip="10.9.9.9")) == ("a",)  # a is closing but still counted
    refuses(accept(q, "d", ip="10.1.1.1"))
    q.on_closed("a")
    assert q.ip_count("10.1.1.1") == 1


def test_open_counts_are_what_each_cap_compared_after_admitting_the_connection() -> None:
    q = quotas(protected=(INTERNAL,), max_ssl_connections=2)
    accept(q, "r", listener=INTERNAL, ip="10.1.1.1", tls=False)
    assert q.open_counts("r") == OpenCounts(None, None, 1)  # protected: only its IP counts it
    accept(q, "t1", ip="10.1.1.1")
    assert q.open_counts("t1") == OpenCounts(1, 1, 2)
    accept(q, "p1", listener=PLAIN, ip="10.2.2.2")
    assert q.open_counts("p1") == OpenCounts(2, None, 1)  # plaintext: not counted by the TLS cap
    accept(q, "t2", ip="10.2.2.2")
    assert evicts(accept(q, "t3", ip="10.2.2.2")) == ("t1",)
    # t1 is closing: the caps no longer count it, its IP still does (as max.connections.per.ip does)
    assert q.open_counts("t3") == OpenCounts(3, 2, 3)
    assert q.open_counts("r") == OpenCounts(None, None, 2)


# ---------------------------------------------------------------------------
# listener.name.<listener>.max.connections and max.connections


def test_a_full_listener_evicts_its_own_least_recently_used_idle_connection() -> None:
    q = quotas(listener_max_connections={TLS: 2})
    accept(q, "other-oldest", listener=PLAIN, now=0.0)
    accept(q, "l-0", now=1.0)
    accept(q, "l-1", now=2.0)

    decision = accept(q, "l-2", now=3.0)

    assert evicts(decision) == ("l-0",) and decision is not None
    assert decision.limit_key == listener_max_connections_key(TLS) == f"listener.name.{TLS}.max.connections"
    assert decision.reason.startswith(f"listener.name.{TLS}.max.connections=2 reached")
    assert accept(q, "p", listener=PLAIN, now=4.0) is None  # other listeners are unaffected


def test_a_full_listener_waits_when_its_connections_are_busy_though_others_are_idle() -> None:
    q = quotas(listener_max_connections={TLS: 2})
    accept(q, "other-idle", listener=PLAIN, now=0.0)
    accept(q, "l-0", now=1.0)
    accept(q, "l-1", now=2.0)
    make_busy(q, ["l-0", "l-1"], 3.0)

    decision = waits(accept(q, "l-2", now=4.0))

    assert decision.limit_key == listener_max_connections_key(TLS) and decision.limit == 2
    assert decision.reason == f"listener.name.{TLS}.max.connections=2 reached; no idle {TLS} connection to close"
    assert not q.is_closing("other-idle")


def test_the_listener_cap_applies_to_a_protected_listener_too() -> None:
    q = quotas(protected=(INTERNAL,), listener_max_connections={INTERNAL: 1})
    accept(q, "r-0", listener=INTERNAL, tls=False, now=0.0)
    assert evicts(accept(q, "r-1", listener=INTERNAL, tls=False, now=1.0)) == ("r-0",)


def test_the_broker_wide_cap_evicts_across_listeners_but_never_a_protected_connection() -> None:
    q = quotas(protected=(INTERNAL,), max_connections=2)
    accept(q, "replica-oldest", listener=INTERNAL, tls=False, now=0.0)
    accept(q, "plain-0", listener=PLAIN, now=1.0)
    accept(q, "tls-0", now=2.0)
    assert q.counts().broker == 2 and q.counts().total == 3

    decision = accept(q, "tls-1", now=3.0)

    assert evicts(decision) == ("plain-0",) and decision is not None
    assert decision.limit_key == MAX_CONNECTIONS and "max.connections=2 reached" in decision.reason
    assert not q.is_closing("replica-oldest")


def test_a_protected_listener_is_exempt_from_the_broker_wide_and_tls_caps() -> None:
    q = quotas(protected=(INTERNAL,), max_connections=1, max_ssl_connections=1)
    accept(q, "client", now=0.0)
    q.on_request("client", 0.5)
    waits(accept(q, "client-2", now=1.0))

    for i in range(5):
        assert accept(q, f"replica-{i}", listener=INTERNAL, tls=True, now=2.0 + i) is None
    counts = q.counts()
    assert counts.total == 6 and counts.broker == 1 and counts.ssl == 1
    assert counts.listeners == {TLS: 1, INTERNAL: 5}


def test_when_two_caps_are_full_one_connection_in_both_is_evicted() -> None:
    q = quotas(listener_max_connections={TLS: 2}, max_ssl_connections=3)
    accept(q, "other-tls-oldest", listener="other_tls", tls=True, now=0.0)
    accept(q, "l-0", now=1.0)
    accept(q, "l-1", now=2.0)

    decision = accept(q, "l-2", now=3.0)

    # other-tls-oldest is the LRU TLS connection, but l-0 relieves both caps at once
    assert evicts(decision) == ("l-0",) and decision is not None
    assert decision.limit_key == listener_max_connections_key(TLS)
    assert "max.ssl.connections=3 reached" in decision.reason


def test_when_two_caps_are_full_and_nothing_is_in_both_one_of_each_is_evicted() -> None:
    q = quotas(listener_max_connections={TLS: 2}, max_ssl_connections=2)
    accept(q, "other-tls", listener="other_tls", tls=True, now=0.0)
    accept(q, "l-0", now=1.0)
    accept(q, "plain", listener=TLS, tls=False, now=2.0)  # a plaintext connection under the same listener name
    q.on_request("l-0", 3.0)  # the one connection in both classes is busy

    decision = accept(q, "l-1", now=4.0)

    assert sorted(evicts(decision)) == ["other-tls", "plain"] and decision is not None
    assert decision.reason.endswith("closing the 2 least recently used idle connections")


def test_a_cap_of_zero_admits_nothing_but_protected_listeners() -> None:
    q = quotas(protected=(INTERNAL,), max_connections=0, max_ssl_connections=0)
    waits(accept(q, "a"))
    waits(accept(q, "b", listener=PLAIN))
    assert accept(q, "r", listener=INTERNAL, tls=True) is None


# ---------------------------------------------------------------------------
# dynamic limits


def test_lowering_max_ssl_connections_from_50_to_10_closes_the_40_least_recently_used() -> None:
    q = quotas(max_ssl_connections=50)
    ids = fill_tls(q, 50)
    # reorder activity: odd connections become the most recent
    for i, conn_id in enumerate(ids[1::2]):
        q.on_request(conn_id, 100.0 + i)
        q.on_response(conn_id, 100.5 + i)
    lru_order = ids[0::2] + ids[1::2]

    closes = q.update_limits(ConnectionLimits(max_ssl_connections=10), now=200.0)

    assert closed(closes) == lru_order[:40]
    assert all(c.limit_key == MAX_SSL_CONNECTIONS and c.limit == 10 for c in closes)
    assert all("max.ssl.connections=10 exceeded" in c.reason for c in closes)
    assert all(q.is_closing(conn_id) for conn_id in closed(closes))
    assert not q.over_cap  # nothing busy was left over the cap
    for conn_id in closed(closes):
        q.on_closed(conn_id)
    assert q.counts().ssl == 10 and sorted(q.counts().listeners.items()) == [(TLS, 10)]


def test_lowering_below_the_busy_connections_leaves_them_and_reclaims_them_when_idle() -> None:
    q = quotas(max_ssl_connections=10)
    ids = fill_tls(q, 10)
    make_busy(q, ids[:6], 20.0)  # the six least recently accepted are busy

    closes = q.update_limits(ConnectionLimits(max_ssl_connections=2), now=21.0)

    assert closed(closes) == ids[6:]  # only the idle ones
    for conn_id in closed(closes):
        q.on_closed(conn_id)
    assert q.counts().ssl == 6  # over the new cap until the busy ones finish
    assert q.over_cap
    waits(accept(q, "new", now=22.0))
    assert q.reclaim_excess() == []  # nothing idle to reclaim

    q.on_response(ids[0], 23.0)
    reclaimed = q.reclaim_excess()
    assert closed(reclaimed) == [ids[0]] and reclaimed[0].limit_key == MAX_SSL_CONNECTIONS
    assert reclaimed[0].reason == "max.ssl.connections=2 exceeded: closing the least recently used idle connection"
    assert q.over_cap  # ids[1:6], busy, are still 5 over a cap of 2
    q.on_closed(ids[0])
    for conn_id in ids[1:4]:
        q.on_closed(conn_id)  # clients go away
    assert q.counts().ssl == 2 and not q.over_cap  # at the cap, no longer over it
    q.on_closed(ids[4])
    assert q.counts().ssl == 1
    assert accept(q, "new", now=24.0) is None
    assert q.counts().ssl == 2


def test_over_cap_holds_only_while_busy_connections_keep_a_lowered_cap_exceeded() -> None:
    q = quotas(listener_max_connections={TLS: 3})
    for i in range(3):
        accept(q, f"l-{i}", now=float(i))
    assert not q.over_cap  # at a cap is not over it
    make_busy(q, ["l-0", "l-1"], 5.0)

    closes = q.update_limits(ConnectionLimits(listener_max_connections={TLS: 1}), now=6.0)

    assert closed(closes) == ["l-2"] and q.over_cap  # l-0 and l-1 are busy: 2 live over 1
    q.on_closed("l-2")
    assert q.over_cap
    assert q.update_limits(ConnectionLimits(listener_max_connections={TLS: 2}), now=7.0) == []
    assert not q.over_cap  # raised to the busy count
    assert q.update_limits(ConnectionLimits(listener_max_connections={TLS: 1}), now=8.0) == []
    assert q.over_cap
    q.on_response("l-1", 9.0)
    assert closed(q.reclaim_excess()) == ["l-1"]
    assert not q.over_cap  # l-1 is closing: it no longer counts against the cap
    assert q.reclaim_excess() == []


def test_over_cap_is_false_in_observe_mode_though_caps_are_exceeded() -> None:
    q = quotas(Mode.OBSERVE, max_ssl_connections=1)
    accept(q, "a")
    accept(q, "b")
    assert q.counts().ssl == 2 and not q.over_cap
    assert q.reclaim_excess() == []


def test_a_new_connection_over_a_lowered_cap_evicts_enough_to_land_at_the_cap() -> None:
    q = quotas(max_ssl_connections=4)
    ids = fill_tls(q, 4)
    make_busy(q, ids, 10.0)
    assert q.update_limits(ConnectionLimits(max_ssl_connections=2), now=11.0) == []
    for i, conn_id in enumerate(ids):
        q.on_response(conn_id, 12.0 + i)

    decision = accept(q, "new", now=20.0)

    assert evicts(decision) == tuple(ids[:3])
    assert q.counts().ssl - q.counts().closing == 2


def test_raising_a_limit_takes_effect_at_once() -> None:
    q = quotas(max_ssl_connections=1)
    accept(q, "a", now=0.0)
    q.on_request("a", 0.0)
    waits(accept(q, "b", now=1.0))

    assert q.update_limits(ConnectionLimits(max_ssl_connections=2), now=2.0) == []

    assert accept(q, "b", now=3.0) is None


def test_lowering_a_listener_cap_closes_only_that_listeners_excess() -> None:
    q = quotas()
    for i in range(3):
        accept(q, f"p-{i}", listener=PLAIN, now=float(i))
        accept(q, f"t-{i}", now=10.0 + i)
    closes = q.update_limits(ConnectionLimits(listener_max_connections={TLS: 1}), now=20.0)
    assert closed(closes) == ["t-0", "t-1"]
    assert {c.limit_key for c in closes} == {listener_max_connections_key(TLS)}


def test_lowering_a_per_ip_limit_closes_nothing() -> None:
    q = quotas()
    for i in range(3):
        accept(q, f"c{i}", ip="127.0.0.1")
    assert q.update_limits(ConnectionLimits(max_connections_per_ip=1), now=1.0) == []
    assert refuses(accept(q, "c3", ip="127.0.0.1", now=2.0)).limit == 1


def test_lowering_connections_max_idle_ms_expires_connections_at_once() -> None:
    q = quotas()
    accept(q, "a", now=0.0)
    accept(q, "b", now=5.0)
    closes = q.update_limits(ConnectionLimits(connections_max_idle_ms=2000), now=6.0)
    assert closes == [
        Decision(
            Policy.CONNECTIONS,
            Action.CLOSE,
            Mode.ENFORCE,
            CONNECTIONS_MAX_IDLE_MS,
            "connections.max.idle.ms=2000 exceeded (idle 6.000s)",
            limit=2000,
            victims=("a",),
        )
    ]


# ---------------------------------------------------------------------------
# connections.max.idle.ms


def test_idle_connections_expire_after_connections_max_idle_ms_lru_first() -> None:
    q = quotas(connections_max_idle_ms=1000)
    accept(q, "a", now=0.0)
    accept(q, "busy", now=0.1)
    q.on_request("busy", 0.2)
    accept(q, "b", listener=PLAIN, now=0.5)

    assert q.idle_expired(1.0) == []  # exactly max idle is not more than it (Kafka: strictly greater)
    assert q.next_idle_deadline() == 1.0
    assert closed(q.idle_expired(1.2)) == ["a"]
    assert q.next_idle_deadline() == 1.5
    closes = q.idle_expired(60.0)
    assert closed(closes) == ["b"]  # a is already closing, busy is busy
    assert closes[0].limit_key == CONNECTIONS_MAX_IDLE_MS and "connections.max.idle.ms=1000" in closes[0].reason
    assert q.next_idle_deadline() is None

    q.on_response("busy", 61.0)
    assert q.idle_expired(61.9) == []
    assert closed(q.idle_expired(62.1)) == ["busy"]


def test_activity_postpones_idle_expiry() -> None:
    q = quotas(connections_max_idle_ms=1000)
    accept(q, "a", now=0.0)
    q.on_request("a", 0.9)
    q.on_response("a", 0.95)
    assert q.idle_expired(1.5) == []
    assert closed(q.idle_expired(2.0)) == ["a"]


def test_a_negative_connections_max_idle_ms_disables_idle_expiry() -> None:
    q = quotas(connections_max_idle_ms=-1)
    accept(q, "a", now=0.0)
    assert q.idle_expired(1e9) == [] and q.next_idle_deadline() is None


def test_an_idle_expired_connection_is_closing_and_not_evicted_again() -> None:
    q = quotas(connections_max_idle_ms=1000, max_ssl_connections=2)
    accept(q, "a", now=0.0)
    accept(q, "b", now=5.0)
    assert closed(q.idle_expired(5.5)) == ["a"]
    assert accept(q, "c", now=6.0) is None  # a's slot is already free
    assert evicts(accept(q, "d", now=7.0)) == ("b",)


# ---------------------------------------------------------------------------
# observe mode


def test_observe_mode_admits_everything_and_reports_what_enforce_would_have_done() -> None:
    q = quotas(Mode.OBSERVE, max_ssl_connections=2, max_connections_per_ip=3)
    assert accept(q, "a", now=0.0) is None
    accept(q, "b", now=1.0)
    q.on_request("b", 2.0)

    evicting = decided(accept(q, "c", now=3.0), Action.EVICT, Mode.OBSERVE)
    assert admitted(evicting) and not evicting.enforced
    assert evicting.victims == ("a",) and evicting.limit_key == MAX_SSL_CONNECTIONS
    assert evicting.reason.startswith("max.ssl.connections=2 reached")
    assert not q.is_closing("a") and q.counts().closing == 0

    refused = decided(accept(q, "d", now=4.0), Action.REFUSE, Mode.OBSERVE)  # 4th from 10.0.0.1
    assert admitted(refused) and "d" in q
    assert refused.limit_key == MAX_CONNECTIONS_PER_IP and refused.limit == 3

    for conn_id in ("a", "c", "d"):
        q.on_request(conn_id, 5.0)
    waiting = decided(accept(q, "e", ip="10.0.0.2", now=6.0), Action.WAIT, Mode.OBSERVE)
    assert admitted(waiting) and "e" in q

    assert q.counts().ssl == 5 and q.ip_count("10.0.0.1") == 4  # real connections, over the caps
    assert not q.over_cap  # exceeding caps is expected in a dry run: nothing to reclaim
    assert admitted(decided(accept(q, "f", ip="10.0.0.3", now=7.0), Action.WAIT, Mode.OBSERVE)) and "f" in q


def test_observe_mode_reports_closings_without_closing() -> None:
    q = quotas(Mode.OBSERVE, connections_max_idle_ms=1000)
    for i in range(4):
        accept(q, f"c{i}", now=float(i))

    lowered = q.update_limits(ConnectionLimits(max_ssl_connections=1, connections_max_idle_ms=1000), now=3.5)
    assert [(c.victims, c.limit_key, c.mode) for c in lowered] == [
        (("c0",), MAX_SSL_CONNECTIONS, Mode.OBSERVE),
        (("c1",), MAX_SSL_CONNECTIONS, Mode.OBSERVE),
        (("c2",), MAX_SSL_CONNECTIONS, Mode.OBSERVE),
    ]
    assert closed(lowered, Mode.OBSERVE) == ["c0", "c1", "c2"]
    assert q.counts().closing == 0 and q.reclaim_excess() == []


def test_observe_mode_still_closes_idle_connections() -> None:
    """Idle expiry is the proxy's hygiene, not a cap: a dry run must not hold silent clients."""
    q = quotas(Mode.OBSERVE, connections_max_idle_ms=1000)
    for i in range(4):
        accept(q, f"c{i}", now=float(i))
    q.on_request("c2", 3.0)  # busy: not idle however long its request takes

    assert closed(q.idle_expired(10.0)) == ["c0", "c1", "c3"]  # enforced, LRU first
    assert q.counts().closing == 3 and q.idle_expired(20.0) == []
    assert q.next_idle_deadline() is None
    q.on_response("c2", 21.0)
    assert q.next_idle_deadline() == 22.0
    assert closed(q.idle_expired(30.0)) == ["c2"]


# ---------------------------------------------------------------------------
# limits validation and decision values


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"max_connections": -1}, "max.connections must be >= 0"),
        ({"max_ssl_connections": -5}, "max.ssl.connections must be >= 0"),
        ({"max_connections_per_ip": -1}, "max.connections.per.ip must be >= 0"),
        ({"max_connections_per_ip": 0}, "max.connections.per.ip can be set to zero only if"),
        ({"max_connections_per_ip_overrides": {"127.0.0.1": -1}}, "max.connections.per.ip.overrides[127.0.0.1] must"),
        ({"max_connections_per_ip_overrides": {"": 3}}, "max.connections.per.ip.overrides keys"),
        ({"listener_max_connections": {"external": 0}}, "listener.name.external.max.connections must be >= 1"),
        ({"max_connections": INT_MAX + 1}, "max.connections must be <= 2147483647"),
        ({"max_ssl_connections": True}, "max.ssl.connections must be an integer"),
        ({"max_connections": 1.5}, "max.connections must be an integer"),
        ({"connections_max_idle_ms": 2**63}, "connections.max.idle.ms must be <="),
    ],
)
def test_invalid_limits_are_refused_naming_the_key_and_the_rule(limits: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ConnectionLimits(**limits)  # type: ignore[arg-type]


def test_kafka_defaults_and_valid_edge_values() -> None:
    limits = ConnectionLimits()
    assert limits.max_connections == limits.max_connections_per_ip == limits.max_ssl_connections == 2147483647
    assert limits.connections_max_idle_ms == 600_000
    zero_with_overrides = ConnectionLimits(max_connections_per_ip=0, max_connections_per_ip_overrides={"10.0.0.1": 5})
    assert zero_with_overrides.per_ip_limit("10.0.0.1") == (5, MAX_CONNECTIONS_PER_IP_OVERRIDES)
    assert zero_with_overrides.per_ip_limit("10.0.0.2") == (0, MAX_CONNECTIONS_PER_IP)
    assert ConnectionLimits(max_connections=0, max_ssl_connections=0).max_connections == 0


def test_limits_and_decisions_are_frozen_values() -> None:
    source = {"external": 3}
    limits = ConnectionLimits(listener_max_connections=source)
    source["external"] = 1
    assert limits.listener_limit("external") == 3
    with pytest.raises(TypeError):
        limits.listener_max_connections["external"] = 1  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.max_connections = 1  # type: ignore[misc]
    q = quotas(max_connections=1)
    accept(q, "a")
    decision = decided(accept(q, "b"), Action.EVICT)
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.victims = ("b",)  # type: ignore[misc]


def test_update_limits_accepts_only_connection_limits() -> None:
    with pytest.raises(TypeError):
        quotas().update_limits({"max_connections": 1}, now=0.0)  # type: ignore[arg-type]


def test_a_connection_id_cannot_be_counted_twice() -> None:
    q = quotas()
    accept(q, "a")
    with pytest.raises(ValueError, match="already counted"):
        accept(q, "a")


def test_unknown_connection_ids_are_ignored_by_activity_and_close() -> None:
    q = quotas()
    q.on_request("ghost", 0.0)
    q.on_response("ghost", 0.0)
    q.on_closed("ghost")
    accept(q, "a")
    q.on_closed("a")
    q.on_closed("a")  # twice: idempotent
    assert q.counts().total == 0 and q.ip_count("10.0.0.1") == 0


def test_ten_thousand_connections_at_the_tls_cap_evict_in_lru_order() -> None:
    n = 10_000
    q = quotas(max_ssl_connections=n)
    ids = fill_tls(q, n)
    make_busy(q, ids[: n // 2], float(n))  # the older half is busy
    for i in range(n):
        victims = evicts(accept(q, f"new-{i}", ip="10.9.9.9", now=float(n + 1 + i)))
        # the older half is busy: the LRU idle ones are the newer half, then the new ones, in order
        expected = ids[n // 2 + i] if i < n // 2 else f"new-{i - n // 2}"
        assert victims == (expected,)
        q.on_closed(expected)
    assert q.counts().ssl == n and q.counts().busy == n // 2


# ---------------------------------------------------------------------------
# stateful model check

LISTENERS = {"plain": False, "tls_a": True, "tls_b": True, "internal": True}  # name -> TLS
PROTECTED = ("internal",)
IPS = ("10.0.0.1", "10.0.0.2", "10.0.0.3")

limits_strategy = st.builds(
    ConnectionLimits,
    # caps of 0 are reached by lower_a_cap_below_its_count; small caps here keep every limit in play
    max_connections=st.integers(3, 12) | st.just(INT_MAX),
    max_connections_per_ip=st.integers(2, 8) | st.just(INT_MAX),
    max_connections_per_ip_overrides=st.dictionaries(st.sampled_from(IPS), st.integers(0, 6), max_size=2),
    max_ssl_connections=st.integers(2, 8) | st.just(INT_MAX),
    listener_max_connections=st.dictionaries(st.sampled_from(sorted(LISTENERS)), st.integers(1, 6), max_size=3),
    connections_max_idle_ms=st.sampled_from([600_000, 300, 1000, -1]),
)
steps = st.sampled_from([0.0, 0.0, 0.2, 0.7, 1.5])


@dataclasses.dataclass
class ModelConn:
    listener: str
    tls: bool
    ip: str
    in_flight: int = 0
    closing: bool = False
    last: float = 0.0
    seq: int = 0  # order of activity: the reference for "least recently used"

    @property
    def protected(self) -> bool:
        return self.listener in PROTECTED


def on_listener(name: str) -> Callable[[ModelConn], bool]:
    return lambda c: c.listener == name


class ConnectionQuotasMachine(RuleBasedStateMachine):
    """A shell driving the policy at random, against a plain reference model."""

    MODE = Mode.ENFORCE

    def __init__(self) -> None:
        super().__init__()
        self.q = ConnectionQuotas(mode=self.MODE, protected_listeners=PROTECTED)
        self.model: dict[str, ModelConn] = {}
        self.now = 0.0
        self.next_id = 0
        self.activity = 0
        self.allowed: dict[str, int] = {}

    # -- reference model ---------------------------------------------------

    def caps(self, limits: ConnectionLimits | None = None) -> dict[str, tuple[int, Callable[[ModelConn], bool]]]:
        if limits is None:
            limits = self.q.limits
        caps: dict[str, tuple[int, Callable[[ModelConn], bool]]] = {
            MAX_CONNECTIONS: (limits.max_connections, lambda c: not c.protected),
            MAX_SSL_CONNECTIONS: (limits.max_ssl_connections, lambda c: c.tls and not c.protected),
        }
        for listener, limit in limits.listener_max_connections.items():
            caps[listener_max_connections_key(listener)] = (limit, on_listener(listener))
        return caps

    def live(self, member: Callable[[ModelConn], bool]) -> int:
        return sum(1 for c in self.model.values() if member(c) and not c.closing)

    def idle_in(self, member: Callable[[ModelConn], bool]) -> int:
        return sum(1 for c in self.model.values() if member(c) and not c.closing and c.in_flight == 0)

    def lru_idle(self, member: Callable[[ModelConn], bool]) -> list[str]:
        idle = [(c.seq, k) for k, c in self.model.items() if member(c) and not c.closing and not c.in_flight]
        return [k for _, k in sorted(idle)]

    def touch(self, conn: ModelConn) -> None:
        self.activity += 1
        conn.seq = self.activity
        conn.last = self.now

    def expected_excess_closes(self, limits: ConnectionLimits) -> list[str] | None:
        """With exactly one cap over its limit, the closes are its excess, least recently used first."""
        over = [(lim, m) for lim, m in self.caps(limits).values() if self.live(m) > lim]
        if len(over) != 1:
            return None
        limit, member = over[0]
        return self.lru_idle(member)[: self.live(member) - limit]

    def take_closes(self, closes: list[Decision]) -> None:
        caps = [c for c in closes if c.limit_key != CONNECTIONS_MAX_IDLE_MS]
        self.take_victims(closed(caps, self.MODE), closing=self.MODE is Mode.ENFORCE)
        # Idle expiry is the proxy's hygiene: enforced in both modes.
        self.take_victims(closed([c for c in closes if c.limit_key == CONNECTIONS_MAX_IDLE_MS]), closing=True)

    def take_victims(self, victims: list[str], *, closing: bool) -> None:
        seen: set[str] = set()
        for conn_id in victims:
            assert conn_id not in seen, "a connection is named twice"
            seen.add(conn_id)
            conn = self.model[conn_id]
            assert conn.in_flight == 0, "a busy connection is in a close list"
            assert not conn.closing, "a closing connection is named again"
            conn.closing = closing

    def assert_no_idle_excess(self) -> None:
        """After lowering/reclaiming: a cap may be exceeded only by busy connections."""
        if self.MODE is Mode.OBSERVE:
            return
        for key, (limit, member) in self.caps().items():
            if self.live(member) > limit:
                assert self.idle_in(member) == 0, f"{key}: idle connections left over the cap"

    # -- rules ---------------------------------------------------------------

    @initialize(limits=limits_strategy)
    def start(self, limits: ConnectionLimits) -> None:
        assert self.q.update_limits(limits, self.now) == []

    @rule(dt=st.sampled_from([0.0, 0.1, 0.4, 1.0, 3.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(
        arrivals=st.lists(st.tuples(st.sampled_from(sorted(LISTENERS)), st.sampled_from(IPS)), min_size=1, max_size=4),
        dt=steps,
    )
    def accept_some(self, arrivals: list[tuple[str, str]], dt: float) -> None:
        self.now += dt
        for listener, ip in arrivals:
            self.accept(listener, ip)

    def accept(self, listener: str, ip: str) -> None:
        conn_id = f"c{self.next_id}"
        self.next_id += 1
        tls = LISTENERS[listener]
        new = ModelConn(listener, tls, ip, last=self.now, seq=self.activity + 1)
        ip_limit, _ = self.q.limits.per_ip_limit(ip)
        ip_count = sum(1 for c in self.model.values() if c.ip == ip)
        caps = self.caps()
        full = {k: (lim, m) for k, (lim, m) in caps.items() if m(new) and self.live(m) >= lim}

        decision = self.q.on_accept(conn_id, listener=listener, ip=ip, tls=tls, now=self.now)

        action = None if decision is None else decided(decision, decision.action, self.MODE).action
        if action is Action.REFUSE:
            assert decision is not None and decision.limit == ip_limit == self.q.limits.per_ip_limit(ip)[0]
            assert ip_count >= ip_limit and decision.subject == {"ip": ip} and not decision.victims
        else:
            assert ip_count < ip_limit
        if action is None:
            assert not full
        if action is Action.WAIT:
            assert decision is not None and not decision.victims
            limit, member = full[decision.limit_key]
            assert decision.limit == limit
            assert self.idle_in(member) < self.live(member) - limit + 1
        if action is Action.EVICT:
            assert decision is not None and full and decision.limit_key in full
            assert decision.limit == full[decision.limit_key][0]
            for limit, member in full.values():
                relieved = sum(1 for v in decision.victims if member(self.model[v]))
                assert self.live(member) - relieved + 1 <= limit
            if len(full) == 1:
                [(limit, member)] = full.values()
                assert list(decision.victims) == self.lru_idle(member)[: self.live(member) - limit + 1]
            self.take_victims(list(decision.victims), closing=self.MODE is Mode.ENFORCE)
        if admitted(decision):
            self.model[conn_id] = new
            self.activity += 1
            if self.MODE is Mode.ENFORCE:
                for key, (limit, member) in self.caps().items():
                    if member(new):
                        assert self.live(member) <= limit, f"{key} exceeded by an admission"
        else:
            assert conn_id not in self.q

    @rule(data=st.data(), dt=steps)
    def request(self, data: st.DataObject, dt: float) -> None:
        self.now += dt
        if not self.model:
            return
        conn_id = data.draw(st.sampled_from(sorted(self.model)))
        self.q.on_request(conn_id, self.now)
        self.model[conn_id].in_flight += 1
        self.touch(self.model[conn_id])

    @rule(data=st.data(), dt=steps, then_reclaim=st.booleans())
    def respond(self, data: st.DataObject, dt: float, then_reclaim: bool) -> None:
        """A response; a shell may then reclaim excess (or not, and accept over a lowered cap)."""
        self.now += dt
        busy = sorted(k for k, c in self.model.items() if c.in_flight)
        if not busy:
            return
        conn_id = data.draw(st.sampled_from(busy))
        self.q.on_response(conn_id, self.now)
        self.model[conn_id].in_flight -= 1
        self.touch(self.model[conn_id])
        if then_reclaim:
            self.reclaim()

    @rule()
    def respond_to_everything(self) -> None:
        """Every busy connection turns idle, and nobody reclaims: the next accept meets any excess."""
        for conn_id, conn in sorted(self.model.items()):
            while conn.in_flight:
                self.q.on_response(conn_id, self.now)
                conn.in_flight -= 1
                self.touch(conn)

    @rule(data=st.data())
    def peer_closes(self, data: st.DataObject) -> None:
        if not self.model:
            return
        conn_id = data.draw(st.sampled_from(sorted(self.model)))
        self.q.on_closed(conn_id)
        del self.model[conn_id]

    @rule()
    def shell_closes_what_it_was_told(self) -> None:
        for conn_id in [k for k, c in self.model.items() if c.closing]:
            self.q.on_closed(conn_id)
            del self.model[conn_id]
        if self.MODE is Mode.ENFORCE:
            for key, (limit, member) in self.caps().items():
                count = sum(1 for c in self.model.values() if member(c))
                assert count <= self.allowed.get(key, limit), f"{key}: {count} > {limit}"

    @rule()
    def expire_idle(self) -> None:
        closes = self.q.idle_expired(self.now)
        max_idle_ms = self.q.limits.connections_max_idle_ms
        for close in closes:
            conn = self.model[close.victims[0]]
            assert close.limit_key == CONNECTIONS_MAX_IDLE_MS and close.limit == max_idle_ms
            assert max_idle_ms >= 0 and self.now - conn.last > max_idle_ms / 1000
        seqs = [self.model[conn_id].seq for conn_id in closed(closes)]  # enforced in both modes
        assert seqs == sorted(seqs), "idle expiry is not least recently used first"
        self.take_closes(closes)
        if max_idle_ms >= 0:
            for conn in self.model.values():
                if not conn.closing and not conn.in_flight:
                    assert not self.now - conn.last > max_idle_ms / 1000, "an expired connection was missed"

    @rule(limits=limits_strategy)
    def change_limits(self, limits: ConnectionLimits) -> None:
        expected = self.expected_excess_closes(limits)
        closes = self.q.update_limits(limits, self.now)
        if expected is not None:
            assert [c.victims[0] for c in closes if c.limit_key != CONNECTIONS_MAX_IDLE_MS] == expected
        self.take_closes(closes)
        self.allowed = {}
        self.assert_no_idle_excess()

    @rule(field_name=st.sampled_from(["max_connections", "max_ssl_connections", "listener"]), by=st.integers(1, 3))
    def lower_a_cap_below_its_count(self, field_name: str, by: int) -> None:
        """Aim a lowering at the live count, so that busy connections are left over the cap."""
        limits = self.q.limits
        if field_name == "listener":
            listener = max(LISTENERS, key=lambda name: sum(1 for c in self.model.values() if c.listener == name))
            live = self.live(on_listener(listener))
            caps = {**limits.listener_max_connections, listener: max(1, live - by)}
            new = dataclasses.replace(limits, listener_max_connections=caps)
        elif field_name == "max_connections":
            new = dataclasses.replace(limits, max_connections=max(0, self.live(self.caps()[MAX_CONNECTIONS][1]) - by))
        else:
            live = self.live(self.caps()[MAX_SSL_CONNECTIONS][1])
            new = dataclasses.replace(limits, max_ssl_connections=max(0, live - by))
        self.change_limits(new)

    @rule()
    def reclaim(self) -> None:
        expected = self.expected_excess_closes(self.q.limits)
        closes = self.q.reclaim_excess()
        if expected is not None and self.MODE is Mode.ENFORCE:
            assert closed(closes) == expected
        self.take_closes(closes)
        self.assert_no_idle_excess()

    # -- invariants ----------------------------------------------------------

    @invariant()
    def counts_match_the_reference(self) -> None:
        counts = self.q.counts()
        model = self.model.values()
        assert counts.total == len(self.model) == len(self.q)
        assert counts.broker == sum(1 for c in model if not c.protected)
        assert counts.ssl == sum(1 for c in model if c.tls and not c.protected)
        assert counts.closing == sum(1 for c in model if c.closing)
        assert counts.busy == sum(1 for c in model if c.in_flight)
        listeners: dict[str, int] = {}
        for c in model:
            listeners[c.listener] = listeners.get(c.listener, 0) + 1
        assert dict(counts.listeners) == listeners
        for ip in IPS:
            assert self.q.ip_count(ip) == sum(1 for c in model if c.ip == ip) >= 0
        for conn_id, conn in self.model.items():
            assert self.q.is_closing(conn_id) == conn.closing
            assert self.q.in_flight(conn_id) == conn.in_flight >= 0

    @invariant()
    def over_cap_says_whether_a_cap_is_exceeded(self) -> None:
        exceeded = any(self.live(member) > limit for limit, member in self.caps().values())
        assert self.q.over_cap == (exceeded and self.MODE is Mode.ENFORCE)

    @invariant()
    def live_counts_never_rise_above_a_cap(self) -> None:
        """ENFORCE: count - closing <= cap, except for busy excess left by lowering, which only shrinks."""
        if self.MODE is Mode.OBSERVE:  # only idle expiry closes: caps are exceeded in a dry run
            return
        for key, (limit, member) in self.caps().items():
            live = self.live(member)
            allowed = self.allowed.get(key, limit)
            if key not in self.allowed and live > limit:  # a lowering just happened
                allowed = live
            assert live <= allowed, f"{key}: {live} live > {allowed}"
            self.allowed[key] = max(limit, min(allowed, live))


class ObserveModeMachine(ConnectionQuotasMachine):
    MODE = Mode.OBSERVE


machine_settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestConnectionQuotasStateful = ConnectionQuotasMachine.TestCase
TestConnectionQuotasStateful.settings = machine_settings
TestObserveModeStateful = ObserveModeMachine.TestCase
TestObserveModeStateful.settings = machine_settings


# --- per upstream broker (cluster mode) -----------------------------------------------------


def brokers(mode: Mode = Mode.ENFORCE, **limits: object) -> BrokerQuotas:
    return BrokerQuotas(ConnectionLimits(**limits), mode=mode)  # type: ignore[arg-type]


def accept_at(
    q: BrokerQuotas, conn_id: str, broker: BrokerKey, *, ip: str = "10.0.0.1", now: float = 0.0
) -> Decision | None:
    return q.on_accept(conn_id, listener=TLS, ip=ip, tls=True, now=now, broker=broker)


def test_each_broker_counts_its_own_connections_against_max_connections() -> None:
    q = brokers(max_connections=2)
    for conn_id, broker, count in (("a1", 1, 1), ("a2", 1, 2), ("b1", 2, 1), ("b2", 2, 2)):
        assert accept_at(q, conn_id, broker) is None
        assert q.open_counts(conn_id) == OpenCounts(count, count, count, broker)  # its own broker's counts
    # The third on broker 1 closes broker 1's least recently used connection, never broker 2's.
    assert evicts(accept_at(q, "a3", 1)) == ("a1",)
    assert q.counts().total == 5 and q.counts().closing == 1
    assert accept_at(q, "c1", 3) is None


def test_a_full_broker_makes_only_its_own_connections_wait() -> None:
    q = brokers(max_connections=1)
    assert accept_at(q, "a1", 1) is None
    q.on_request("a1", 1.0)  # busy: nothing to evict on broker 1
    decided(accept_at(q, "a2", 1), Action.WAIT)
    assert "a2" not in q
    assert accept_at(q, "b1", 2) is None
    q.on_response("a1", 2.0)
    assert evicts(accept_at(q, "a2", 1)) == ("a1",)


def test_max_connections_per_ip_counts_per_broker_as_each_kafka_broker_does() -> None:
    q = brokers(max_connections_per_ip=1)
    assert accept_at(q, "a1", 1) is None
    assert accept_at(q, "b1", 2) is None
    decided(accept_at(q, "a2", 1), Action.REFUSE)
    assert q.open_counts("b1").ip == 1


def test_sidecar_and_bootstrap_connections_share_the_one_bootstrap_pool() -> None:
    q = brokers(max_connections=1)
    assert q.on_accept("s1", listener=TLS, ip="10.0.0.1", tls=True, now=0.0) is None
    assert q.broker_of("s1") == BOOTSTRAP
    assert q.open_counts("s1").node_id is None  # the bootstrap pool names no broker
    assert evicts(accept_at(q, "s2", BOOTSTRAP)) == ("s1",)
    assert accept_at(q, "n1", 1) is None


def test_counts_by_broker_name_each_pool() -> None:
    q = brokers()
    accept_at(q, "a1", 1)
    accept_at(q, "s1", BOOTSTRAP)
    by_broker = q.counts_by_broker()
    assert {k: c.total for k, c in by_broker.items()} == {1: 1, BOOTSTRAP: 1}


def test_a_pool_goes_when_its_last_connection_closes_and_comes_back_with_current_limits() -> None:
    q = brokers(max_connections=2)
    accept_at(q, "a1", 1)
    q.on_closed("a1")
    assert q.pool(1) is None and "a1" not in q
    q.on_closed("a1")  # idempotent
    q.update_limits(ConnectionLimits(max_connections=1), 1.0)
    assert accept_at(q, "a2", 1, now=2.0) is None
    assert evicts(accept_at(q, "a3", 1, now=3.0)) == ("a2",)


def test_update_limits_and_mode_reach_every_brokers_pool() -> None:
    q = brokers(max_connections=2)
    for conn_id, broker in (("a1", 1), ("a2", 1), ("b1", 2), ("b2", 2)):
        accept_at(q, conn_id, broker)
    closes = q.update_limits(ConnectionLimits(max_connections=1), 1.0)
    assert sorted(c.victims[0] for c in closes) == ["a1", "b1"]
    assert not q.over_cap
    q.mode = Mode.OBSERVE
    assert all(q.pool(b).mode is Mode.OBSERVE for b in (1, 2))  # type: ignore[union-attr]
    assert not decided(accept_at(q, "a3", 1), Action.EVICT, Mode.OBSERVE).enforced


def test_a_busy_excess_on_one_broker_is_reclaimed_when_it_turns_idle() -> None:
    q = brokers(max_connections=2)
    for conn_id in ("a1", "a2"):
        accept_at(q, conn_id, 1)
        q.on_request(conn_id, 0.5)
    assert q.update_limits(ConnectionLimits(max_connections=1), 1.0) == []
    assert q.over_cap
    q.on_response("a1", 2.0)
    assert [c.victims for c in q.reclaim_excess()] == [("a1",)]
    assert q.is_closing("a1") and q.in_flight("a2") == 1


def test_idle_expiry_and_its_deadline_span_every_broker() -> None:
    q = brokers(connections_max_idle_ms=1000)
    accept_at(q, "a1", 1, now=0.0)
    accept_at(q, "b1", 2, now=0.5)
    assert q.next_idle_deadline() == 1.0
    assert [c.victims for c in q.idle_expired(1.6)] == [("a1",), ("b1",)]
    assert q.next_idle_deadline() is None


# --- which broker a bootstrap-port connection counts against ---------------------------------

SERVERS = [("kafka-0", 9092), ("kafka-1", 9092), ("kafka-2", 9092)]
ADVERTISED = {("kafka-0", 9092): 0, ("kafka-1", 9092): 1, ("kafka-2", 9092): 2}


def predicted(
    servers: list[tuple[str, int]] = SERVERS,
    advertised: dict[tuple[str, int], int] = ADVERTISED,
    backing_off: frozenset[tuple[str, int]] = frozenset(),
) -> BrokerKey:
    return bootstrap_broker(
        servers,
        lambda host, port: advertised.get((host, port)),
        lambda host, port: (host, port) in backing_off,
    )


def test_a_bootstrap_port_connection_counts_against_the_broker_its_first_server_is() -> None:
    assert predicted() == 0
    assert predicted(servers=SERVERS[::-1]) == 2


def test_a_bootstrap_port_connection_skips_the_servers_backed_off_from_as_connect_any_does() -> None:
    assert predicted(backing_off=frozenset(SERVERS[:1])) == 1
    assert predicted(backing_off=frozenset(SERVERS[:2])) == 2
    # all backed off: the first fails first, as a connection to its node port would
    assert predicted(backing_off=frozenset(SERVERS)) == 0


def test_before_any_broker_is_known_bootstrap_port_connections_keep_the_bootstrap_pool() -> None:
    assert predicted(advertised={}) == BOOTSTRAP
    assert predicted(servers=[], advertised={}) == BOOTSTRAP


def test_a_bootstrap_server_that_no_broker_advertises_keeps_the_bootstrap_pool() -> None:
    """A load balancer in front of the brokers: which broker it reaches is not the proxy's to know,
    even when a later bootstrap server is a broker (it is used only if the first does not answer)."""
    balancer = [("kafka-lb", 9092), *SERVERS]
    assert predicted(servers=balancer) == BOOTSTRAP
    assert predicted(servers=balancer, backing_off=frozenset(balancer[:1])) == 0


def test_a_bootstrap_port_connection_waits_evicts_and_is_refused_in_its_brokers_pool_as_a_node_port_one() -> None:
    """What the shell does with the prediction: admit against that broker's own pool, so a broker
    counts the connections from both ports once, with one LRU order and one per-IP count."""
    q = brokers(max_connections=2, max_connections_per_ip=3)
    assert accept_at(q, "n1", 0, now=0.0) is None
    assert accept_at(q, "n2", 0, now=1.0) is None
    q.on_request("n1", 1.5)
    q.on_request("n2", 1.5)
    boot = predicted()
    decided(accept_at(q, "b1", boot, now=2.0), Action.WAIT)  # broker 0's connections are all busy
    assert accept_at(q, "other", 1, now=2.0) is None  # broker 1 has room
    q.on_response("n2", 3.0)
    assert evicts(accept_at(q, "b1", boot, now=3.0)) == ("n2",)  # broker 0's LRU idle one
    assert q.open_counts("b1") == OpenCounts(2, 2, 3, 0)
    assert q.pool(BOOTSTRAP) is None
    decided(accept_at(q, "b2", boot, now=4.0), Action.REFUSE)  # a fourth from 10.0.0.1 on broker 0
    assert {k: c.total for k, c in q.counts_by_broker().items()} == {0: 3, 1: 1}


# --- a bootstrap-pool connection moves to its broker's count once that broker is known ---------

A0 = "kafka-0:9092"


def test_the_bootstrap_pools_connections_move_to_the_broker_they_reached_when_it_is_learned() -> None:
    """The proxy's first clients are admitted before any broker is known; once Metadata names the
    broker they reached, they count against it, keeping their state and LRU order, and the broker
    admits, evicts and waits with them counted (as if they had come to its node port)."""
    q = brokers(max_connections=3, connections_max_idle_ms=1000)
    for conn_id, now in (("s1", 0.0), ("s2", 0.1), ("s3", 0.2)):
        assert accept_at(q, conn_id, BOOTSTRAP, now=now) is None
    q.on_request("s2", 0.3)  # busy
    decided(accept_at(q, "s4", BOOTSTRAP, now=0.35), Action.EVICT)  # s1 closing
    assert not q.on_reached("s1", A0) and not q.on_reached("s2", A0) and not q.on_reached("s4", A0)
    q.on_reached("s3", "kafka-1:9092")
    assert q.on_broker_known(0, A0) == 3
    assert {k: (c.total, c.busy, c.closing) for k, c in q.counts_by_broker().items()} == {
        0: (3, 1, 1),
        BOOTSTRAP: (1, 0, 0),
    }
    assert q.broker_of("s2") == 0 and q.in_flight("s2") == 1 and q.is_closing("s1")
    assert q.open_counts("s4") == OpenCounts(2, 2, 3, 0)
    assert q.pool(0).next_idle_deadline() == pytest.approx(1.35)  # type: ignore[union-attr]  # s4's last activity
    # broker 0: s2 busy, s4 idle, s1 closing: one slot left, then s4 (its LRU idle one) is evicted
    assert accept_at(q, "n1", 0, now=0.4) is None
    assert evicts(accept_at(q, "n2", 0, now=0.5)) == ("s4",)


def test_a_move_never_joins_a_broker_that_already_counts_connections() -> None:
    """Into a broker with connections counted, the move could pass its caps, and its admissions
    were decided without them: they stay in the bootstrap pool until they close."""
    q = brokers(max_connections=1)
    assert accept_at(q, "s1", BOOTSTRAP) is None
    assert not q.on_reached("s1", A0)
    assert accept_at(q, "n1", 0) is None
    assert q.on_broker_known(0, A0) == 0
    assert q.broker_of("s1") == BOOTSTRAP
    assert not q.on_reached("n1", A0, 0)  # not a bootstrap-pool connection: ignored


def test_a_bootstrap_pool_connection_that_reaches_a_known_broker_with_no_connection_moves_at_once() -> None:
    q = brokers(max_connections=1)
    assert accept_at(q, "s1", BOOTSTRAP) is None
    assert q.on_reached("s1", A0, 0)
    assert q.pool(BOOTSTRAP) is None and q.broker_of("s1") == 0
    assert accept_at(q, "s2", BOOTSTRAP) is None  # the bootstrap pool's slot was given back
    assert not q.on_reached("s2", A0, 0)  # broker 0 counts s1 now: s2 stays
    assert q.broker_of("s2") == BOOTSTRAP


def test_a_closed_connection_is_forgotten_by_the_move() -> None:
    q = brokers()
    accept_at(q, "s1", BOOTSTRAP)
    q.on_reached("s1", A0)
    q.on_closed("s1")
    assert q.on_broker_known(0, A0) == 0
    assert q.pool(0) is None


def test_a_move_carries_a_cap_the_bootstrap_pool_is_over_and_reclaims_it_there() -> None:
    """Lowered below its busy connections, the bootstrap pool is over its cap; moved, they are over
    the broker's (the same limits), and the excess is closed there once idle, as it would have been."""
    q = brokers(max_connections=2)
    for conn_id in ("s1", "s2"):
        accept_at(q, conn_id, BOOTSTRAP)
        q.on_request(conn_id, 0.5)
        q.on_reached(conn_id, A0)
    assert q.update_limits(ConnectionLimits(max_connections=1), 1.0) == []
    assert q.on_broker_known(0, A0) == 2
    assert q.over_cap
    q.on_response("s1", 2.0)
    assert [c.victims for c in q.reclaim_excess()] == [("s1",)]


_MOVE_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("accept"), st.sampled_from([BOOTSTRAP, 0, 1]), st.sampled_from(["10.0.0.1", "10.0.0.2"])),
        st.tuples(st.sampled_from(["request", "response", "close"]), st.integers(0, 11), st.just("")),
        st.tuples(st.just("reached"), st.integers(0, 11), st.sampled_from(["kafka-0:9092", "kafka-1:9092"])),
        st.tuples(st.just("known"), st.sampled_from([0, 1]), st.just("")),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops=_MOVE_OPS)
def test_moving_bootstrap_connections_to_their_broker_never_passes_a_cap(ops: list[tuple[str, object, object]]) -> None:
    """Driven at random (accepts on both ports, activity, closes, connections reaching brokers,
    brokers becoming known), no pool is ever over a cap or a per-IP limit, and every connection
    counts exactly once."""
    limits = ConnectionLimits(max_connections=2, max_connections_per_ip=1, max_ssl_connections=2)
    q = BrokerQuotas(limits)
    alive: set[str] = set()
    made = 0
    for op, a, b in ops:
        if op == "accept":
            assert isinstance(a, int | str) and isinstance(b, str)
            conn_id = f"c{made}"
            made += 1
            q.on_accept(conn_id, listener=TLS, ip=b, tls=True, now=float(made), broker=a)
            if conn_id in q:
                alive.add(conn_id)
        elif op == "request":
            q.on_request(f"c{a}", float(made))
        elif op == "response":
            q.on_response(f"c{a}", float(made))
        elif op == "close":
            q.on_closed(f"c{a}")
            alive.discard(f"c{a}")
        elif op == "reached":
            assert isinstance(b, str)
            q.on_reached(f"c{a}", b, None if b == "kafka-1:9092" else 0)
        else:
            assert isinstance(a, int)
            q.on_broker_known(a, f"kafka-{a}:9092")
        assert not q.over_cap
        for pool in q.counts_by_broker().values():
            assert pool.broker - pool.closing <= 2
        for broker in (BOOTSTRAP, 0, 1):
            pool = q.pool(broker)
            if pool is not None:
                assert pool.ip_count("10.0.0.1") <= 1 and pool.ip_count("10.0.0.2") <= 1
        assert q.counts().total == len(alive) and all(conn_id in q for conn_id in alive)


_BROKER_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("accept"), st.sampled_from([BOOTSTRAP, 1, 2]), st.sampled_from(["10.0.0.1", "10.0.0.2"])),
        st.tuples(st.sampled_from(["request", "response", "close"]), st.integers(0, 11), st.just("")),
        st.tuples(st.just("limits"), st.integers(1, 3), st.integers(1, 3)),
        st.tuples(st.just("tick"), st.sampled_from([0.0, 0.6, 2.0]), st.just("")),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(ops=_BROKER_OPS)
def test_broker_quotas_decide_as_independent_quotas_one_per_broker(ops: list[tuple[str, object, object]]) -> None:
    """BrokerQuotas is exactly one ConnectionQuotas per broker: driven at random, every answer is
    the answer of that broker's own quotas driven alone (reference pools are never dropped)."""
    limits = ConnectionLimits(max_connections=2, max_connections_per_ip=1, connections_max_idle_ms=1000)
    q = BrokerQuotas(limits)
    ref: dict[BrokerKey, ConnectionQuotas] = {}
    where: dict[str, BrokerKey] = {}
    now, made = 0.0, 0
    for op, a, b in ops:
        if op == "accept":
            assert isinstance(a, int | str) and isinstance(b, str)
            conn_id = f"c{made}"
            made += 1
            pool = ref.setdefault(a, ConnectionQuotas(limits))
            expected = pool.on_accept(conn_id, listener=TLS, ip=b, tls=True, now=now)
            assert q.on_accept(conn_id, listener=TLS, ip=b, tls=True, now=now, broker=a) == expected
            if conn_id in pool:
                where[conn_id] = a
                got = q.open_counts(conn_id)
                assert (got.broker, got.ssl, got.ip) == dataclasses.astuple(pool.open_counts(conn_id))[:3]
        elif op in ("request", "response", "close"):
            conn_id = f"c{a}"
            pool = ref.get(where.get(conn_id, BOOTSTRAP))
            if op == "request":
                q.on_request(conn_id, now)
                if pool is not None:
                    pool.on_request(conn_id, now)
            elif op == "response":
                q.on_response(conn_id, now)
                if pool is not None:
                    pool.on_response(conn_id, now)
                assert q.reclaim_excess() == [d for p in ref.values() for d in p.reclaim_excess()]
            else:
                q.on_closed(conn_id)
                if pool is not None:
                    pool.on_closed(conn_id)
                where.pop(conn_id, None)
        elif op == "limits":
            assert isinstance(a, int) and isinstance(b, int)
            limits = ConnectionLimits(max_connections=a, max_connections_per_ip=b, connections_max_idle_ms=1000)
            expected_closes = [d for p in ref.values() for d in p.update_limits(limits, now)]
            assert sorted(d.victims for d in q.update_limits(limits, now)) == sorted(d.victims for d in expected_closes)
        else:
            assert isinstance(a, float)
            now += a
            expected_closes = [d for p in ref.values() for d in p.idle_expired(now)]
            assert sorted(d.victims for d in q.idle_expired(now)) == sorted(d.victims for d in expected_closes)
        assert q.over_cap == any(p.over_cap for p in ref.values())
        assert q.counts().total == sum(p.counts().total for p in ref.values())


# ---------------------------------------------------------------------------
# Activity seen elsewhere (workers, issue 29): an owner counts and decides, the workers see the requests

_NO_CAPS = ConnectionLimits(
    max_connections=INT_MAX, max_connections_per_ip=INT_MAX, max_ssl_connections=INT_MAX, connections_max_idle_ms=-1
)

_SHARED_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("accept"), st.integers(0, 1), st.tuples(st.sampled_from([TLS, PLAIN]), st.booleans())),
        st.tuples(st.just("request"), st.integers(0, 30), st.none()),
        st.tuples(st.just("response"), st.integers(0, 30), st.none()),
        st.tuples(st.just("close"), st.integers(0, 30), st.none()),
        st.tuples(st.just("limits"), st.integers(0, 6), st.integers(0, 6)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_SHARED_OPS, first=st.tuples(st.integers(1, 6), st.integers(0, 6), st.integers(1, 6)))
def test_an_owner_synced_with_the_workers_idle_connections_decides_as_one_process(
    ops: list[tuple[str, object, object]], first: tuple[int, int, int]
) -> None:
    """Two workers see the requests (caps off); the owner counts (no activity) and, before each
    decision that closes or waits, syncs with each worker's ``room_needed``/``excess`` LRU idle
    connections per cell: every decision, and every close of a lowered cap, is the one process's."""

    def limits_of(max_conns: int, max_ssl: int, listener_max: int) -> ConnectionLimits:
        return ConnectionLimits(
            max_connections=max_conns,
            max_ssl_connections=max_ssl,
            listener_max_connections={TLS: listener_max},
            max_connections_per_ip=3,
            connections_max_idle_ms=-1,
        )

    limits = limits_of(*first)
    one = ConnectionQuotas(limits)
    owner = ConnectionQuotas(limits)
    workers = [ConnectionQuotas(_NO_CAPS), ConnectionQuotas(_NO_CAPS)]
    holder: dict[str, ConnectionQuotas] = {}
    now = 0.0

    def report(per_cell: int) -> dict[str, float]:
        return {conn_id: t for w in workers for conn_id, t in w.idle_lru(per_cell)}

    def close(conn_ids: tuple[str, ...]) -> None:
        for conn_id in conn_ids:
            one.on_closed(conn_id)
            owner.on_closed(conn_id)
            holder.pop(conn_id).on_closed(conn_id)

    made = 0
    for op, a, b in ops:
        now += 1.0
        if op == "accept":
            assert isinstance(a, int) and isinstance(b, tuple)
            listener, tls = b
            conn_id, made = f"c{made}", made + 1
            ip = f"10.0.0.{made % 2}"
            expected = one.on_accept(conn_id, listener=listener, ip=ip, tls=tls, now=now)
            need = owner.room_needed(listener, ip, tls)
            if need:
                owner.sync_activity(report(need))
            assert owner.on_accept(conn_id, listener=listener, ip=ip, tls=tls, now=now) == expected
            if conn_id in owner:
                holder[conn_id] = workers[a]
                assert workers[a].on_accept(conn_id, listener=listener, ip=ip, tls=tls, now=now) is None
                assert owner.open_counts(conn_id) == one.open_counts(conn_id)
            if expected is not None and expected.action is Action.EVICT:
                close(expected.victims)
        elif op in ("request", "response"):
            conn_id = f"c{a}"
            if conn_id in holder:
                for q in (one, holder[conn_id]):
                    (q.on_request if op == "request" else q.on_response)(conn_id, now)
                closes = one.reclaim_excess()
                if owner.over_cap:
                    owner.sync_activity(report(owner.excess()))
                assert owner.reclaim_excess() == closes
                for d in closes:
                    close(d.victims)
        elif op == "close":
            if f"c{a}" in holder:
                close((f"c{a}",))
        else:
            assert isinstance(a, int) and isinstance(b, int)
            limits = limits_of(max(a, 1), b, max(b, 1))
            closes = one.update_limits(limits, now)
            owner.sync_activity({})  # the owner knows no activity when the reload comes
            assert owner.update_limits(limits, now) == []
            if owner.over_cap:
                owner.sync_activity(report(owner.excess()))
            assert owner.reclaim_excess() == closes
            for d in closes:
                close(d.victims)
        assert owner.counts().total == one.counts().total == sum(len(w) for w in workers)
        assert owner.over_cap == one.over_cap


def test_follow_move_counts_the_connections_in_the_brokers_pool_as_they_were() -> None:
    q = BrokerQuotas(_NO_CAPS)
    q.on_accept("a", listener=TLS, ip="1", tls=True, now=1.0)
    q.on_accept("b", listener=TLS, ip="1", tls=True, now=2.0)
    q.on_request("b", 3.0)
    q.follow_move(["a", "b", "unknown"], 7)
    assert q.pool(BOOTSTRAP) is None
    assert q.broker_of("a") == q.broker_of("b") == 7
    assert q.in_flight("b") == 1
    assert q.idle_lru(5, [7]) == [("a", 1.0)]
    q.follow_move(["a"], 7)  # already there
    assert q.counts_by_broker()[7].total == 2


# ---------------------------------------------------------------------------
# Slots leased to workers (issue 29): a worker admits from its lease without asking the owner

_CELLS = [(TLS, True, "10.0.0.1"), (TLS, True, "10.0.0.2"), (PLAIN, False, "10.0.0.1"), (INTERNAL, False, "10.0.0.2")]

_LEASE_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("grant"), st.integers(0, 1), st.integers(0, 3), st.integers(1, 4)),
        st.tuples(st.just("local"), st.integers(0, 1), st.integers(0, 3), st.none()),
        st.tuples(st.just("deliver"), st.integers(0, 1), st.none(), st.none()),
        st.tuples(st.just("open"), st.integers(0, 1), st.integers(0, 3), st.none()),
        st.tuples(st.just("request"), st.integers(0, 30), st.none(), st.none()),
        st.tuples(st.just("response"), st.integers(0, 30), st.none(), st.none()),
        st.tuples(st.just("close"), st.integers(0, 30), st.none(), st.none()),
    ),
    max_size=80,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_LEASE_OPS, caps=st.tuples(st.integers(1, 6), st.integers(0, 6), st.integers(1, 6), st.integers(0, 4)))
def test_admissions_from_leased_slots_and_the_owners_own_decide_as_one_process(
    ops: list[tuple[str, int, int | None, int | None]], caps: tuple[int, int, int, int]
) -> None:
    """Two workers admit from slots the owner leased them, reporting each admission later (a
    message in flight, delivered in order); the owner decides every other open itself, taking every
    slot back first when admitting would leave a leased slot without room. In the order the owner
    learns of them, every admission is the one one ConnectionQuotas makes (a leased one: None),
    every eviction closes the same connections, and the counts are the same."""
    max_conns, max_ssl, listener_max, override = caps
    limits = ConnectionLimits(
        max_connections=max_conns,
        max_ssl_connections=max_ssl,
        listener_max_connections={TLS: listener_max},
        max_connections_per_ip=3,
        max_connections_per_ip_overrides={"10.0.0.2": override},
        connections_max_idle_ms=-1,
    )
    protected = (INTERNAL,)
    one = ConnectionQuotas(limits, protected_listeners=protected)
    owner = ConnectionQuotas(limits, protected_listeners=protected)
    leases = SlotLeases(protected)
    slots: list[dict[tuple[str, bool, str], int]] = [{}, {}]  # what each worker holds
    outbox: list[list[tuple[str, str, tuple[str, bool, str], int]]] = [[], []]  # its messages in flight
    made = 0
    now = 0.0

    def deliver(h: int) -> None:
        kind, conn_id, cell, n = outbox[h].pop(0)
        listener, tls, ip = cell
        if kind == "opened":
            assert one.on_accept(conn_id, listener=listener, ip=ip, tls=tls, now=now) is None
            owner.on_leased(conn_id, listener=listener, ip=ip, tls=tls, now=now)
            leases.used(h, cell)
        else:
            leases.give_back(h, cell, n)

    def close(conn_ids: tuple[str, ...]) -> None:
        for conn_id in conn_ids:
            one.on_closed(conn_id)
            owner.on_closed(conn_id)

    for op, a, b, c in ops:
        now += 1.0
        if op == "grant":
            assert b is not None and c is not None
            listener, tls, ip = cell = _CELLS[b]
            n = leases.grant(a, cell, owner.rooms(listener, ip, tls), c)
            slots[a][cell] = slots[a].get(cell, 0) + n
        elif op == "local":
            assert b is not None
            cell = _CELLS[b]
            if slots[a].get(cell, 0):
                slots[a][cell] -= 1
                outbox[a].append(("opened", f"c{made}", cell, 1))
                made += 1
        elif op == "deliver":
            if outbox[a]:
                deliver(a)
        elif op == "open":
            assert b is not None
            listener, tls, ip = _CELLS[b]
            if not leases.fits(owner.rooms(listener, ip, tls)):
                for h in (0, 1):  # the recall: each worker drops its slots and says so, after its reports
                    outbox[h].extend(("returned", "", cell, n) for cell, n in slots[h].items() if n)
                    slots[h] = {}
                    while outbox[h]:
                        deliver(h)
                assert not leases
            conn_id, made = f"c{made}", made + 1
            expected = one.on_accept(conn_id, listener=listener, ip=ip, tls=tls, now=now)
            assert owner.on_accept(conn_id, listener=listener, ip=ip, tls=tls, now=now) == expected
            if expected is not None and expected.action is Action.EVICT:
                close(expected.victims)
        elif op in ("request", "response"):
            conn_id = f"c{a}"
            if conn_id in owner and not owner.is_closing(conn_id):
                for q in (one, owner):
                    (q.on_request if op == "request" else q.on_response)(conn_id, now)
        elif f"c{a}" in owner:
            close((f"c{a}",))
        assert owner.counts() == one.counts()
        for h in (0, 1):  # the owner counts what each worker holds, plus what it reported in flight
            in_flight = [m for m in outbox[h] if m[0] == "opened"]
            for cell in _CELLS:
                told = sum(1 for m in in_flight if m[2] == cell)
                assert leases.held(h, cell) == slots[h].get(cell, 0) + told
        for listener, tls, ip in _CELLS:  # every slot out has room under every limit of its cell
            rooms = owner.rooms(listener, ip, tls)
            for key, room in rooms.items():
                out = sum(
                    leases.held(h, cell)
                    for h in (0, 1)
                    for cell in _CELLS
                    if key in lease_keys(cell, frozenset(protected))
                )
                assert room - out >= 0, (key, room, out)


def test_no_slot_is_leased_beyond_the_room_of_any_limit_of_its_cell() -> None:
    q = quotas(protected=(INTERNAL,), max_connections=5, max_ssl_connections=2, max_connections_per_ip=4)
    leases = SlotLeases([INTERNAL])
    accept(q, "a", listener=TLS)
    tls_cell, plain_cell = (TLS, True, "10.0.0.1"), (PLAIN, False, "10.0.0.1")
    assert leases.grant(0, tls_cell, q.rooms(TLS, "10.0.0.1", True), 8) == 1  # max.ssl.connections: 2 - 1
    assert leases.grant(1, tls_cell, q.rooms(TLS, "10.0.0.1", True), 8) == 0
    assert leases.grant(1, plain_cell, q.rooms(PLAIN, "10.0.0.1", False), 8) == 2  # per IP: 4 - 1 - 1
    assert leases.fits(q.rooms(PLAIN, "10.0.0.9", False))  # another IP: max.connections 5 - 1 - 3
    assert not leases.fits(q.rooms(PLAIN, "10.0.0.1", False))  # its IP has no room beside the slots out
    assert leases.drop(1) == 2 and leases.fits(q.rooms(PLAIN, "10.0.0.1", False))
    leases.used(0, tls_cell)
    q.on_leased("b", listener=TLS, ip="10.0.0.1", tls=True, now=1.0)
    assert leases.holders() == [] and q.rooms(TLS, "10.0.0.1", True)[MAX_SSL_CONNECTIONS] == 0
