"""A config generation on real frames: its decode table (what is read, what
travels as bytes, which versions clients are offered) and its hooks' decisions."""

from __future__ import annotations

import datetime
from typing import Any

from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from policies.api_keys import API_VERSIONS, FETCH, JOIN_GROUP, METADATA, PRODUCE
from policies.decision import Action, Policy
from policies.group_size import GroupSizePolicy
from proxy.config.model import parse_config
from proxy.evidence.audit import AuditSink
from proxy.evidence.decisions import DecisionRecorder, Where
from proxy.evidence.metrics import Metrics
from proxy.hooks.generation import Generation
from proxy.hooks.request import Request
from proxy.links.brokers import BrokerDirectory
from proxy.links.upstream import UpstreamLink
from proxy.protocol import wire


def generation(mode: str = "cluster", **policies: object) -> tuple[Generation, Metrics]:
    config = parse_config(
        {
            "mode": mode,
            "upstream": {"bootstrap_servers": ["127.0.0.1:9092"]},
            "listeners": [{"name": "l", "bind": "127.0.0.1:1"}],
            "policies": policies,
        }
    )
    metrics = Metrics()
    recorder = DecisionRecorder(metrics, AuditSink(config.audit, metrics))
    groups = GroupSizePolicy(config.policies.group_size_config())
    return Generation(1, config, groups=groups, directory=BrokerDirectory(metrics), recorder=recorder), metrics


async def _no_coordinator() -> UpstreamLink:
    raise AssertionError("no coordinator in these tests")


def request_of(frame: bytes) -> Request:
    api_key, api_version, correlation_id = wire.peek_head(frame, 0)
    return Request(frame, 0, len(frame), api_key, api_version, correlation_id, Where("l"), _no_coordinator, 0.0)


def produce_frame(transactional_id: str, acks: int, client_id: str = "app") -> bytes:
    m: Any = __import__("kio.schema.produce.v9.request", fromlist=["x"])
    body = m.ProduceRequest(
        transactional_id=transactional_id,
        acks=acks,
        timeout=datetime.timedelta(seconds=1),
        topic_data=(m.TopicProduceData(name="t", partition_data=(m.PartitionProduceData(index=0, records=None),)),),
    )
    return wire.encode_frame(wire.request_header_for(PRODUCE, 9, 11, client_id), body)


def decisions(metrics: Metrics, **labels: str) -> float:
    return sum(
        sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == "kafka_admission_decisions_total" and all(sample.labels[k] == v for k, v in labels.items())
    )


LIMITS_ON = {"resource.identifier.limit.enable": True}


def test_by_default_produce_and_fetch_travel_as_bytes_and_only_addresses_are_read() -> None:
    gen, _ = generation()
    for api_key, version in ((PRODUCE, 9), (FETCH, 15)):
        plan = gen.plan(api_key, version)
        assert plan.request_hooks == () and plan.response_hooks == ()
    assert gen.plan(METADATA, 12).response_hooks  # broker addresses are rewritten
    assert gen.plan(PRODUCE, 10).response_hooks  # NodeEndpoints carry addresses from v10
    assert gen.plan(API_VERSIONS, 3).response_hooks  # versions offered are capped
    assert PRODUCE not in gen.decoded_api_keys and FETCH not in gen.decoded_api_keys


def test_sidecar_mode_reads_nothing_when_no_policy_needs_it() -> None:
    gen, _ = generation("sidecar")
    assert gen.hooks == ()
    for api_key, version in ((METADATA, 12), (PRODUCE, 9)):
        plan = gen.plan(api_key, version)
        assert (plan.request_hooks, plan.prepare_hooks, plan.response_hooks, plan.readable) == ((), (), (), True)


def test_group_apis_are_decoded_only_when_a_group_limit_is_set() -> None:
    assert gen_plan_reads(generation()[0], JOIN_GROUP) is False
    assert gen_plan_reads(generation(**{"group.max.size": 5})[0], JOIN_GROUP) is True


def gen_plan_reads(gen: Generation, api_key: int) -> bool:
    return bool(gen.plan(api_key, 9).request_hooks)


def test_a_version_the_codec_does_not_know_is_unreadable_only_for_apis_that_are_decoded() -> None:
    gen, _ = generation("sidecar", **{"group.max.size": 5})
    newest = wire.max_known_version(JOIN_GROUP)
    assert newest is not None
    assert gen.plan(JOIN_GROUP, newest).readable
    assert not gen.plan(JOIN_GROUP, newest + 1).readable
    assert gen.plan(FETCH, 99).readable  # bytes: any version goes (sidecar: no addresses to rewrite)
    assert not generation("cluster")[0].plan(FETCH, 99).readable  # NodeEndpoints would need rewriting
    assert gen.plan(API_VERSIONS, 99).readable  # the broker answers an unknown version itself


async def test_produce_with_an_over_long_transactional_id_is_answered_per_partition() -> None:
    gen, metrics = generation(**LIMITS_ON)
    request = request_of(produce_frame("t" * 250, acks=-1))
    decision = gen.check_request(request, gen.plan(PRODUCE, 9).request_hooks)
    assert decision is not None and decision.action is Action.REFUSE and not decision.close_after
    response = wire.decode_response(gen.answer(request, decision), PRODUCE, 9)
    assert response.header.correlation_id == 11
    partition = response.body.responses[0].partition_responses[0]
    assert (response.body.responses[0].name, partition.index, partition.error_code) == ("t", 0, 42)
    assert decisions(metrics, policy="identifier_limits", action="refuse", mode="enforce") == 1


