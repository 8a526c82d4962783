"""Security defaults, proven against the running proxy: the admin endpoint is
local and read-only, TLS is 1.2+ with forward-secret AEAD suites (a real
OpenSSL client speaking TLS 1.0/1.1 is refused by the proxy, while the same
client completes TLS 1.1 with an OpenSSL server), mTLS verifies client
certificates, and key passwords never show in logs, check-config, audit events
or /metrics."""

from __future__ import annotations

import http.client
import os
import re
import ssl
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from cryptography.hazmat.primitives import serialization
from kafka_helpers import Stunnel
from prometheus_client.parser import text_string_to_metric_families

from demo.tansu import TansuBroker, free_port, wait_for_port
from proxy.config.model import Admin, parse_config
from tests import raw_kafka
from tests.conftest import ROOT, wait_until
from tests.raw_kafka import RawConnection, api_versions_frame

# --- admin HTTP -------------------------------------------------------------------


def test_the_admin_endpoint_binds_to_localhost_unless_told_otherwise() -> None:
    assert Admin().bind_address == ("127.0.0.1", 9464)
    minimal = {"upstream": {"bootstrap_servers": ["127.0.0.1:9092"]}, "listeners": [{"name": "a", "bind": "0.0.0.0:1"}]}
    assert parse_config(minimal).admin.bind_address[0] == "127.0.0.1"
    example = yaml.safe_load((ROOT / "deploy" / "config.example.yaml").read_text())
    assert example["admin"]["bind"].startswith("127.0.0.1:")


def admin_request(proxy: Any, method: str, path: str, body: bytes | None = None) -> int:
    host, port = proxy.config["admin"]["bind"].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        return conn.getresponse().status
    finally:
        conn.close()


def kafka_admission_samples(proxy: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    _, text = proxy.get("/metrics")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        # trio_tasks counts live tasks, the admin request being answered among them
        if s.name.startswith("kafka_admission_") and s.name != "kafka_admission_trio_tasks"
    }


STATE_CHANGING = ["POST", "PUT", "PATCH", "DELETE"]
OTHER_METHODS = ["HEAD", "OPTIONS", "TRACE", "PROPFIND"]
PATHS = ["/metrics", "/healthz", "/readyz", "/", "/config", "/reload", "/shutdown", "/admin", "/quitquitquit"]


def test_the_admin_endpoint_changes_nothing_whatever_it_is_sent(tansu: TansuBroker, start_proxy: Any) -> None:
    proxy = start_proxy(tansu.bootstrap, policies={"group.max.size": 3})
    before = kafka_admission_samples(proxy)
    statuses = {}
    for method in STATE_CHANGING + OTHER_METHODS:
        for path in PATHS:
            body = b'{"policies": {"group.max.size": 1}}' if method in STATE_CHANGING else None
            statuses[method, path] = admin_request(proxy, method, path, body)
    for path in ["/config", "/reload", "/shutdown", "/admin", "/metrics/../config", "/%2e%2e/etc/passwd"]:
        statuses["GET", path] = admin_request(proxy, "GET", path)

    refused = {k: v for k, v in statuses.items() if 400 <= v < 500}
    assert refused == statuses, {k: v for k, v in statuses.items() if k not in refused}
    assert {statuses[m, p] for m in STATE_CHANGING for p in PATHS} == {405}
    # Nothing changed: the same kafka_admission_* samples, the same policy, still serving.
    assert kafka_admission_samples(proxy) == before
    assert proxy.get("/readyz") == (200, "ready\n")
    assert proxy.process.poll() is None
    with RawConnection(proxy.bootstrap) as conn:
        conn.send(api_versions_frame(7))
        assert conn.read_response(18, 3).header.correlation_id == 7
    checked = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", "--config", str(proxy.config_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert yaml.safe_load(checked.stdout)["policies"]["group.max.size"] == 3


# --- TLS versions and cipher suites --------------------------------------------------


def tls_listener(certs: Any, **tls: Any) -> dict[str, Any]:
    return {"name": "tls", "tls": {"cert_file": certs.server_cert, "key_file": certs.server_key, **tls}}


def s_client(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["openssl", "s_client", "-connect", address, "-servername", "localhost", *args],
        input="",
        capture_output=True,
        text=True,
        timeout=20,
    )


