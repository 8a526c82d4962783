"""End to end: the real proxy (subprocess) with audit on in front of a real Tansu
broker, real clients over plaintext and TLS breaking limits in observe mode (a
250-character client id, a group of three over ``group.max.size: 2``, requests
beyond the memory pool's budget), then ``kafka-admission-proxy report`` over its
audit directory (the command in this process, on the tests' Spark session; the
standalone-cluster test runs it in a process of its own): the impact tables name that client id and
that group, ``recommended-policies.yaml`` follows the traffic and passes
``check-config``, and ``report.html`` renders every policy section and its plots
in a real headless Chromium. The identifiers are hostile (markup, mathtext, a control
character): every output shows them as the plain text they are."""

from __future__ import annotations

import base64
import html
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer
from conftest import assert_renders, check_recommended, report_command

from pipeline.recommend import with_headroom
from tests.audit_files import assert_valid, read_events
from tests.clients import Member, create_topic, produce, unique, wait_for
from tests.conftest import wait_until

pytestmark = pytest.mark.spark

# Markup for report.html, mathtext for the plots' legends, then padding.
HOSTILE = "<script>alert('id')</script>$\\bad$"
LONG_CLIENT_ID = HOSTILE + "c" * (250 - len(HOSTILE))  # one over KIP-1233's resource.identifier.max.length (249)
MIB = 1024 * 1024
HEADROOM = 50
POLICIES = {
    "resource.identifier.limit.enable": True,
    "resource.identifier.limit.mode": "observe",
    "group.max.size": 2,
    "group.size.mode": "observe",
    "queued.max.request.bytes": MIB,
    "socket.request.max.bytes": MIB,
    "memory.pool.mode": "observe",
}


def tls_listener(certs: Any) -> dict[str, Any]:
    return {"name": "tls", "tls": {"cert_file": certs.server_cert, "key_file": certs.server_key}}


def confluent_tls(certs: Any) -> dict[str, Any]:
    return {"security.protocol": "SSL", "ssl.ca.location": certs.ca_file}


def make_traffic(proxy: Any, certs: Any) -> str:
    """Plaintext and TLS producers, a group of three, and four requests of 1 MiB announced at once
    (4 MiB in flight over a 1 MiB pool). Returns the group id."""
    tls = confluent_tls(certs)
    tls_bootstrap = proxy.listener_bind("tls")
    topic = unique("e2e")
    create_topic(proxy.bootstrap, topic, partitions=3)
    assert produce(proxy.bootstrap, topic, 20, **{"client.id": LONG_CLIENT_ID}) == 20
    assert produce(proxy.bootstrap, topic, 20, **{"client.id": "orders-producer"}) == 20
    # Two TLS producers connected at once: two TLS connections open together at least.
    producers = [
        Producer({"bootstrap.servers": tls_bootstrap, "client.id": f"tls-producer-{n}", **tls}) for n in range(2)
    ]
    for producer in producers:
        for i in range(10):
            producer.produce(topic, value=b"tls %d" % i)
    assert [producer.flush(30) for producer in producers] == [0, 0]
    del producers
    # The largest group: its id is a plot legend's label and the YAML's reason for group.max.size.
    group = unique("$\\bad$<b>g</b>") + "\x01"
    members = [Member(proxy.bootstrap, topic, group, **{"client.id": f"member-{n}"}) for n in range(2)]
    try:
        # Observe mode: a third member joining the full group is recorded as a would-be refusal and
        # let through. (It joins once the two are in: what joins racing into one rebalance count
        # is the group-size policy's business, tests/integration and tests/apache_kafka.)
        assert wait_for(lambda: all(m.assigned for m in members), timeout=60), [m.errors for m in members]
        members.append(Member(proxy.bootstrap, topic, group, **{"client.id": "member-2"}))
        assert wait_for(lambda: all(m.assigned for m in members), timeout=60), [m.errors for m in members]
        wait_until(
            lambda: proxy.metric("kafka_admission_decisions_total", policy="group_size", mode="observe") >= 1,
            timeout=20,
        )
        time.sleep(1.5)  # a whole observation window with three members in the group
    finally:
        for m in members:
            m.stop()
    host, port = proxy.bootstrap.rsplit(":", 1)
    senders = [socket.create_connection((host, int(port))) for _ in range(4)]
    try:
        for sock in senders:
            sock.sendall(MIB.to_bytes(4, "big") + b"\0" * 100)
        wait_until(
            lambda: proxy.metric("kafka_admission_decisions_total", policy="memory_pool", mode="observe") >= 1,
            timeout=20,
        )
        time.sleep(1.5)  # the pool's high-water mark lands in a window
    finally:
        for sock in senders:
            sock.close()
    return group


