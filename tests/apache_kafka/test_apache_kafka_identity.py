"""mTLS identities through the proxy (upstream.tls.client_identity), against Apache
Kafka 4.4 with the StandardAuthorizer in KRaft. Clients present their own certificates
(from a client CA) to the proxy's TLS listener; the proxy reaches the broker's IDENTITY
listener, which trusts only the identity CA, with a certificate it issues for each
client's subject. ACLs allow User:CN=alice to produce to and consume from one topic, and
bob nothing: through the proxy each gets what it gets when connecting directly (the SSL
listener, which trusts the client CA), and the broker's authorizer log names both. A
per-user quota throttles alice through the proxy as directly. SCRAM-SHA-512 and OAUTHBEARER
through the proxy (SASL passes through) reach the authorizer as the same principals."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from kio.schema.alter_client_quotas.v1.request import AlterClientQuotasRequest, EntityData, EntryData, OpData
from kio.static.primitive import f64

from demo.tansu import free_port
from tests.apache_kafka.broker import LOG4J2, ApacheKafkaBroker, BrokerTls, JavaParts
from tests.apache_kafka.conftest import _keystore
from tests.clients import CLIENT_TIMEOUT_S, consume, create_topic, produce_values, unique
from tests.conftest import Certs, wait_until
from tests.identity_certs import cert_pem, client_certificate, identity_ca, key_pem, person, write_ca
from tests.kubelet import ConfigMapDir
from tests.raw_kafka import RawConnection, frame

pytestmark = pytest.mark.apache_kafka
NODES = (ApacheKafkaBroker.NODE_ID,)
# The subject, as the broker reads it (RFC 2253), becomes CN=<name> only with the OU and O
# a client of this shop has: a certificate that lost them maps to no principal at all.
MAPPING_RULES = "RULE:^(CN=[^,]+),OU=(payments|proxies),O=Example$/$1/"
# The StandardAuthorizer logs a denial at INFO and an allowed operation at DEBUG.
AUTHORIZER_LOG = LOG4J2 + "logger.authorizer.name = kafka.authorizer.logger\nlogger.authorizer.level = DEBUG\n"
# SASL users of the SASL_PLAINTEXT listener (SCRAM-SHA-512 credentials, and PLAIN's JAAS users).
SCRAM_USERS = {"alice": "alice-scram-secret", "bob": "bob-scram-secret"}


@dataclass(frozen=True)
class Identities:
    broker: ApacheKafkaBroker
    client_ca: str  # what the proxy's listener and the broker's SSL listener trust
    identity_ca: tuple[str, str]  # the identity CA's certificate and key: the proxy's
    proxy_own: tuple[str, str]  # the proxy's own certificate (issued by the identity CA)
    clients: dict[str, tuple[str, str]]  # name -> certificate, key
    topic: str


def _pair(directory: Path, name: str, cert: Any, key: Any) -> tuple[str, str]:
    cert_file, key_file = directory / f"{name}.pem", directory / f"{name}.key"
    cert_file.write_bytes(cert_pem(cert))
    key_file.write_bytes(key_pem(key))
    key_file.chmod(0o600)
    return str(cert_file), str(key_file)


@pytest.fixture(scope="module")
def identities(java_parts: JavaParts, certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Identities]:
    root = tmp_path_factory.mktemp("identity-kafka")
    client_ca = identity_ca("client CA")
    id_ca = identity_ca("identity CA")
    client_ca_file, _ = write_ca(root, *client_ca, "client-ca")
    id_ca_files = write_ca(root, *id_ca, "identity-ca")
    clients = {
        name: _pair(root, name, *client_certificate(client_ca, person(name))) for name in ("alice", "bob", "carol")
    }
    proxy_own = _pair(root, "proxy", *client_certificate(id_ca, person("kafka-admission-proxy", "proxies")))
    data_listeners = ("PLAINTEXT", "SSL", "IDENTITY", "SASL_PLAINTEXT")
    ports = {name: free_port("127.0.0.1") for name in (*data_listeners, "CONTROLLER")}
    data = [f"{name}://127.0.0.1:{ports[name]}" for name in data_listeners]
    properties = {
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",  # PLAINTEXT: the test's own admin, and the broker itself
        "listeners": ",".join([*data, f"CONTROLLER://127.0.0.1:{ports['CONTROLLER']}"]),
        "advertised.listeners": ",".join(data),
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,IDENTITY:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,"
        "CONTROLLER:PLAINTEXT",
        "ssl.client.auth": "required",
        # Quotas measured over 2 s, not 11: a burst is throttled on its own, not for the history before it.
        # OAUTHBEARER beside SCRAM on the SASL listener, with Kafka's unsecured (test) tokens.
        "sasl.enabled.mechanisms": "SCRAM-SHA-512,PLAIN,OAUTHBEARER",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            + " ".join(f'user_{user}="{password}"' for user, password in SCRAM_USERS.items())
            + ";"
        ),
        "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config": (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
        ),
        "quota.window.num": "2",
        "quota.window.size.seconds": "1",
        "ssl.principal.mapping.rules": MAPPING_RULES,
        # The proxy's listener trusts only the identity CA (the SSL listener: the client CA).
        "listener.name.identity.ssl.truststore.type": "PEM",
        "listener.name.identity.ssl.truststore.location": id_ca_files[0],
    }
    broker = ApacheKafkaBroker(
        java_parts,
        root / "broker",
        tls=BrokerTls(_keystore(certs, root / "keystore.pem"), Path(client_ca_file)),
        properties=properties,
        ports=ports,
        log4j=AUTHORIZER_LOG,
        scram_users=SCRAM_USERS,
    )
    with broker:
        topic = unique("payments")
        create_topic(broker.bootstrap, topic)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        allow = [
            AclBinding(
                ResourceType.TOPIC,
                topic,
                ResourcePatternType.LITERAL,
                principal,
                "*",
                op,
                AclPermissionType.ALLOW,
            )
            for op in (AclOperation.WRITE, AclOperation.READ, AclOperation.DESCRIBE)
            for principal in ("User:CN=alice", "User:alice")  # mTLS, and SCRAM
        ] + [
            AclBinding(
                ResourceType.GROUP,
                "*",
                ResourcePatternType.LITERAL,
                principal,
                "*",
                AclOperation.READ,
                AclPermissionType.ALLOW,
            )
            for principal in ("User:CN=alice", "User:alice")
        ]
        allow += [  # carol may produce, and has no quota
            AclBinding(
                ResourceType.TOPIC,
                topic,
                ResourcePatternType.LITERAL,
                "User:CN=carol",
                "*",
                op,
                AclPermissionType.ALLOW,
            )
            for op in (AclOperation.WRITE, AclOperation.DESCRIBE)
        ]
        for future in admin.create_acls(allow).values():
            future.result(timeout=CLIENT_TIMEOUT_S)
        yield Identities(broker, client_ca_file, id_ca_files, proxy_own, clients, topic)


def tls_client(certs: Certs, cert_key: tuple[str, str]) -> dict[str, str]:
    return {
        "security.protocol": "SSL",
        "ssl.ca.location": certs.ca_file,
        "ssl.certificate.location": cert_key[0],
        "ssl.key.location": cert_key[1],
    }


def identity_proxy(setup: Identities, start_proxy: Any, certs: Certs, **identity: Any) -> Any:
    address = setup.broker.address("IDENTITY")
    listener = {
        "name": "external",
        "tls": {
            "cert_file": certs.server_cert,
            "key_file": certs.server_key,
            "ca_file": setup.client_ca,
            "client_auth": "required",
        },
    }
    upstream = {
        "bootstrap_servers": [address],
        "tls": {
            "enabled": True,
            "ca_file": certs.ca_file,
            "cert_file": setup.proxy_own[0],
            "key_file": setup.proxy_own[1],
            "client_identity": {
                "ca_cert_file": setup.identity_ca[0],
                "ca_key_file": setup.identity_ca[1],
                "validity": "1h",
                **identity,
            },
        },
    }
    proxy = start_proxy(address, node_ids=NODES, listeners=[listener], upstream=upstream)
    wait_until(lambda: proxy.get("/readyz")[0] == 200, timeout=30)
    return proxy


def produce_and_consume(bootstrap: str, topic: str, client: dict[str, str]) -> tuple[set[int], list[bytes], int | None]:
    """(the error codes of the deliveries, the values read back, the consumer's error code)."""
    values = [unique("v").encode() for _ in range(5)]
    produced = produce_values(bootstrap, topic, values, acks="all", **client)
    consume_error = None
    read: list[bytes] = []
    try:
        read = consume(bootstrap, topic, unique("g"), len(values), timeout=15, **client)
    except KafkaException as exc:
        consume_error = exc.args[0].code()
    return {e.code() for e in produced.errors}, read, consume_error


def test_acls_through_the_identity_ca_match_direct_mtls(identities: Identities, start_proxy: Any, certs: Certs) -> None:
    broker, topic = identities.broker, identities.topic
    proxy = identity_proxy(identities, start_proxy, certs)
    seen: dict[str, dict[str, Any]] = {}
    before_proxy = len(broker.log())
    for path, bootstrap in (("proxy", proxy.bootstrap), ("direct", broker.address("SSL"))):
        if path == "direct":
            through_proxy = broker.log()[before_proxy:]  # what the authorizer logged for the proxy's clients
        for name in ("alice", "bob"):
            seen[f"{name} {path}"] = dict(
                zip(
                    ("produce", "read", "consume"),
                    produce_and_consume(bootstrap, topic, tls_client(certs, identities.clients[name])),
                    strict=True,
                )
            )
    for path in ("direct", "proxy"):
        alice, bob = seen[f"alice {path}"], seen[f"bob {path}"]
        assert alice["produce"] == set() and alice["consume"] is None, (path, alice)
        assert len(alice["read"]) >= 5, (path, alice)  # its own values (and, through the proxy, those sent directly)
        assert bob["produce"] == {KafkaError.TOPIC_AUTHORIZATION_FAILED}, (path, bob)
        assert bob["consume"] in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED), bob
    assert seen["bob proxy"]["consume"] == seen["bob direct"]["consume"]
    # The broker's authorizer saw alice and bob through the proxy, not the proxy.
    log = through_proxy
    assert re.search(rf"Principal = User:CN=bob is Denied operation = (WRITE|DESCRIBE) .*{topic}", log)
    assert re.search(rf"Principal = User:CN=alice is Allowed operation = WRITE .*{topic}", log)
    assert not re.search(rf"User:CN=kafka-admission-proxy is \w+ operation = \w+ .*{topic}", log)
    # Many connections of two subjects: two certificates issued, the rest from the cache.
    assert proxy.metric("kafka_admission_upstream_identities_minted_total") == 2
    assert proxy.metric("kafka_admission_upstream_identity_cache_size") == 2
    assert proxy.metric("kafka_admission_upstream_identity_mint_failures_total") == 0
    assert proxy.metric("kafka_admission_connections_accepted_total", tls="true") > 4