@pytest.fixture(scope="module")
def openssl_tls11_server(certs: Any) -> Iterator[str]:
    """The control: an OpenSSL server that does allow TLS 1.0 and 1.1 at security level 0."""
    port = free_port()
    server = subprocess.Popen(
        [
            "openssl",
            "s_server",
            "-accept",
            f"127.0.0.1:{port}",
            "-cert",
            certs.server_cert,
            "-key",
            certs.server_key,
            "-cipher",
            "DEFAULT@SECLEVEL=0",
            "-min_protocol",
            "TLSv1",
            "-naccept",
            "100",
            "-quiet",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_port("127.0.0.1", port)
    yield f"127.0.0.1:{port}"
    server.kill()
    server.wait()


@pytest.mark.parametrize("version", ["-tls1", "-tls1_1"])
def test_a_tls_1_0_or_1_1_client_is_refused_by_the_proxy(
    version: str,
    tansu: TansuBroker,
    start_proxy: Any,
    certs: Any,
    openssl_tls11_server: str,
) -> None:
    # The same client, pointed at a server that allows old TLS, completes the handshake:
    # this OpenSSL can speak the old version, so a refusal can only come from the proxy.
    control = s_client(openssl_tls11_server, version, "-cipher", "DEFAULT@SECLEVEL=0")
    assert control.returncode == 0, control.stdout + control.stderr
    assert f"Protocol  : TLSv1{'.1' if version == '-tls1_1' else ''}\n" in control.stdout

    proxy = start_proxy(tansu.bootstrap, listeners=[tls_listener(certs)])
    refused = s_client(proxy.bootstrap, version, "-cipher", "DEFAULT@SECLEVEL=0")

    assert refused.returncode != 0
    assert "New, (NONE), Cipher is (NONE)" in refused.stdout, refused.stdout  # no session was established
    wait_until(lambda: proxy.metric("kafka_admission_tls_handshake_failures_total", listener="tls") == 1)
    assert "UNSUPPORTED_PROTOCOL" in proxy.log()
    assert proxy.metric("kafka_admission_requests_total") == 0


def test_tls_1_2_is_refused_with_a_cbc_suite_and_accepted_with_an_aead_one(
    tansu: TansuBroker,
    start_proxy: Any,
    certs: Any,
) -> None:
    proxy = start_proxy(tansu.bootstrap, listeners=[tls_listener(certs)])
    # trustme's keys are ECDSA; both key types are offered so the test holds for RSA too.
    cbc = s_client(proxy.bootstrap, "-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-SHA256:ECDHE-RSA-AES128-SHA256")
    assert cbc.returncode != 0
    assert "New, (NONE), Cipher is (NONE)" in cbc.stdout, cbc.stdout
    wait_until(lambda: proxy.metric("kafka_admission_tls_handshake_failures_total", listener="tls") == 1)
    assert "NO_SHARED_CIPHER" in proxy.log()
    aead = s_client(proxy.bootstrap, "-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256")
    assert aead.returncode == 0, aead.stderr
    assert re.search(r"Cipher is ECDHE-(ECDSA|RSA)-AES128-GCM-SHA256", aead.stdout), aead.stdout
    tls13 = s_client(proxy.bootstrap, "-tls1_3")
    assert tls13.returncode == 0, tls13.stderr
    assert "New, TLSv1.3, Cipher is TLS_" in tls13.stdout, tls13.stdout


# --- mTLS ------------------------------------------------------------------------------


def api_versions_over_tls(address: str, ctx: ssl.SSLContext) -> int:
    """Correlation id of the answer to one ApiVersions request over TLS."""
    return raw_kafka.api_versions_over_tls(address, ctx, 11)[0]


def client_context(ca_file: str, cert: trustme.LeafCert | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca_file)
    if cert is not None:
        cert.configure_cert(ctx)
    return ctx


def test_mtls_refuses_an_untrusted_or_missing_client_certificate_and_accepts_a_trusted_one(
    tansu: TansuBroker,
    start_proxy: Any,
    certs: Any,
    tmp_path: Path,
) -> None:
    trusted_ca = trustme.CA()
    trusted_ca.cert_pem.write_to_path(str(tmp_path / "clients-ca.pem"))
    proxy = start_proxy(
        tansu.bootstrap,
        listeners=[tls_listener(certs, ca_file=str(tmp_path / "clients-ca.pem"), client_auth="required")],
    )

    outcomes, reasons = {}, {}
    for name, cert in {
        "missing": None,
        "untrusted CA": trustme.CA().issue_cert("mallory@example.com"),
        "trusted CA": trusted_ca.issue_cert("alice@example.com"),
    }.items():
        try:
            outcomes[name] = api_versions_over_tls(proxy.bootstrap, client_context(certs.ca_file, cert))
        except (ssl.SSLError, ConnectionError) as exc:
            outcomes[name] = type(exc).__name__
            reasons[name] = str(exc)

    assert outcomes["trusted CA"] == 11
    # The client reads TLS's own alert, not a reset: the proxy lingers for it to arrive.
    assert outcomes["missing"] == "SSLError" and "CERTIFICATE_REQUIRED" in reasons["missing"]
    assert outcomes["untrusted CA"] in ("SSLError", "ConnectionResetError", "ConnectionError")
    assert proxy.metric("kafka_admission_tls_handshake_failures_total", listener="tls") == 2
    assert proxy.metric("kafka_admission_requests_total") == 1  # only the trusted client's
    assert "CERTIFICATE_VERIFY_FAILED" in proxy.log()  # the untrusted CA, named
    assert "PEER_DID_NOT_RETURN_A_CERTIFICATE" in proxy.log()  # the missing one


# --- key passwords ----------------------------------------------------------------------


def encrypted_key(cert: trustme.LeafCert, password: bytes, path: Path) -> str:
    key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), None)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(password),
        )
    )
    return str(path)


