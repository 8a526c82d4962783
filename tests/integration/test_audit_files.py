"""The v2 audit sink inside the real proxy (subprocess, real Tansu broker, real
client): today's decisions land as valid v2 lines in files named for the
instance, finished (renamed from .jsonl.open) when the proxy stops."""

from __future__ import annotations

import socket
from typing import Any

from tests.audit_files import assert_valid, audit_files, read_events
from tests.clients import create_topic, produce, unique
from tests.conftest import wait_until


def test_the_proxy_writes_valid_v2_audit_files_named_for_its_instance(tansu, start_proxy, tmp_path) -> None:  # type: ignore[no-untyped-def]
    audit = tmp_path / "audit"
    proxy = start_proxy(
        tansu.bootstrap,
        policies={"resource.identifier.limit.enable": True, "resource.identifier.limit.mode": "observe"},
        audit={"path": str(audit), "instance_id": "proxy-it-1"},
    )
    topic = unique("audit")
    create_topic(proxy.bootstrap, topic)
    assert produce(proxy.bootstrap, topic, 3, **{"client.id": "c" * 250}) == 3
    # Written while the proxy runs (flushed per batch) ...
    events = wait_until(lambda: [e for e in read_events(audit) if e.get("client_id") == "c" * 250])
    assert events[0]["policy"] == "identifier_limits" and events[0]["mode"] == "observe"
    # counted just after the line is written (the writer thread, then a worker's metrics file): wait for it
    wait_until(lambda: proxy.metric("kafka_admission_audit_events_total", type="decision") >= 1)
    assert proxy.metric("kafka_admission_audit_events_dropped_total") == 0
    decided = proxy.metric("kafka_admission_decisions_total", policy="identifier_limits")
    proxy.stop()
    assert proxy.returncode == 0, proxy.log()
    # ... and finished when it stops: no .open file left, every line a valid v2 event.
    files = audit_files(audit)
    assert files and all(p.name.startswith("proxy-it-1-") and p.name.endswith(".jsonl") for p in files)
    everything = read_events(audit, finished_only=True)
    assert_valid(everything)
    # With workers, each worker is an instance of its own (one the kernel gave no connection
    # writes nothing), and the supervisor writes the connections' opens as the proxy's instance.
    instances = proxy.audit_instances("proxy-it-1")
    wrote = {e["instance"] for e in everything}
    assert "proxy-it-1" in wrote and wrote <= instances
    # One event per decision: as many as the metric counted (nothing queued was lost at stop).
    decisions = [e for e in everything if e["type"] == "decision"]
    assert len(decisions) == decided > 0
    assert {d["instance"] for d in decisions} <= proxy.deciding_instances("proxy-it-1")
    # The lifecycle of each connection and the last observation window are there too.
    assert {e["type"] for e in everything} == {"decision", "connection", "window"}


def test_connection_opens_carry_what_the_connection_limits_counted(tansu, start_proxy, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The report judges connection limits by these counts: they must be the proxy's own,
    taken as each connection was admitted (itself included, a closed one no longer)."""
    audit = tmp_path / "audit"
    proxy = start_proxy(tansu.bootstrap, audit={"path": str(audit), "instance_id": "proxy-counts"})
    host, port = proxy.bootstrap.rsplit(":", 1)

    def opens() -> list[dict[str, Any]]:
        # by time: with workers: 2 the opens are in two workers' files (read one instance after the other)
        found = [e for e in read_events(audit) if e["type"] == "connection" and e["event"] == "open"]
        return sorted(found, key=lambda e: e["ts"])

    held = []
    for n in range(1, 4):  # one at a time, so the proxy admits them in this order
        held.append(socket.create_connection((host, int(port))))
        wait_until(lambda n=n: len(opens()) == n)
    held.pop(0).close()
    wait_until(lambda: any(e["type"] == "connection" and e["event"] == "close" for e in read_events(audit)))
    held.append(socket.create_connection((host, int(port))))
    wait_until(lambda: len(opens()) == 4)
    counts = [(e["open_connections"], e["open_ssl_connections"], e["open_ip_connections"]) for e in opens()]
    assert counts == [(1, None, 1), (2, None, 2), (3, None, 3), (3, None, 3)]  # plaintext: no TLS count
    for s in held:
        s.close()
    proxy.stop()
    assert_valid(read_events(audit, finished_only=True))