async def test_acks_zero_produce_over_the_limit_closes_without_an_answer() -> None:
    gen, _ = generation(**LIMITS_ON)
    request = request_of(produce_frame("t" * 250, acks=0))
    decision = gen.check_request(request, gen.plan(PRODUCE, 9).request_hooks)
    assert decision is not None and decision.action is Action.CLOSE


async def test_an_over_long_client_id_is_answered_then_the_connection_closes() -> None:
    gen, _ = generation(**LIMITS_ON)
    request = request_of(api_versions_request("c" * 250))
    decision = gen.check_request(request, gen.plan(API_VERSIONS, 3).request_hooks)
    assert decision is not None and decision.close_after
    assert decision.policy is Policy.IDENTIFIER_LIMITS and decision.limit_key == "resource.identifier.max.length"
    assert wire.decode_response(gen.answer(request, decision), API_VERSIONS, 3).body.error_code == 42


async def test_observe_mode_records_and_answers_nothing() -> None:
    gen, metrics = generation(**LIMITS_ON, **{"resource.identifier.limit.mode": "observe"})
    request = request_of(produce_frame("t" * 250, acks=-1))
    assert gen.check_request(request, gen.plan(PRODUCE, 9).request_hooks) is None
    assert decisions(metrics, policy="identifier_limits", mode="observe") == 1


async def test_at_the_limit_nothing_is_decided() -> None:
    gen, metrics = generation(**LIMITS_ON)
    request = request_of(produce_frame("t" * 249, acks=-1, client_id="c" * 249))
    assert gen.check_request(request, gen.plan(PRODUCE, 9).request_hooks) is None
    assert decisions(metrics) == 0


async def test_a_client_id_is_checked_again_whenever_it_differs_from_the_last_one_that_passed() -> None:
    # The hook remembers the last client id within the limit (no check per request of a connection);
    # an id over the limit is refused each time, after that one or after itself.
    gen, metrics = generation(**LIMITS_ON)
    hooks = gen.plan(PRODUCE, 9).request_hooks
    over = "c" * 250
    for client_id, refused in (("app", False), (over, True), (over, True), ("app", False), ("app", False)):
        decision = gen.check_request(request_of(produce_frame("t", acks=-1, client_id=client_id)), hooks)
        assert (decision is not None) is refused, client_id
    assert decisions(metrics, policy="identifier_limits", action="refuse") == 2


async def test_a_client_id_that_passed_is_refused_by_a_generation_with_a_lower_limit() -> None:
    before, _ = generation(**LIMITS_ON)
    frame = produce_frame("t", acks=-1, client_id="c" * 100)
    assert before.check_request(request_of(frame), before.plan(PRODUCE, 9).request_hooks) is None
    after, _ = generation(**LIMITS_ON, **{"resource.identifier.max.length": 99})
    decision = after.check_request(request_of(frame), after.plan(PRODUCE, 9).request_hooks)
    assert decision is not None and decision.close_after and decision.limit == 99


API_VERSIONS_V3: Any = load_request_schema(API_VERSIONS, 3)


def api_versions_request(client_id: str) -> bytes:
    body = API_VERSIONS_V3(client_software_name="a", client_software_version="1")
    return wire.encode_frame(wire.request_header_for(API_VERSIONS, 3, 1, client_id), body)


async def test_api_versions_offer_produce_and_fetch_below_their_address_versions() -> None:
    gen, _ = generation()
    request = request_of(api_versions_request("c"))
    response_schema: Any = __import__("kio.schema.api_versions.v3.response", fromlist=["x"])
    body = response_schema.ApiVersionsResponse(
        error_code=ErrorCode.none,
        api_keys=tuple(
            response_schema.ApiVersion(api_key=k, min_version=0, max_version=v) for k, v in ((PRODUCE, 13), (FETCH, 18))
        ),
        throttle_time=datetime.timedelta(0),
        supported_features=(),
        finalized_features_epoch=-1,
        finalized_features=(),
        zk_migration_ready=False,
    )
    header = __import__("kio.schema.response_header.v0.header", fromlist=["x"]).ResponseHeader(correlation_id=1)
    frame = wire.encode_frame(header, body)
    rewritten = await gen.on_response(request, gen.plan(API_VERSIONS, 3).response_hooks, frame)
    assert rewritten is not None
    caps = {int(k.api_key): int(k.max_version) for k in wire.decode_response(rewritten, API_VERSIONS, 3).body.api_keys}
    assert caps == {PRODUCE: 9, FETCH: 15}


def test_plans_are_kept_only_for_the_api_versions_kio_knows() -> None:
    """A client names 2^32 (API key, version) pairs; only the ~300 kio knows keep a plan."""
    gen, _ = generation(**{"group.max.size": 5})
    assert gen.plan(METADATA, 12) is gen.plan(METADATA, 12)
    for api_key, version in ((1000, 0), (METADATA, 99), (METADATA, -1), (PRODUCE, 2)):
        assert gen.plan(api_key, version) is not gen.plan(api_key, version)  # made per request, not kept
    assert gen.plan(1000, 0).readable  # travels as bytes: the broker decides (Kafka closes)
    assert gen.plan(1000, 0).counted_as == gen.plan(2000, 7).counted_as == -1
    assert gen.plan(METADATA, 12).counted_as == METADATA
    assert not gen.plan(JOIN_GROUP, -1).readable  # decoded: a version kio has no schema for is closed
