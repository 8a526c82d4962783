"""Apache Kafka itself (KRaft, from Maven Central's jars) for the tests in this
folder, two brokers per test session, started side by side once:

- ``kafka``: no limits, with PLAINTEXT, SSL (trustme certificates) and
  SASL_PLAINTEXT (SCRAM-SHA-512, user ``alice``) listeners;
- ``limited_kafka``: PLAINTEXT, with the four limits the conformance tests
  compare against the proxy's (``LIMITS``).

A cluster of three (cluster.py) is started by the tests that need several brokers.

Run them on their own with ``pytest -m apache_kafka`` (or ``pytest tests/apache_kafka``).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from tests.apache_kafka.broker import ApacheKafkaBroker, BrokerTls, JavaParts
from tests.apache_kafka.cluster import java_parts_or_skip
from tests.conftest import Certs

SCRAM_USER, SCRAM_PASSWORD = "alice", "alice-secret"
# Clients from 127.0.0.2 get max.connections.per.ip; 127.0.0.1 (the tests' other
# clients, and the proxy) is overridden high, on the broker and the proxy alike.
LIMITED_SOURCE = "127.0.0.2"
LIMITS = {
    "group.max.size": "2",
    "group.consumer.max.size": "2",
    "max.connections.per.ip": "3",
    "max.connections.per.ip.overrides": "127.0.0.1:1000",
    "socket.request.max.bytes": "102400",
}


# (limit, scenario, what the client saw with the broker enforcing, with the proxy enforcing)
ConformanceRows = list[tuple[str, str, list[str], list[str]]]
_CONFORMANCE = pytest.StashKey[ConformanceRows]()


@pytest.fixture(scope="session")
def conformance_rows(request: pytest.FixtureRequest) -> ConformanceRows:
    """Where the conformance tests put what they saw, for the table printed at the end."""
    return request.config.stash.setdefault(_CONFORMANCE, [])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The conformance table (Markdown, as in docs/conformance.md), for the scenarios that ran."""
    rows = config.stash.get(_CONFORMANCE, [])
    if not rows:
        return
    terminalreporter.section("Apache Kafka conformance")
    terminalreporter.write_line("| limit | scenario | broker-enforced | proxy-enforced |")
    terminalreporter.write_line("|---|---|---|---|")
    for limit, scenario, by_broker, by_proxy in rows:
        terminalreporter.write_line(
            f"| `{limit}` | {scenario} | {'; '.join(by_broker)} | "
            + ("same" if by_proxy == by_broker else "; ".join(by_proxy))
            + " |"
        )


@pytest.fixture(scope="session")
def java_parts() -> JavaParts:
    return java_parts_or_skip()


def _keystore(certs: Certs, path: Path) -> Path:
    """The server key (as PKCS#8, which Kafka's PEM keystore needs) and certificate in one file."""
    key = serialization.load_pem_private_key(Path(certs.server_key).read_bytes(), None)
    pkcs8 = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.write_bytes(pkcs8 + Path(certs.server_cert).read_bytes())
    return path


@pytest.fixture(scope="session")
def _brokers(
    java_parts: JavaParts, certs: Certs, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ApacheKafkaBroker, ApacheKafkaBroker]]:
    root = tmp_path_factory.mktemp("apache-kafka")
    tls = BrokerTls(_keystore(certs, root / "keystore.pem"), Path(certs.ca_file))
    brokers = (
        ApacheKafkaBroker(java_parts, root / "unlimited", tls=tls, scram_users={SCRAM_USER: SCRAM_PASSWORD}),
        ApacheKafkaBroker(java_parts, root / "limited", properties=LIMITS),
    )
    with ThreadPoolExecutor(2) as pool:
        started = [pool.submit(b.start) for b in brokers]
    try:
        for future in started:
            future.result()
        yield brokers
    finally:
        for broker in brokers:
            broker.stop()


@pytest.fixture(scope="session")
def kafka(_brokers: tuple[ApacheKafkaBroker, ApacheKafkaBroker]) -> ApacheKafkaBroker:
    return _brokers[0]


@pytest.fixture(scope="session")
def limited_kafka(_brokers: tuple[ApacheKafkaBroker, ApacheKafkaBroker]) -> ApacheKafkaBroker:
    return _brokers[1]