def rotate(proxy: Any, secret: ConfigMapDir, files: dict[str, bytes]) -> None:
    """Update the Secret as kubelet does and wait for the reload its file watch causes."""
    before = proxy.reloads()
    secret.update(files)
    wait_until(lambda: proxy.reloads() != before, timeout=8)
    assert proxy.reloads() == {**before, "success": before["success"] + 1}, proxy.log()[-2000:]


def test_a_replaced_identity_ca_signs_new_connections_while_open_ones_keep_working(
    identities: Identities, start_proxy: Any, certs: Certs, tmp_path: Path
) -> None:
    """The broker trusts only the first identity CA: after the Secret holds another one,
    alice's open connection still produces, and her new connections are refused by the
    broker (their certificates are the new CA's, not the cached ones)."""
    secret = ConfigMapDir(
        tmp_path / "identity-ca",
        {
            "ca.pem": Path(identities.identity_ca[0]).read_bytes(),
            "ca.key": Path(identities.identity_ca[1]).read_bytes(),
        },
    )
    setup = Identities(**{**identities.__dict__, "identity_ca": (secret.path("ca.pem"), secret.path("ca.key"))})
    proxy = identity_proxy(setup, start_proxy, certs)
    alice = tls_client(certs, identities.clients["alice"])
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all", **alice})

    def produced(value: bytes) -> KafkaError | None:
        outcome: list[KafkaError | None] = []
        producer.produce(identities.topic, value=value, on_delivery=lambda err, _msg: outcome.append(err))
        producer.flush(CLIENT_TIMEOUT_S)
        assert outcome, "no delivery report"
        return outcome[0]

    assert produced(b"before the rotation") is None
    assert proxy.metric("kafka_admission_upstream_identities_minted_total") == 1
    new_ca = identity_ca("identity CA, rotated")
    rotate(proxy, secret, {"ca.pem": cert_pem(new_ca[0]), "ca.key": key_pem(new_ca[1])})
    assert produced(b"after the rotation, same connection") is None
    with pytest.raises(KafkaException):
        AdminClient({"bootstrap.servers": proxy.bootstrap, **alice}).list_topics(timeout=5)
    # A new certificate for alice, from the new CA, which this broker does not trust.
    assert proxy.metric("kafka_admission_upstream_identities_minted_total") >= 2
    assert "alert certificate unknown" in proxy.log()  # the broker refused it (TLS 1.3: at the first read)
    producer.flush(1)