@pytest.fixture
def tls_upstream(stunnel_bin: str, certs: Any, tmp_path: Path) -> Iterator[str]:
    """Tansu behind stunnel (TLS), advertising only the TLS address."""
    tls_port = free_port()
    with (
        TansuBroker(advertised=f"127.0.0.1:{tls_port}") as broker,
        Stunnel(
            stunnel_bin,
            tmp_path,
            accept_port=tls_port,
            connect=broker.bootstrap,
            cert_file=certs.server_cert,
            key_file=certs.server_key,
        ) as tunnel,
    ):
        yield tunnel.address


def test_key_passwords_come_from_a_file_or_the_environment_and_never_show(
    tls_upstream: str,
    start_proxy: Any,
    certs: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ca = trustme.CA()
    listener_password = f"listener-{uuid.uuid4().hex}"
    upstream_password = f"upstream-{uuid.uuid4().hex}"
    server = ca.issue_cert("localhost", "127.0.0.1")
    server.cert_chain_pems[0].write_to_path(str(tmp_path / "server.pem"))
    password_file = tmp_path / "listener-key.password"
    password_file.write_text(listener_password + "\n")  # a trailing newline, as editors write it
    client = ca.issue_cert("proxy@example.com")
    client.cert_chain_pems[0].write_to_path(str(tmp_path / "client.pem"))
    monkeypatch.setenv("PROXY_UPSTREAM_KEY_PASSWORD", upstream_password)
    audit = tmp_path / "audit"

    proxy = start_proxy(
        tls_upstream,
        listeners=[
            {
                "name": "tls",
                "tls": {
                    "cert_file": str(tmp_path / "server.pem"),
                    "key_file": encrypted_key(server, listener_password.encode(), tmp_path / "server.key"),
                    "key_password_file": str(password_file),
                },
            }
        ],
        upstream={
            "bootstrap_servers": [tls_upstream],
            "tls": {
                "enabled": True,
                "ca_file": certs.ca_file,
                "cert_file": str(tmp_path / "client.pem"),
                "key_file": encrypted_key(client, upstream_password.encode(), tmp_path / "client.key"),
                "key_password_env": "PROXY_UPSTREAM_KEY_PASSWORD",
            },
        },
        audit={"path": str(audit)},
        extra_args=["--log-level", "debug"],
    )
    ca_file = tmp_path / "listener-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    # Both encrypted keys are in use: a TLS client through the TLS listener to the TLS broker.
    assert api_versions_over_tls(proxy.bootstrap, client_context(str(ca_file), None)) == 11
    with RawConnection(proxy.bootstrap) as plaintext:  # an audited refusal
        plaintext.send(api_versions_frame(1))
        assert plaintext.bytes_until_closed() == b""
    _, metrics = proxy.get("/metrics")
    _, ready = proxy.get("/readyz")
    checked = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", "--config", str(proxy.config_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=os.environ,
    )
    proxy.stop()

    assert checked.returncode == 0, checked.stderr
    assert ready == "ready\n"
    audited = "".join(path.read_text() for path in sorted(audit.iterdir()))
    assert '"policy":"protocol"' in audited
    seen = {
        "log": proxy.log(),
        "audit": audited,
        "metrics": metrics,
        "check-config": checked.stdout + checked.stderr,
        "config file": proxy.config_path.read_text(),
    }
    for where, text in seen.items():
        assert text, where
        for password in (listener_password, upstream_password):
            assert password not in text, f"a key password shows in the {where}"


@pytest.mark.parametrize(
    ("command", "with_password_file"), [("run", True), ("check-config", False)], ids=["run-wrong", "check-none"]
)
def test_a_wrong_or_missing_key_password_is_one_line_naming_the_key_and_its_source(
    command: str,
    with_password_file: bool,
    tmp_path: Path,
) -> None:
    cert = trustme.CA().issue_cert("localhost")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "server.pem"))
    key = encrypted_key(cert, b"the-right-one", tmp_path / "server.key")
    (tmp_path / "pw").write_text("not-the-right-one")
    tls = {"cert_file": str(tmp_path / "server.pem"), "key_file": key}
    if with_password_file:
        tls["key_password_file"] = str(tmp_path / "pw")
    config = tmp_path / "proxy.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
                "listeners": [{"name": "tls", "bind": f"127.0.0.1:{free_port()}", "tls": tls}],
                "admin": {"bind": f"127.0.0.1:{free_port()}"},
            }
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "proxy.cli", command, "--config", str(config)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[0] == f"config error in {config}:"
    (line,) = result.stderr.splitlines()[1:]
    assert line.startswith("listeners[0].tls.key_file: ") and key in line
    if with_password_file:
        assert f"with the password from {tmp_path / 'pw'} (wrong password?)" in line
    else:
        assert "is encrypted: set key_password_file or key_password_env" in line
    assert "right-one" not in result.stderr