def test_report_over_a_real_proxys_audit_names_the_violators_and_renders_in_chromium(
    tansu: Any,
    start_proxy: Any,
    certs: Any,
    spark: Any,
    chromium: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    audit = tmp_path / "audit"
    proxy = start_proxy(
        tansu.bootstrap,
        listeners=[{"name": "external"}, tls_listener(certs)],
        policies=POLICIES,
        audit={"path": str(audit), "instance_id": "e2e-proxy", "window": {"seconds": 1}},
    )
    group = make_traffic(proxy, certs)
    proxy.stop()
    assert proxy.returncode == 0, proxy.log()
    events = read_events(audit, finished_only=True)
    assert_valid(events)
    assert {e["type"] for e in events} == {"decision", "connection", "window"}
    decided = {e["policy"] for e in events if e["type"] == "decision"}
    assert decided >= {"identifier_limits", "group_size", "memory_pool"}

    out = tmp_path / "report"
    # Seconds of traffic: every number is provisional (test_demo_report.py: and too thin under the default
    # --min-windows); one window is enough here, to check the numbers the traffic gives.
    status = report_command(
        "--events",
        str(audit),
        "--out",
        str(out),
        "--headroom",
        str(HEADROOM),
        "--candidate",
        "group.max.size=2",
        "--candidate",
        "max.ssl.connections=1",
        "--min-windows",
        "1",
    )
    run = capsys.readouterr()
    assert status == 0, run.err[-4000:]
    assert f"report: {out / 'report.html'}" in run.out
    assert "report: done in" in run.err  # progress on stderr, step by step

    # Impact tables (Parquet): that client id and that group, under the limits they broke.
    subjects = spark.read.parquet(str(out / "impact" / "subjects")).collect()
    named = {(r["candidate"], r["subject_kind"], r["subject"]) for r in subjects}
    assert ("resource.identifier.max.length=249", "client_id", LONG_CLIENT_ID) in named
    assert ("resource.identifier.max.length=249", "identifier", LONG_CLIENT_ID) in named
    assert ("group.max.size=2", "group_id", group) in named
    group_rows = [r for r in subjects if r["candidate"] == "group.max.size=2" and r["subject"] == group]
    assert max(r["worst"] for r in group_rows) == 3
    tls_named = {(r["subject_kind"], r["subject"]) for r in subjects if r["candidate"] == "max.ssl.connections=1"}
    assert ("client_address", "127.0.0.1") in tls_named
    assert tls_named & {("client_id", "tls-producer-0"), ("client_id", "tls-producer-1")}
    summary_rows = spark.read.parquet(str(out / "impact" / "summary")).collect()
    summary = {(r["candidate"], r["evidence"]): r for r in summary_rows}
    assert summary[("group.max.size=2", "window")]["groups"] == 1
    assert summary[("group.max.size=2", "decision")]["occurrences"] >= 1  # the recorded observe decision

    # Recommended policies: the keys the traffic speaks for, its values, and the proxy accepts them.
    recommended = yaml.safe_load((out / "recommended-policies.yaml").read_text())["policies"]
    assert recommended["group.max.size"] == with_headroom(3, HEADROOM)
    assert recommended["resource.identifier.limit.enable"] is True
    assert recommended["resource.identifier.max.length"] == 250  # raised to let the client id seen pass
    peak_tls = max(e["max_open"] for e in events if e.get("section") == "connections" and e["tls"])
    assert peak_tls >= 2
    assert recommended["max.ssl.connections"] == with_headroom(peak_tls, HEADROOM)
    pool_peak = max(e["high_water_mark_bytes"] for e in events if e.get("section") == "pool")
    assert pool_peak >= 4 * MIB
    assert recommended["queued.max.request.bytes"] >= recommended["socket.request.max.bytes"]
    largest_request = max(e["max_request_bytes"] for e in events if e.get("section") == "client_api")
    assert largest_request < recommended["socket.request.max.bytes"] <= with_headroom(largest_request, HEADROOM) + 1024
    text = (out / "recommended-policies.yaml").read_text()
    comments = [line for line in text.splitlines() if ": " in line and line.startswith("  ")]
    assert comments and all("  # " in line for line in comments)  # a reason on every key
    assert all(line.endswith("(provisional)") for line in comments)  # and it says each is provisional
    assert "\n# PROVISIONAL: the evidence spans " in text
    # The group id in the reason, as text: its control character escaped, as YAML requires.
    assert f"{group[:-1]}\\x01" in (out / "recommended-policies.yaml").read_text()
    # The proxy's own config with the YAML as written in place of its policies, comments and all.
    checked = check_recommended(tmp_path, text, {**proxy.config, "audit": {"path": None}})
    assert checked.returncode == 0, checked.stderr
    effective = yaml.safe_load(checked.stdout)["policies"]
    assert {k: effective[k] for k in recommended} == recommended

    # report.html in a real browser: every policy section with its plots drawn, nothing fetched.
    page = assert_renders(chromium, out / "report.html")
    # Shown as text, not run; the control character as its escape.
    assert LONG_CLIENT_ID[:40] in page["text"] and f"{group[:-1]}\\x01" in page["text"]
    # What the evidence covers, and the warning that it is too short to enforce from.
    assert "What the evidence covers" in page["text"] and "PROVISIONAL: the evidence spans " in page["text"]
    assert "\tprovisional\t" in page["text"]  # the recommended tables' status column
    html_text = (out / "report.html").read_text()
    assert "<script>" not in html_text
    # The groups' legend names the group as it is: matplotlib writes each text into the SVG as a comment.
    [uri] = re.findall(r'data-plot="group-sizes"><img alt="[^"]*" src="data:image/svg\+xml;base64,([^"]+)"', html_text)
    legend = html.escape(f"{group[:-1]}\\x01", quote=False)
    assert f"<!-- {legend} -->" in base64.b64decode(uri).decode()