def test_a_client_without_a_certificate_is_refused_when_the_config_says_so(
    identities: Identities, start_proxy: Any, certs: Certs
) -> None:
    address = identities.broker.address("IDENTITY")
    listener = {
        "name": "external",
        "tls": {
            "cert_file": certs.server_cert,
            "key_file": certs.server_key,
            "ca_file": identities.client_ca,
            "client_auth": "optional",
        },
    }
    upstream = {
        "bootstrap_servers": [address],
        "tls": {
            "enabled": True,
            "ca_file": certs.ca_file,
            "cert_file": identities.proxy_own[0],
            "key_file": identities.proxy_own[1],
            "client_identity": {"ca_cert_file": identities.identity_ca[0], "ca_key_file": identities.identity_ca[1]},
        },
    }
    proxy = start_proxy(address, node_ids=NODES, listeners=[listener], upstream=upstream)
    wait_until(lambda: proxy.get("/readyz")[0] == 200, timeout=30)  # the proxy's own identity serves its probe
    anonymous = {"security.protocol": "SSL", "ssl.ca.location": certs.ca_file}
    with pytest.raises(KafkaException):
        AdminClient({"bootstrap.servers": proxy.bootstrap, **anonymous}).list_topics(timeout=5)
    assert "presented no verified certificate" in proxy.log()
    assert proxy.metric("kafka_admission_connection_failures_total", cause="no_client_identity") >= 1
    # mallory's own CA signs "alice": the listener does not verify it, so nothing is issued for it.
    mallory = client_certificate(identity_ca("mallory's CA"), person("alice"))
    mallory_files = _pair(Path(identities.client_ca).parent, "mallory", *mallory)
    with pytest.raises(KafkaException):
        AdminClient({"bootstrap.servers": proxy.bootstrap, **tls_client(certs, mallory_files)}).list_topics(timeout=5)
    assert proxy.metric("kafka_admission_tls_handshake_failures_total", listener="external") >= 1
    assert proxy.metric("kafka_admission_upstream_identities_minted_total") == 0
    # alice, with her certificate, on the same listener: served as herself.
    alice = tls_client(certs, identities.clients["alice"])
    produced = produce_values(proxy.bootstrap, identities.topic, [b"optional listener"], acks="all", **alice)
    assert produced.errors == [] and len(produced.delivered) == 1
    assert proxy.metric("kafka_admission_upstream_identities_minted_total") == 1


