"""Observation windows: a scripted sequence gives exactly the rows the v2 schema's
``window`` kind describes, with the right values; keys beyond the cap fold into
one overflow row; connection and pool state carries into the next window."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.config.model import Audit
from proxy.evidence.audit import AuditSink
from proxy.evidence.metrics import Metrics
from proxy.evidence.observation_window import SECTIONS, ObservationWindow, window_edge
from tests.audit_files import assert_valid, read_events

T0 = 1_780_000_000.0


def section(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["section"] == name]


def scripted() -> list[dict[str, Any]]:
    w = ObservationWindow(T0, pool_capacity_bytes=1_000_000)
    w.on_connection_open("external", True)
    w.on_connection_open("external", True)
    w.on_connection_open("internal", False)
    w.on_connection_close("external", True)
    w.on_request("external", "app-1", "produce", 1000)
    w.on_request("external", "app-1", "produce", 3000)
    w.on_response("external", "app-1", "produce", 50)
    w.on_response("external", "app-1", "produce", 70)
    w.on_request("external", None, "metadata", 40)
    w.on_group_size("orders", "classic", 3)
    w.on_group_size("orders", "classic", 5)
    w.on_group_size("orders", "classic", 4)
    w.on_group_size("orders", "consumer", 2)
    w.on_identifier("client_id", "app-1", "app-1")
    w.on_identifier("group_id", "app-1", "orders")
    w.on_identifier("group_id", "app-1", "😀" * 200)  # 200 characters, 400 UTF-16 units
    w.on_identifier("group_id", "app-1", "x" * 399)  # shorter in Java's count: not the longest
    w.on_pool(4000)
    w.on_pool(9000, waited=True)
    w.on_pool(2000)
    return w.roll(T0 + 60)


def test_a_scripted_window_gives_the_schema_rows_with_the_right_values(tmp_path: Path) -> None:
    rows = scripted()
    common = {"type": "window", "window_start": T0, "window_seconds": 60.0}
    assert all(r.items() >= common.items() for r in rows)
    assert section(rows, "client_api") == [
        {
            **common,
            "section": "client_api",
            "listener": "external",
            "client_id": "app-1",
            "api": "produce",
            "requests": 2,
            "bytes_in": 4000,
            "bytes_out": 120,
            "max_request_bytes": 3000,
            "max_response_bytes": 70,
        },
        {
            **common,
            "section": "client_api",
            "listener": "external",
            "client_id": None,
            "api": "metadata",
            "requests": 1,
            "bytes_in": 40,
            "bytes_out": 0,
            "max_request_bytes": 40,
            "max_response_bytes": 0,
        },
    ]
    assert {(r["group_id"], r["group_kind"], r["max_members"]) for r in section(rows, "group")} == {
        ("orders", "classic", 5),
        ("orders", "consumer", 2),
    }
    identifiers = {(r["identifier_kind"], r["client_id"]): r for r in section(rows, "identifier")}
    assert identifiers["client_id", "app-1"]["max_length"] == 5
    longest = identifiers["group_id", "app-1"]
    assert longest["max_length"] == 400 and longest["identifier"] == "😀" * 200
    (pool,) = section(rows, "pool")
    assert (pool["capacity_bytes"], pool["high_water_mark_bytes"], pool["waits"]) == (1_000_000, 9000, 1)
    assert {
        (r["listener"], r["tls"], r["max_open"], r["opened"], r["closed"]) for r in section(rows, "connections")
    } == {("external", True, 2, 2, 1), ("internal", False, 1, 1, 0)}
    assert not any("overflow" in r for r in rows)
    # Through the real sink: every row is a valid v2 event.
    sink = AuditSink(Audit(path=str(tmp_path), instance_id="w"), Metrics())
    for row in rows:
        sink.record(row)
    sink.close()
    events = read_events(tmp_path)
    assert_valid(events)
    assert len(events) == len(rows)


def test_the_identifier_kept_is_cut_to_300_characters() -> None:
    w = ObservationWindow(T0)
    w.on_identifier("client_id", None, "c" * 5000)
    (row,) = section(w.roll(T0 + 1), "identifier")
    assert row["max_length"] == 5000 and row["identifier"] == "c" * 300 and row["client_id"] is None


def test_keys_beyond_the_cap_fold_into_one_overflow_row(tmp_path: Path) -> None:
    w = ObservationWindow(T0, max_keys=3)
    for n in range(10):
        w.on_request("external", f"client-{n}", "produce", 100 + n)
        w.on_response("external", f"client-{n}", "produce", 10)
        w.on_group_size(f"group-{n}", "classic", n + 1)
        w.on_identifier("client_id", f"client-{n}", f"client-{n}")
    rows = w.roll(T0 + 60)
    client_api = section(rows, "client_api")
    assert [r["client_id"] for r in client_api] == ["client-0", "client-1", "client-2", None]
    overflow = client_api[-1]
    assert overflow["overflow"] is True and overflow["listener"] is None and overflow["api"] is None
    assert overflow["overflow_cap"] == "keys"
    assert (overflow["requests"], overflow["bytes_in"], overflow["bytes_out"]) == (7, sum(range(103, 110)), 70)
    assert (overflow["max_request_bytes"], overflow["max_response_bytes"]) == (109, 10)
    groups = section(rows, "group")
    assert len(groups) == 4 and groups[-1]["overflow"] is True and groups[-1]["max_members"] == 10
    identifiers = section(rows, "identifier")
    assert len(identifiers) == 4 and identifiers[-1]["overflow"] is True and identifiers[-1]["max_length"] == 8
    sink = AuditSink(Audit(path=str(tmp_path), instance_id="w"), Metrics())
    for row in rows:
        sink.record(row)
    sink.close()
    assert_valid(read_events(tmp_path))
    # The cap is per window: the next window starts empty.
    w.on_request("external", "client-9", "produce", 1)
    assert [r["client_id"] for r in section(w.roll(T0 + 120), "client_api")] == ["client-9"]


def test_long_ids_fold_into_the_overflow_rows_once_the_window_key_bytes_are_spent(tmp_path: Path) -> None:
    """Client ids of 32 KiB (the wire's most): 10k keys of them would be ~320 MB a section.
    The byte budget is the window's, shared by the sections, and a new window starts afresh."""
    budget = 1024 * 1024
    w = ObservationWindow(T0, max_key_bytes=budget)
    for n in range(100):
        client_id = f"{n:05}" + "x" * 32_000
        w.on_request("external", client_id, "produce", 100)
        w.on_identifier("client_id", client_id, client_id)
    w.on_request("external", "short", "produce", 7)  # small keys still fit while bytes are left
    w.on_group_size("group", "classic", 1)
    rows = w.roll(T0 + 60)
    client_api, identifiers, groups = (section(rows, name) for name in ("client_api", "identifier", "group"))
    kept = [r for r in client_api + identifiers + groups if not r.get("overflow")]
    held = sum(len(r.get("client_id") or r.get("group_id") or "") for r in kept)
    assert 0 < held <= budget and len(kept) < 100  # the keys' strings fit the budget; most did not
    for rows_of in (client_api, identifiers):
        overflow = rows_of[-1]
        assert overflow["overflow"] is True and overflow["overflow_cap"] == "key_bytes"
        assert overflow["client_id"] is None
    assert "short" in [r["client_id"] for r in client_api] and groups[0]["group_id"] == "group"
    assert client_api[-1]["requests"] + sum(r["requests"] for r in client_api[:-1]) == 101  # none lost
    assert identifiers[-1]["max_length"] == 32_005
    sink = AuditSink(Audit(path=str(tmp_path), instance_id="w"), Metrics())
    for row in rows:
        sink.record(row)
    sink.close()
    assert_valid(read_events(tmp_path))
    w.on_request("external", "x" * 32_000, "produce", 1)
    assert [r.get("overflow") for r in section(w.roll(T0 + 120), "client_api")] == [None]


def test_open_connections_and_pool_bytes_carry_into_the_next_window() -> None:
    w = ObservationWindow(T0)
    for _ in range(3):
        w.on_connection_open("external", False)
    w.on_connection_open("internal", True)
    w.on_connection_close("internal", True)
    w.on_pool(7000)
    w.roll(T0 + 60)
    w.on_connection_close("external", False)
    rows = w.roll(T0 + 120)
    (conn,) = section(rows, "connections")  # internal had nothing open and no activity: no row
    assert (conn["listener"], conn["max_open"], conn["opened"], conn["closed"]) == ("external", 3, 0, 1)
    (pool,) = section(rows, "pool")
    assert pool["high_water_mark_bytes"] == 7000 and pool["window_start"] == T0 + 60
    assert pool["capacity_bytes"] == -1 and pool["waits"] == 0


def test_an_empty_window_is_one_pool_row() -> None:
    rows = ObservationWindow(T0).roll(T0 + 60)
    assert [r["section"] for r in rows] == ["pool"]


def test_a_workers_window_leaves_the_connections_to_the_supervisor_on_one_grid_of_edges() -> None:
    worker = ObservationWindow(window_edge(1_000_017.5, 60), sections=SECTIONS - {"connections"})
    worker.on_connection_open("plain", False)
    worker.on_request("plain", "app", "fetch", 100)
    rows = worker.roll(window_edge(1_000_020.2, 60))
    assert {r["section"] for r in rows} == {"client_api", "pool"}
    assert {(r["window_start"], r["window_seconds"]) for r in rows} == {(999_960.0, 60.0)}
    supervisor = ObservationWindow(999_960.0, sections=frozenset({"connections"}))
    supervisor.on_connection_open("plain", False)
    assert [r["section"] for r in supervisor.roll(1_000_020.0)] == ["connections"]
