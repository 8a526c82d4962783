"""A ``tls: passthrough`` listener in front of Apache Kafka's SSL listener with
``ssl.client.auth=required`` and the StandardAuthorizer (KRaft): the proxy relays the
client's TLS undecrypted, so the broker authenticates each client by its own
certificate. An ACL lets ``User:CN=alice`` produce to and consume from a topic; bob,
with his own certificate through the same listener, gets TOPIC_AUTHORIZATION_FAILED,
and the broker's authorizer log names him."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
from confluent_kafka import KafkaError
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from cryptography.hazmat.primitives import serialization

from demo.tansu import free_port
from tests.apache_kafka.broker import ApacheKafkaBroker, BrokerTls, JavaParts
from tests.clients import CLIENT_TIMEOUT_S, consume, create_topic, produce_values
from tests.conftest import wait_until

pytestmark = pytest.mark.apache_kafka
TOPIC, GROUP = "passthrough-acl", "passthrough-acl-group"


@dataclass(frozen=True)
class MtlsKafka:
    broker: ApacheKafkaBroker
    proxy_port: int  # the broker's SSL listener advertises this: the proxy's passthrough port
    ca_file: str
    clients: dict[str, tuple[str, str]]  # name -> (certificate, key)


def _pem_files(directory: Path, name: str, cert: trustme.LeafCert) -> tuple[str, str]:
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    key_path.chmod(0o600)
    return str(cert_path), str(key_path)


@pytest.fixture(scope="module")
def mtls_kafka(java_parts: JavaParts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MtlsKafka]:
    root = Path(tmp_path_factory.mktemp("passthrough-kafka"))
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    server = ca.issue_cert("127.0.0.1", "localhost")
    key = serialization.load_pem_private_key(server.private_key_pem.bytes(), None)
    pkcs8 = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (root / "keystore.pem").write_bytes(pkcs8 + server.cert_chain_pems[0].bytes())
    clients = {
        name: _pem_files(root, name, ca.issue_cert(f"{name}@example.com", common_name=name))
        for name in ("alice", "bob")
    }
    proxy_port = free_port()
    ports = {"PLAINTEXT": free_port(), "SSL": free_port(), "CONTROLLER": free_port()}
    properties = {
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        # The PLAINTEXT listener (the test's admin, the controller, the proxy's readiness) is ANONYMOUS.
        "super.users": "User:ANONYMOUS",
        "listener.name.ssl.ssl.client.auth": "required",
        # The subject "CN=alice,OU=...,O=trustme" is the principal User:CN=alice.
        "ssl.principal.mapping.rules": "RULE:^.*CN=([^,]+).*$/CN=$1/,DEFAULT",
        # Clients reach the SSL listener only through the proxy: that is what it advertises.
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{ports['PLAINTEXT']},SSL://127.0.0.1:{proxy_port}",
    }
    broker = ApacheKafkaBroker(
        java_parts,
        root / "broker",
        properties=properties,
        ports=ports,
        tls=BrokerTls(root / "keystore.pem", root / "ca.pem"),
    )
    with broker:
        yield MtlsKafka(broker, proxy_port, str(root / "ca.pem"), clients)


def as_client(kafka: MtlsKafka, name: str) -> dict[str, Any]:
    cert, key = kafka.clients[name]
    return {
        "security.protocol": "SSL",
        "ssl.ca.location": kafka.ca_file,
        "ssl.certificate.location": cert,
        "ssl.key.location": key,
    }


def allow_alice(broker: ApacheKafkaBroker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    bindings = [
        AclBinding(kind, name, ResourcePatternType.LITERAL, "User:CN=alice", "*", op, AclPermissionType.ALLOW)
        for kind, name, ops in (
            (ResourceType.TOPIC, TOPIC, (AclOperation.WRITE, AclOperation.READ, AclOperation.DESCRIBE)),
            (ResourceType.GROUP, GROUP, (AclOperation.READ,)),
        )
        for op in ops
    ]
    for future in admin.create_acls(bindings).values():
        future.result(timeout=CLIENT_TIMEOUT_S)


def test_each_client_certificate_reaches_the_broker_authorizer_through_passthrough(
    mtls_kafka: MtlsKafka, start_proxy: Any
) -> None:
    broker = mtls_kafka.broker
    create_topic(broker.bootstrap, TOPIC)
    allow_alice(broker)
    listener = {
        "name": "mtls",
        "bind": f"127.0.0.1:{mtls_kafka.proxy_port}",
        "tls": "passthrough",
        "passthrough_brokers": {ApacheKafkaBroker.NODE_ID: broker.address("SSL")},
    }
    proxy = start_proxy(broker.bootstrap, listeners=[listener], mode="sidecar")

    values = [f"alice-{i}".encode() for i in range(20)]
    produced = produce_values(proxy.bootstrap, TOPIC, values, **as_client(mtls_kafka, "alice"))
    assert not produced.errors and len(produced.delivered) == len(values)
    got = consume(proxy.bootstrap, TOPIC, GROUP, len(values), **as_client(mtls_kafka, "alice"))
    assert sorted(got) == sorted(values)

    refused = produce_values(
        proxy.bootstrap, TOPIC, [b"bob"], **as_client(mtls_kafka, "bob"), **{"message.timeout.ms": 15000}
    )
    assert not refused.delivered
    assert [e.code() for e in refused.errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED], refused.errors
    # The broker itself named bob, by his certificate, as the one denied.
    denied = (
        "Principal = User:CN=bob is Denied operation = DESCRIBE from host = 127.0.0.1 "
        f"on resource = Topic:LITERAL:{TOPIC}"
    )
    wait_until(lambda: denied in broker.log(), timeout=10)
    assert "Principal = User:CN=alice is Denied" not in broker.log()
    # Every byte went through the proxy's passthrough listener, none of it read as a frame.
    assert proxy.metric("kafka_admission_connections_accepted_total", listener="mtls", tls="passthrough") >= 3
    assert proxy.metric("kafka_admission_requests_total", listener="mtls") == 0