QUOTA_BYTES_PER_S = 8192
ALTER_CLIENT_QUOTAS = 49  # Kafka's ApiKeys.ALTER_CLIENT_QUOTAS


def set_producer_byte_rate(broker: ApacheKafkaBroker, user: str, rate: float) -> None:
    """A per-user quota (KIP-546 AlterClientQuotas, as kafka-configs --entity-type users sends it)."""
    body = AlterClientQuotasRequest(
        entries=(
            EntryData(
                entity=(EntityData(entity_type="user", entity_name=user),),
                ops=(OpData(key="producer_byte_rate", value=f64(float(rate)), remove=False),),
            ),
        ),
        validate_only=False,
    )
    with RawConnection(broker.bootstrap) as conn:
        conn.send(frame(ALTER_CLIENT_QUOTAS, 1, 1, body))
        response = conn.read_response(ALTER_CLIENT_QUOTAS, 1)
    assert [e.error_code for e in response.body.entries] == [0], response


def throttled_ms(bootstrap: str, topic: str, client: dict[str, str], kilobytes: int = 48) -> float:
    """The longest throttle the broker asked of this producer (its throttle_time_ms) while it
    sent ``kilobytes`` KiB."""
    seen: list[float] = [0.0]
    errors: list[KafkaError] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 2048,
            **client,
            "throttle_cb": lambda event: seen.append(event.throttle_time * 1000),
        }
    )
    for _ in range(kilobytes):
        producer.produce(topic, value=b"q" * 1024, on_delivery=lambda err, _m: errors.append(err) if err else None)
        producer.poll(0)
    assert producer.flush(60) == 0
    producer.poll(0.5)  # the last throttle report
    assert errors == []
    return max(seen)


