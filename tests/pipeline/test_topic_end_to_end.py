"""End to end through the audit topic: the real proxy (subprocess) in front of Apache Kafka with both
audit sinks on (``audit: {topic: ..., path: ...}``, the topic on that broker), real clients breaking
limits in observe mode (a client id over KIP-1233's 249 characters, a group of three over
``group.max.size: 2``, two TLS connections at once over ``max.ssl.connections: 1``). Then ``report``
from the topic (``kafka://...``) and from the files: the same impact tables, recommended YAML and
coverage, the violators named, the YAML accepted by ``check-config``, and the topic's report.html
rendered in a real headless Chromium. Both reports run on the tests' Spark session (conftest.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer
from conftest import assert_renders, assert_same_report, check_recommended, report_command

from pipeline.recommend import with_headroom
from tests.apache_kafka.broker import ApacheKafkaBroker
from tests.audit_files import assert_valid, read_events
from tests.clients import Member, create_topic, produce, unique, wait_for
from tests.conftest import wait_until

pytestmark = pytest.mark.spark

LONG_CLIENT_ID = "long-client-" + "c" * (250 - len("long-client-"))  # one over resource.identifier.max.length
HEADROOM = 50
POLICIES = {
    "resource.identifier.limit.enable": True,
    "resource.identifier.limit.mode": "observe",
    "group.max.size": 2,
    "group.size.mode": "observe",
    "max.ssl.connections": 1,
    "connections.mode": "observe",
}
CANDIDATES = ("group.max.size=2", "max.ssl.connections=1")


def _decided(proxy: Any, policy: str) -> float:
    return float(proxy.metric("kafka_admission_decisions_total", policy=policy, mode="observe"))


def _traffic(proxy: Any, certs: Any) -> str:
    """A producer with the long client id, two TLS producers connected at once, and a group of three.
    Returns the group id."""
    topic = unique("e2e-topic")
    create_topic(proxy.bootstrap, topic, partitions=3)
    assert produce(proxy.bootstrap, topic, 20, **{"client.id": LONG_CLIENT_ID}) == 20
    assert produce(proxy.bootstrap, topic, 20, **{"client.id": "orders-producer"}) == 20
    tls = {"security.protocol": "SSL", "ssl.ca.location": certs.ca_file}
    producers = [
        Producer({"bootstrap.servers": proxy.listener_bind("tls"), "client.id": f"tls-producer-{n}", **tls})
        for n in range(2)
    ]
    for producer in producers:
        for i in range(10):
            producer.produce(topic, value=b"tls %d" % i)
    assert [producer.flush(30) for producer in producers] == [0, 0]
    wait_until(lambda: _decided(proxy, "connections") >= 1, timeout=20)  # the second TLS connection, let in
    del producers
    group = unique("e2e-group")
    members = [Member(proxy.bootstrap, topic, group, **{"client.id": f"member-{n}"}) for n in range(2)]
    try:
        # Observe mode: the third member joining the full group is a would-be refusal, let through.
        assert wait_for(lambda: all(m.assigned for m in members), timeout=60), [m.errors for m in members]
        members.append(Member(proxy.bootstrap, topic, group, **{"client.id": "member-2"}))
        assert wait_for(lambda: all(m.assigned for m in members), timeout=60), [m.errors for m in members]
        wait_until(lambda: _decided(proxy, "group_size") >= 1, timeout=20)
        time.sleep(1.5)  # a whole observation window with three members in the group
    finally:
        for m in members:
            m.stop()
    assert _decided(proxy, "identifier_limits") >= 1
    return group


def test_a_report_from_the_audit_topic_matches_the_files_and_renders_in_chromium(
    topic_broker: ApacheKafkaBroker,
    start_proxy: Any,
    certs: Any,
    spark: Any,
    chromium: Any,
    tmp_path: Path,
) -> None:
    audit, topic = tmp_path / "audit", unique("audit-events")
    proxy = start_proxy(
        topic_broker.bootstrap,  # the audit topic's bootstrap too (audit.bootstrap_servers' default)
        node_ids=(ApacheKafkaBroker.NODE_ID,),
        listeners=[
            {"name": "external"},
            {"name": "tls", "tls": {"cert_file": certs.server_cert, "key_file": certs.server_key}},
        ],
        policies=POLICIES,
        audit={"topic": topic, "path": str(audit), "instance_id": "e2e-topic-proxy", "window": {"seconds": 1}},
    )
    group = _traffic(proxy, certs)
    assert proxy.metric("kafka_admission_audit_events_dropped_total", sink="topic") == 0
    proxy.stop()  # the topic sink delivers what it holds before the proxy exits
    assert proxy.returncode == 0, proxy.log()
    events = read_events(audit, finished_only=True)
    assert_valid(events)
    assert {e["policy"] for e in events if e["type"] == "decision"} >= {
        "identifier_limits",
        "group_size",
        "connections",
    }

    options = [arg for c in CANDIDATES for arg in ("--candidate", c)]
    options += ["--headroom", str(HEADROOM), "--min-windows", "1"]  # seconds of traffic: one window will do
    by_files, by_topic = tmp_path / "files", tmp_path / "topic"
    assert report_command("--events", str(audit), "--out", str(by_files), *options) == 0
    url = f"kafka://{topic_broker.bootstrap}/{topic}"
    assert report_command("--events", url, "--out", str(by_topic), *options) == 0
    # Every event the files hold came through the topic too, and makes the same report.
    assert json.loads((by_topic / "run.json").read_text())["events"] == len(events)
    assert_same_report(by_files, by_topic)

    # The violators, named under the limits they broke.
    subjects = spark.read.parquet(str(by_topic / "impact" / "subjects")).collect()
    named = {(r["candidate"], r["subject_kind"], r["subject"]) for r in subjects}
    assert ("resource.identifier.max.length=249", "client_id", LONG_CLIENT_ID) in named
    assert ("group.max.size=2", "group_id", group) in named
    tls_named = {(r["subject_kind"], r["subject"]) for r in subjects if r["candidate"] == "max.ssl.connections=1"}
    assert tls_named & {("client_id", "tls-producer-0"), ("client_id", "tls-producer-1")}
    recommended_text = (by_topic / "recommended-policies.yaml").read_text()
    recommended = yaml.safe_load(recommended_text)["policies"]
    assert recommended["group.max.size"] == with_headroom(3, HEADROOM)
    assert recommended["resource.identifier.max.length"] == 250
    peak_tls = max(e["max_open"] for e in events if e.get("section") == "connections" and e["tls"])
    assert peak_tls >= 2 and recommended["max.ssl.connections"] == with_headroom(peak_tls, HEADROOM)
    checked = check_recommended(tmp_path, recommended_text, {**proxy.config, "audit": {"path": None}})
    assert checked.returncode == 0, checked.stderr

    page = assert_renders(chromium, by_topic / "report.html")
    assert LONG_CLIENT_ID[:40] in page["text"] and group in page["text"]
    assert "PROVISIONAL: the evidence spans " in page["text"]
