"""The traffic aggregates on small DataFrames: the connection counts the proxies
recorded (per proxy, over TLS, per client host), and the peaks the recommendations
and plots are made of."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import connection, counted, decision, evidence_of, window

from pipeline.events import Overview
from pipeline.traffic import measure_traffic, open_connections

pytestmark = pytest.mark.spark


def test_open_connections_carry_the_counts_the_proxy_recorded_and_the_client_host(spark: Any) -> None:
    evidence = evidence_of(
        spark,
        [
            connection("open", 1.0, "c1", "10.0.0.1:5001", True, **counted(1, 1, 1)),
            connection("open", 2.0, "c2", "10.0.0.1:5002", False, **counted(2, None, 2)),
            connection("close", 4.0, "c1", "10.0.0.1:5001", True, client_id="a"),  # not an open: no row
            connection("open", 5.0, "c5", "[::1]:5005", True, **counted(2, 1, 1)),
            connection("open", 6.0, "c6", "10.0.0.2:5006", False),  # written before proxies recorded counts
        ],
    )
    connections = open_connections(evidence.connections)
    rows = connections.collect()
    counts = {
        r["conn_id"]: (r["open_connections"], r["open_ssl_connections"], r["open_ip_connections"], r["host"])
        for r in rows
    }
    assert counts == {
        "c1": (1, 1, 1, "10.0.0.1"),
        "c2": (2, None, 2, "10.0.0.1"),
        "c5": (2, 1, 1, "::1"),
        "c6": (None, None, None, "10.0.0.2"),
    }
    traffic = measure_traffic(evidence, connections)
    assert traffic.peak_per_ip is not None
    assert (traffic.peak_per_ip.value, traffic.peak_per_ip.where) == (2, "10.0.0.1 on p1")
    assert traffic.uncounted_opens == 1


def test_time_buckets_are_round_and_at_least_one_window() -> None:
    day = Overview(1, {}, (), 0.0, 86_400.0, 60.0)
    assert day.bucket_seconds == 300  # 86400 / 360 = 240 -> the next round step
    short = Overview(1, {}, (), 0.0, 600.0, 60.0)
    assert short.bucket_seconds == 60  # never finer than a window


def test_traffic_peaks_of_every_kind(spark: Any) -> None:
    long_id = "x" * 250
    evidence = evidence_of(
        spark,
        [
            window("group", 0, group_id="g1", group_kind="classic", max_members=40),
            window("group", 60, group_id="g1", group_kind="classic", max_members=57),
            {**window("group", 60, group_id="g1", group_kind="classic", max_members=12), "instance": "p2"},
            window("group", 0, group_id="k1", group_kind="consumer", max_members=9),
            window("group", 0, group_id="g2", max_members=3),  # no kind: a classic group
            window("pool", 0, capacity_bytes=-1, high_water_mark_bytes=1000, waits=0),
            window("pool", 60, capacity_bytes=-1, high_water_mark_bytes=9000, waits=2),
            window("connections", 0, listener="tls", tls=True, max_open=7),
            window("connections", 0, listener="tls2", tls=True, max_open=5),
            window("connections", 0, listener="plain", tls=False, max_open=30),
            window("connections", 60, listener="plain", tls=False, max_open=40),
            window(
                "client_api",
                0,
                client_id="big",
                api="produce",
                requests=10,
                max_request_bytes=3000,
                max_response_bytes=100,
            ),
            window(
                "client_api",
                60,
                client_id="reader",
                api="fetch",
                requests=5,
                max_request_bytes=100,
                max_response_bytes=70_000,
            ),
            # A client that sent no client id: its windows count under null, and its largest is found too.
            {
                **window("client_api", 120, api="fetch", requests=3, max_request_bytes=100, max_response_bytes=90_000),
                "instance": "p3",
            },
            window("identifier", 0, client_id=long_id, identifier_kind="client id", max_length=250, identifier=long_id),
            window(
                "identifier", 0, client_id="c", identifier_kind="classic_member_id", max_length=41, identifier="m" * 41
            ),
            decision(
                "identifier_limits",
                "resource.identifier.max.length",
                249,
                identifier_kind="transactional_id",
                identifier_length=260,
                identifier="t" * 260,
                client_id="c",
            ),
        ],
    )
    connections = open_connections(evidence.connections)
    traffic = measure_traffic(evidence, connections)
    assert {k: (p.value, p.where) for k, p in traffic.largest_by_kind.items()} == {
        "classic": (57, "g1"),
        "consumer": (9, "k1"),
    }
    assert traffic.groups == 3  # g1, g2, k1
    assert traffic.pool_percentiles["max"] == 9000 and traffic.pool_waits == 2
    assert traffic.pool_capacity is None  # -1: the pool was off
    assert traffic.peak_tls is not None and traffic.peak_tls.value == 12  # two TLS listeners, same window
    assert traffic.peak_connections is not None and traffic.peak_connections.value == 42
    assert (traffic.largest_requests[0]["client_id"], traffic.largest_requests[0]["bytes"]) == ("big", 3000)
    assert [(r["client_id"], r["bytes"]) for r in traffic.largest_responses[:2]] == [(None, 90_000), ("reader", 70_000)]
    assert {k: traffic.largest_responses[0][k] for k in ("instance", "ts", "requests")} == {
        "instance": "p3",
        "ts": 120.0,
        "requests": 3,
    }
    assert {k: traffic.largest_requests[0][k] for k in ("instance", "ts", "requests")} == {
        "instance": "p1",
        "ts": 0.0,
        "requests": 10,
    }
    assert dict(traffic.request_size_hist) == {12: 1, 7: 2}  # 3000 -> [2048, 4096); 100 -> [64, 128)
    assert {k: (v["length"], v["key"]) for k, v in traffic.longest.items()} == {
        "client_id": (250, "resource.identifier.max.length"),
        "classic_member_id": (41, "classic.member.id.max.length"),
        "transactional_id": (260, "resource.identifier.max.length"),
    }
    longest = traffic.longest_for("resource.identifier.max.length")
    assert longest is not None and longest.value == 260
    assert [(d["policy"], d["count"]) for d in traffic.decisions] == [("identifier_limits", 1)]


def test_the_largest_sizes_pairs_come_from_the_top_windows_or_from_every_window(spark: Any, monkeypatch: Any) -> None:
    import pipeline.traffic

    # 12 clients with one window each (1 KiB .. 12 KiB), and one client with 20 windows of 1 MiB
    windows = [
        window(
            "client_api",
            0,
            client_id=f"c{n:02d}",
            api="produce",
            requests=1,
            max_request_bytes=1024 * n,
            max_response_bytes=1024 * n,
        )
        for n in range(1, 13)
    ]
    windows += [
        window(
            "client_api",
            60 * n,
            client_id="bulk",
            api="produce",
            requests=2,
            max_request_bytes=1 << 20,
            max_response_bytes=1 << 20,
        )
        for n in range(20)
    ]
    evidence = evidence_of(spark, windows)
    expected = [("bulk", 1 << 20)] + [(f"c{n:02d}", 1024 * n) for n in range(12, 3, -1)]
    # 10: only bulk's windows are in the top size bucket, too few pairs: every window is grouped;
    # 29: the buckets from 4 KiB up hold 29 windows of 10 pairs: c01-c03 are left out, exactly
    for rows in (10, 29):
        monkeypatch.setattr(pipeline.traffic, "PAIR_ROWS", rows)
        traffic = measure_traffic(evidence, open_connections(evidence.connections))
        assert [(r["client_id"], r["bytes"]) for r in traffic.largest_requests] == expected
        assert [(r["client_id"], r["bytes"]) for r in traffic.largest_responses] == expected
        assert traffic.largest_requests[0]["ts"] == 0.0  # the earliest of bulk's 1 MiB windows