def test_a_per_user_quota_throttles_alice_through_the_proxy_as_directly_and_only_her(
    identities: Identities, start_proxy: Any, certs: Certs
) -> None:
    set_producer_byte_rate(identities.broker, "CN=alice", QUOTA_BYTES_PER_S)
    proxy = identity_proxy(identities, start_proxy, certs)
    alice = tls_client(certs, identities.clients["alice"])
    carol = tls_client(certs, identities.clients["carol"])
    direct = throttled_ms(identities.broker.address("SSL"), identities.topic, alice)
    through_proxy = throttled_ms(proxy.bootstrap, identities.topic, alice)
    carol_through_proxy = throttled_ms(proxy.bootstrap, identities.topic, carol)
    print(
        f"throttle_time_ms max: alice direct {direct:.0f}, alice through the proxy {through_proxy:.0f}, "
        f"carol through the proxy {carol_through_proxy:.0f}"
    )
    assert direct > 0 and through_proxy > 0
    assert direct / 4 <= through_proxy <= direct * 4  # the same burst, the same quota (measured: 1138 and 1139 ms)
    assert carol_through_proxy == 0  # her own quota (none), not one merged with alice's


def scram(user: str, mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": SCRAM_USERS[user],
    }


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_acls_through_the_proxy_match_direct_for_scram_sha_512_and_plain(
    identities: Identities, start_proxy: Any, mechanism: str
) -> None:
    """SASL passes through the proxy: the broker authenticates alice and bob itself, and its
    authorizer sees User:alice and User:bob, as for direct connections."""
    broker, topic = identities.broker, identities.topic
    address = broker.address("SASL_PLAINTEXT")
    proxy = start_proxy(address, node_ids=NODES, listeners=[{"name": "external", "sasl": True}])
    seen: dict[str, tuple[set[int], list[bytes], int | None]] = {}
    before_proxy = len(broker.log())
    for path, bootstrap in (("proxy", proxy.bootstrap), ("direct", address)):
        if path == "direct":
            through_proxy = broker.log()[before_proxy:]
        for name in ("alice", "bob"):
            seen[f"{name} {path}"] = produce_and_consume(bootstrap, topic, scram(name, mechanism))
    for path in ("direct", "proxy"):
        produced, read, consume_error = seen[f"alice {path}"]
        assert produced == set() and consume_error is None and len(read) >= 5, (path, seen[f"alice {path}"])
        assert seen[f"bob {path}"][0] == {KafkaError.TOPIC_AUTHORIZATION_FAILED}, (path, seen[f"bob {path}"])
    assert seen["bob proxy"][2] == seen["bob direct"][2]
    assert re.search(rf"Principal = User:alice is Allowed operation = WRITE .*{topic}", through_proxy)
    assert re.search(rf"Principal = User:bob is Denied operation = DESCRIBE .*{topic}", through_proxy)
    log = proxy.log()
    assert not any(password in log for password in SCRAM_USERS.values())  # credentials never logged


def oauthbearer(user: str) -> dict[str, str]:
    """librdkafka's unsecured JWT (no signature), which Kafka's unsecured validator accepts."""
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "OAUTHBEARER",
        "enable.sasl.oauthbearer.unsecure.jwt": "true",
        "sasl.oauthbearer.config": f"principal={user}",
    }


def test_oauthbearer_through_the_proxy_reaches_the_authorizer_as_directly(
    identities: Identities, start_proxy: Any
) -> None:
    broker, topic = identities.broker, identities.topic
    address = broker.address("SASL_PLAINTEXT")
    proxy = start_proxy(address, node_ids=NODES, listeners=[{"name": "external", "sasl": True}])
    for bootstrap in (proxy.bootstrap, address):
        produced, read, consume_error = produce_and_consume(bootstrap, topic, oauthbearer("alice"))
        assert produced == set() and consume_error is None and len(read) >= 5, bootstrap
        produced, _, _ = produce_and_consume(bootstrap, topic, oauthbearer("bob"))
        assert produced == {KafkaError.TOPIC_AUTHORIZATION_FAILED}, bootstrap
