"""The shell's admission table on real frames: what is decoded, what is answered."""

from __future__ import annotations

import datetime

from kio.index import load_request_schema

from proxy import wire
from proxy.audit import AuditSink
from proxy.config import parse_config
from proxy.group_tracking import GroupTracking
from proxy.metrics import Metrics
from proxy.request_admission import RequestAdmission


def admission(**policies: object) -> RequestAdmission:
    config = parse_config({
        "upstream": {"bootstrap_servers": ["127.0.0.1:9092"]},
        "listeners": [{"name": "l", "bind": "127.0.0.1:1"}],
        "policies": {"resource.identifier.limit.enable": True, **policies},
    })
    metrics = Metrics()
    audit = AuditSink(config.audit, metrics)
    return RequestAdmission(config.policies, metrics, audit, GroupTracking(config.policies, metrics, audit))


def produce_frame(transactional_id: str, acks: int) -> bytes:
    m = __import__("kio.schema.produce.v9.request", fromlist=["x"])
    body = m.ProduceRequest(
        transactional_id=transactional_id, acks=acks, timeout=datetime.timedelta(seconds=1),
        topic_data=(m.TopicProduceData(name="t", partition_data=(m.PartitionProduceData(index=0, records=None),)),),
    )
    return wire.encode_frame(wire.request_header_for(0, 9, 11, "app"), body)


def test_produce_with_an_over_long_transactional_id_is_answered_per_partition() -> None:
    frame = produce_frame("t" * 250, acks=-1)
    answer = admission().check(wire.peek_request_header(frame), frame, "l", "peer")[0]
    assert answer is not None and answer.frame is not None and not answer.close_after
    response = wire.decode_response(answer.frame, 0, 9)
    assert response.header.correlation_id == 11
    partition = response.body.responses[0].partition_responses[0]
    assert (response.body.responses[0].name, partition.index, partition.error_code) == ("t", 0, 42)


def test_acks_zero_produce_over_the_limit_closes_without_an_answer() -> None:
    frame = produce_frame("t" * 250, acks=0)
    answer = admission().check(wire.peek_request_header(frame), frame, "l", "peer")[0]
    assert answer is not None and answer.frame is None and answer.close_after


def test_an_over_long_client_id_is_answered_then_the_connection_closes() -> None:
    schema = load_request_schema(18, 3)
    frame = wire.encode_frame(
        wire.request_header_for(18, 3, 1, "c" * 250), schema(client_software_name="a", client_software_version="1")
    )
    answer = admission().check(wire.peek_request_header(frame), frame, "l", "peer")[0]
    assert answer is not None and answer.close_after and answer.frame is not None
    assert wire.decode_response(answer.frame, 18, 3).body.error_code == 42


def test_observe_mode_answers_nothing() -> None:
    frame = produce_frame("t" * 250, acks=-1)
    checker = admission(**{"resource.identifier.limit.mode": "observe"})
    assert checker.check(wire.peek_request_header(frame), frame, "l", "peer")[0] is None


def test_at_the_limit_nothing_is_answered_and_produce_is_not_decoded() -> None:
    checker = admission()
    frame = produce_frame("t" * 249, acks=-1)
    assert checker.check(wire.peek_request_header(frame), frame, "l", "peer")[0] is None
    assert wire.PRODUCE not in checker.decoded_api_keys and wire.FETCH not in checker.decoded_api_keys
