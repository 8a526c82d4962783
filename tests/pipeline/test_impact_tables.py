"""Impact of candidate limits on small DataFrames: who each would have refused,
evicted, closed or held back, by each kind of evidence, with Kafka's boundary
(a group may reach exactly group.max.size members)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import connection, counted, decision, evidence_of, window

from pipeline.impact import Candidate, CandidateError, choose_candidates, hits, parse_candidate, subjects, summary
from pipeline.traffic import open_connections

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def evidence(spark: Any) -> Any:
    return evidence_of(
        spark,
        [
            window("group", 0, group_id="g1", group_kind="classic", max_members=40),
            window("group", 60, group_id="g1", group_kind="classic", max_members=57),
            window("group", 0, group_id="g2", group_kind="classic", max_members=10),
            window("group", 0, group_id="k1", group_kind="consumer", max_members=60),
            decision(
                "group_size",
                "group.max.size",
                100,
                client_id="joiner",
                client_address="10.0.0.7:4000",
                group_id="g1",
                api="join_group",
            ),
            connection("open", 1.0, "c1", "10.0.0.1:5001", True, **counted(1, 1, 1)),
            connection("open", 3.0, "c3", "10.0.0.2:5003", True, **counted(2, 2, 1)),
            connection("close", 4.0, "c3", "10.0.0.2:5003", True, client_id="tls-b"),
            connection("open", 5.0, "c4", "10.0.0.1:5004", True, **counted(2, 2, 2)),
            connection("open", 6.0, "x1", "10.0.0.3:5005", True, **counted(None, None, 1)),  # a protected listener
            window(
                "identifier", 0, client_id="x" * 250, identifier_kind="client id", max_length=250, identifier="x" * 250
            ),
            window("identifier", 0, client_id="ok", identifier_kind="client id", max_length=249, identifier="o" * 249),
            window("client_api", 0, client_id="big", api="produce", max_request_bytes=1500, max_response_bytes=10),
            window("client_api", 0, client_id="edge", api="produce", max_request_bytes=1000, max_response_bytes=10),
            window("pool", 0, high_water_mark_bytes=150, capacity_bytes=-1, waits=0),
        ],
    )


def _who(spark: Any, evidence: Any, *labels: str) -> set[tuple[str, str, str, str]]:
    candidates = [parse_candidate(label) for label in labels]
    found = hits(spark, evidence, open_connections(evidence.connections), candidates)
    return {(r["candidate"], r["evidence"], r["subject_kind"], r["subject"]) for r in subjects(found).collect()}


def test_a_group_over_the_candidate_is_named_and_one_at_the_limit_is_not(spark: Any, evidence: Any) -> None:
    who = _who(spark, evidence, "group.max.size=50", "group.max.size=57", "group.consumer.max.size=59")
    groups = {(c, e, s) for c, e, kind, s in who if kind == "group_id"}
    assert groups == {
        ("group.max.size=50", "window", "g1"),  # 57 members > 50
        ("group.max.size=50", "decision", "g1"),  # refused at 100, so at 50 too
        ("group.max.size=57", "decision", "g1"),
        ("group.consumer.max.size=59", "window", "k1"),  # KIP-848 groups have their own key
    }  # g1 at group.max.size=57 by its windows: exactly 57 members is allowed
    assert ("group.max.size=50", "decision", "client_id", "joiner") in who
    assert ("group.max.size=50", "decision", "client_address", "10.0.0.7") in who  # the host, not host:port


def test_a_recorded_decision_does_not_count_for_a_higher_candidate(spark: Any, evidence: Any) -> None:
    who = _who(spark, evidence, "group.max.size=150")
    assert not {w for w in who if w[1] == "decision"}


def test_the_tls_cap_names_hosts_and_the_client_id_from_the_close_event(spark: Any, evidence: Any) -> None:
    who = _who(spark, evidence, "max.ssl.connections=1")
    assert {(kind, s) for _, e, kind, s in who if e == "connection"} == {
        ("client_address", "10.0.0.2"),
        ("client_id", "tls-b"),
        ("client_address", "10.0.0.1"),
        ("instance", "p1"),
    }  # c3 (2nd TLS connection, named by its close) and c4 (2nd again, after c3 closed; no close yet)


def test_the_per_ip_and_broker_caps_judge_the_counts_the_proxy_recorded(spark: Any, evidence: Any) -> None:
    who = _who(spark, evidence, "max.connections.per.ip=1", "max.connections=1")
    assert {(c, s) for c, e, kind, s in who if kind == "client_address"} == {
        ("max.connections.per.ip=1", "10.0.0.1"),  # c4: its host's 2nd
        ("max.connections=1", "10.0.0.2"),  # c3 and c4: the proxy's 2nd; x1 (protected) is not counted
        ("max.connections=1", "10.0.0.1"),
    }


def test_identifiers_sizes_and_pool_over_their_candidates(spark: Any, evidence: Any) -> None:
    who = _who(
        spark,
        evidence,
        "resource.identifier.max.length=249",
        "socket.request.max.bytes=1000",
        "queued.max.request.bytes=100",
        "max.response.size=1000",
    )
    assert ("resource.identifier.max.length=249", "window", "identifier", "x" * 250) in who
    assert ("resource.identifier.max.length=249", "window", "client_id", "x" * 250) in who
    assert not any(s == "ok" or s == "o" * 249 for *_, s in who)  # 249 fits a limit of 249
    assert {s for c, _, kind, s in who if c.startswith("socket") and kind == "client_id"} == {"big"}
    assert ("queued.max.request.bytes=100", "window", "instance", "p1") in who
    assert not any(c.startswith("max.response.size") for c, *_ in who)


def test_summary_has_a_zero_row_for_a_candidate_that_would_have_acted_on_nothing(spark: Any, evidence: Any) -> None:
    candidates = [Candidate("group.max.size", 50), Candidate("group.max.size", 1000, "recommended")]
    found = hits(spark, evidence, open_connections(evidence.connections), candidates)
    rows = {(r["candidate"], r["evidence"]): r for r in summary(spark, found, candidates).collect()}
    assert rows["group.max.size=1000", "none"]["occurrences"] == 0
    assert rows["group.max.size=50", "window"]["occurrences"] == 1
    assert rows["group.max.size=50", "window"]["worst"] == 57
    assert rows["group.max.size=50", "decision"]["client_ids"] == 1


def test_candidates_are_chosen_once_each_with_the_strongest_origin() -> None:
    chosen = choose_candidates(
        [Candidate("group.max.size", 50)],
        configured=[("group.max.size", 50), ("group.max.size", 100), ("no.such.key", 1)],
        recommended=[("group.max.size", 69), ("resource.identifier.max.length", 249)],
    )
    origins = {c.label: c.origin for c in chosen}
    assert origins["group.max.size=50"] == "candidate"
    assert origins["group.max.size=100"] == "configured"
    assert origins["group.max.size=69"] == "recommended"
    assert origins["resource.identifier.max.length=249"] == "recommended"
    assert origins["member.id.max.length=36"] == "kafka default"  # what turning KIP-1233 on would do
    assert "no.such.key=1" not in origins


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("group.max.size", "write KEY=VALUE"),
        ("group.max.sise=5", "'group.max.sise' is not a limit the report evaluates"),
        ("group.max.size=many", "the value of group.max.size must be an integer"),
        ("max.ssl.connections=-1", "must be >= 0"),
    ],
)
def test_a_bad_candidate_is_one_line_naming_it(text: str, message: str) -> None:
    with pytest.raises(CandidateError, match=message):
        parse_candidate(text)
