"""Real clients through the proxy to a real Tansu broker (plaintext listener)."""

from __future__ import annotations

from tests.clients import consume, create_topic, kafka_python_roundtrip, produce, unique


def test_confluent_kafka_creates_produces_and_consumes_in_a_group(tansu, start_proxy) -> None:
    proxy = start_proxy(tansu.bootstrap)
    topic = unique("orders")
    create_topic(proxy.bootstrap, topic, partitions=3)
    assert produce(proxy.bootstrap, topic, 200) == 200
    values = consume(proxy.bootstrap, topic, unique("group"), 200)
    assert sorted(values) == sorted(f"record-{i}".encode() for i in range(200))
    # Every request went through the proxy, and the broker address was rewritten.
    assert proxy.metric("kafka_admission_requests_total", api="produce") >= 1
    assert proxy.metric("kafka_admission_requests_total", api="join_group") >= 1
    assert proxy.metric("kafka_admission_responses_rewritten_total", api="metadata") >= 1
    assert proxy.metric("kafka_admission_responses_rewritten_total", api="find_coordinator") >= 1


def test_kafka_python_produces_and_consumes_in_a_group(tansu, start_proxy) -> None:
    proxy = start_proxy(tansu.bootstrap)
    topic = unique("kp")
    create_topic(proxy.bootstrap, topic)
    sent = [f"kp-{i}".encode() for i in range(50)]
    values = kafka_python_roundtrip(proxy.bootstrap, topic, unique("kp-group"), sent)
    assert sorted(values) == sorted(f"kp-{i}".encode() for i in range(50))
    assert proxy.metric("kafka_admission_requests_total", api="produce") >= 1


def test_kafka_python_admin_creates_a_topic(tansu, start_proxy) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    proxy = start_proxy(tansu.bootstrap)
    topic = unique("kp-admin")
    admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    assert topic in admin.list_topics()
    admin.close()
    assert proxy.metric("kafka_admission_requests_total", api="create_topics") == 1


def test_acks_zero_produce_gets_no_response_and_keeps_the_connection_in_step(tansu, start_proxy) -> None:
    proxy = start_proxy(tansu.bootstrap)
    topic = unique("acks0")
    create_topic(proxy.bootstrap, topic)
    # acks=0 records get no response; an idempotent producer needs acks=all, so turn it off.
    assert produce(proxy.bootstrap, topic, 100, acks=0, **{"enable.idempotence": False}) == 100
    # Then acks=1 on a fresh producer: responses must still match their requests.
    assert produce(proxy.bootstrap, topic, 10, acks=1, **{"enable.idempotence": False}) == 10
    values = consume(proxy.bootstrap, topic, unique("g"), 110)
    assert len(values) == 110
    assert proxy.metric("kafka_admission_connection_failures_total", cause="unexpected_response") == 0


def test_api_versions_through_the_proxy_cap_produce_fetch_and_rewritten_apis(tansu, start_proxy) -> None:
    from policies.api_keys import DESCRIBE_CLUSTER, FETCH, FIND_COORDINATOR, METADATA, PRODUCE
    from proxy.protocol import wire
    from tests.raw_kafka import RawConnection, api_versions_frame

    with RawConnection(tansu.bootstrap) as direct:
        direct.send(api_versions_frame(1))
        broker = {k.api_key: k.max_version for k in direct.read_response(18, 3).body.api_keys}
    proxy = start_proxy(tansu.bootstrap)
    with RawConnection(proxy.bootstrap) as conn:
        conn.send(api_versions_frame(1))
        offered = {k.api_key: k.max_version for k in conn.read_response(18, 3).body.api_keys}
    assert broker[PRODUCE] >= 10 and broker[FETCH] >= 16  # Tansu offers NodeEndpoints versions
    assert offered[PRODUCE] == 9 and offered[FETCH] == 15
    assert offered[METADATA] == min(broker[METADATA], wire.max_known_version(METADATA))
    unchanged = set(broker) - {PRODUCE, FETCH, METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER}
    assert {k: offered[k] for k in unchanged} == {k: broker[k] for k in unchanged}
