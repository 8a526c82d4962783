"""Certificate rotation as a Kubernetes Secret update: kubelet swaps the ``..data``
symlink of the mounted directory holding tls.crt, tls.key and ca.crt; no signal,
no config change. The proxy's file watcher reloads, new handshakes get the new
material, and connections already open keep working on theirs. Real TLS
(trustme certificates, Python's ssl and librdkafka as clients), a real Tansu
broker behind the proxy."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography import x509

from tests.clients import metadata
from tests.conftest import wait_until
from tests.kubelet import ConfigMapDir
from tests.raw_kafka import RawConnection, api_versions_frame

LISTENER = "tls"


def leaf_files(leaf: trustme.LeafCert) -> dict[str, bytes]:
    return {"tls.crt": leaf.cert_chain_pems[0].bytes(), "tls.key": leaf.private_key_pem.bytes()}


def certificate(leaf: trustme.LeafCert) -> x509.Certificate:
    return x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes())


def presented(conn: RawConnection) -> x509.Certificate:
    """The certificate the proxy presented in this connection's handshake, as the client got it."""
    der = conn.sock.getpeercert(binary_form=True)  # type: ignore[union-attr]
    assert der is not None
    return x509.load_der_x509_certificate(der)


def served(conn: RawConnection, correlation_id: int) -> bool:
    """One ApiVersions round trip with the broker, through the proxy."""
    conn.send(api_versions_frame(correlation_id))
    response = conn.read_response(18, 3)
    return bool(response.header.correlation_id == correlation_id and response.body.error_code == 0)


def expiry(proxy: Any) -> float:
    return float(proxy.metric("kafka_admission_tls_certificate_expiry_timestamp_seconds", listener=LISTENER))


def rotate(proxy: Any, secret: ConfigMapDir, files: dict[str, bytes]) -> None:
    """Update the Secret as kubelet does and wait for the reload it causes (no signal)."""
    before = proxy.reloads()
    secret.update(files)
    wait_until(lambda: proxy.reloads() != before, timeout=8)
    assert proxy.reloads() == {**before, "success": before["success"] + 1}, proxy.log()[-2000:]


def days_from_now(days: int) -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(days=days)


@pytest.fixture
def ca(tmp_path: Path) -> tuple[trustme.CA, str]:
    """A CA the clients trust, and its file."""
    authority = trustme.CA()
    path = tmp_path / "client-trust.pem"
    authority.cert_pem.write_to_path(str(path))
    return authority, str(path)


def test_a_secret_update_reaches_new_handshakes_while_an_open_connection_keeps_working(  # type: ignore[no-untyped-def]
    tansu, start_proxy, tmp_path: Path, ca: tuple[trustme.CA, str]
) -> None:
    authority, trusted = ca
    # The renewal also changes the key type (ECDSA -> RSA, as a changed issuer profile does)
    # and the lifetime, so the certificate presented and the expiry exported tell them apart.
    before = authority.issue_cert("127.0.0.1", not_after=days_from_now(30), key_type=trustme.KeyType.ECDSA)
    after = authority.issue_cert("127.0.0.1", not_after=days_from_now(90), key_type=trustme.KeyType.RSA)
    old_cert, new_cert = certificate(before), certificate(after)
    secret = ConfigMapDir(tmp_path / "secret", leaf_files(before))
    proxy = start_proxy(
        tansu.bootstrap,
        listeners=[
            {"name": LISTENER, "tls": {"cert_file": secret.path("tls.crt"), "key_file": secret.path("tls.key")}},
        ],
    )
    assert expiry(proxy) == old_cert.not_valid_after_utc.timestamp()

    with RawConnection(proxy.bootstrap, ca_file=trusted) as opened:
        assert served(opened, 1)
        assert presented(opened).serial_number == old_cert.serial_number

        rotate(proxy, secret, leaf_files(after))

        assert served(opened, 2) and served(opened, 3)  # the open connection keeps its session
        with RawConnection(proxy.bootstrap, ca_file=trusted) as fresh:
            shown = presented(fresh)
            assert (shown.serial_number, shown.subject) == (new_cert.serial_number, new_cert.subject)
            assert served(fresh, 1)
        assert served(opened, 4)
    assert expiry(proxy) == new_cert.not_valid_after_utc.timestamp()
    # librdkafka verifies the new certificate against the same CA and gets Metadata through it.
    brokers = metadata(proxy.bootstrap, **{"security.protocol": "SSL", "ssl.ca.location": trusted}).brokers
    assert len(brokers) == 1
    assert proxy.metric("kafka_admission_tls_handshake_failures_total") == 0


def test_a_client_ca_replaced_by_a_secret_update_is_no_longer_trusted_for_new_handshakes(  # type: ignore[no-untyped-def]
    tansu, start_proxy, tmp_path: Path, ca: tuple[trustme.CA, str]
) -> None:
    authority, trusted = ca
    server = leaf_files(authority.issue_cert("127.0.0.1"))
    retired, current = trustme.CA(), trustme.CA()  # client CAs: before and after the rotation

    def client_of(issuer: trustme.CA, name: str) -> tuple[str, str]:
        leaf = issuer.issue_cert(f"{name}@example.com")
        cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
        leaf.cert_chain_pems[0].write_to_path(str(cert))
        leaf.private_key_pem.write_to_path(str(key))
        return str(cert), str(key)

    old_client, new_client = client_of(retired, "old"), client_of(current, "new")
    secret = ConfigMapDir(tmp_path / "secret", {**server, "ca.crt": retired.cert_pem.bytes()})
    proxy = start_proxy(
        tansu.bootstrap,
        listeners=[
            {
                "name": LISTENER,
                "tls": {
                    "cert_file": secret.path("tls.crt"),
                    "key_file": secret.path("tls.key"),
                    "ca_file": secret.path("ca.crt"),
                    "client_auth": "required",
                },
            }
        ],
    )

    with RawConnection(proxy.bootstrap, ca_file=trusted, cert=old_client) as opened:
        assert served(opened, 1)

        rotate(proxy, secret, {**server, "ca.crt": current.cert_pem.bytes()})

        assert served(opened, 2)  # authenticated before the rotation: stays up
        with RawConnection(proxy.bootstrap, ca_file=trusted, cert=new_client) as fresh:
            assert served(fresh, 1)
        # TLS 1.3: the client finishes its side of the handshake; the proxy's refusal of the
        # client certificate arrives as an alert on the first read.
        with pytest.raises(OSError), RawConnection(proxy.bootstrap, ca_file=trusted, cert=old_client) as refused:
            served(refused, 1)
        assert served(opened, 3)
    assert proxy.metric("kafka_admission_tls_handshake_failures_total", listener=LISTENER) == 1
