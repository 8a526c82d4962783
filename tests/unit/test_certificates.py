"""Certificate inspection at load (pyOpenSSL, real certificates from trustme):
what check-config names, and the expiry it exports."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest
import trustme
import yaml
from prometheus_client import Gauge

from proxy.config.certificates import (
    CertificateProblem,
    certificate_files,
    export_certificate_expiry,
    inspect_certificate,
)
from proxy.config.model import ConfigError, parse_config
from proxy.evidence.metrics import Metrics

NOW = dt.datetime.now(dt.UTC)


def write(tmp_path: Path, name: str, blob: trustme.Blob | bytes) -> str:
    path = tmp_path / name
    path.write_bytes(blob if isinstance(blob, bytes) else blob.bytes())
    return str(path)


def leaf_files(tmp_path: Path, cert: trustme.LeafCert, prefix: str = "server") -> tuple[str, str]:
    chain = b"".join(pem.bytes() for pem in cert.cert_chain_pems)
    return write(tmp_path, f"{prefix}.pem", chain), write(tmp_path, f"{prefix}.key", cert.private_key_pem)


def tls_config(cert_file: str, key_file: str, ca_file: str | None = None) -> dict[str, object]:
    return {
        "upstream": {"bootstrap_servers": ["127.0.0.1:9092"]},
        "listeners": [
            {"name": "plain", "bind": "127.0.0.1:29092"},
            {
                "name": "secure",
                "bind": "127.0.0.1:29093",
                "tls": {"cert_file": cert_file, "key_file": key_file, "ca_file": ca_file},
            },
        ],
    }


def test_a_matching_pair_gives_the_leaf_and_its_dates(tmp_path: Path) -> None:
    not_after = (NOW + dt.timedelta(days=30)).replace(microsecond=0)
    cert, key = leaf_files(tmp_path, trustme.CA().issue_cert("proxy.example", not_after=not_after))
    info = inspect_certificate(cert, key)
    assert info.not_after == not_after
    assert info.not_before <= NOW


def test_a_key_of_another_certificate_is_named_with_both_files(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, _ = leaf_files(tmp_path, ca.issue_cert("a.example"), "a")
    _, other_key = leaf_files(tmp_path, ca.issue_cert("b.example"), "b")
    with pytest.raises(CertificateProblem, match=r"b\.key: private key does not match the certificate in .*a\.pem"):
        inspect_certificate(cert, other_key)


def test_an_expired_certificate_is_named_with_its_date(tmp_path: Path) -> None:
    cert, key = leaf_files(
        tmp_path,
        trustme.CA().issue_cert(
            "old.example", not_before=NOW - dt.timedelta(days=10), not_after=NOW - dt.timedelta(days=1)
        ),
    )
    with pytest.raises(CertificateProblem, match=r"server\.pem: certificate \(.*\) expired on \d{4}-\d\d-\d\dT"):
        inspect_certificate(cert, key)


def test_a_certificate_not_yet_valid_is_named(tmp_path: Path) -> None:
    cert, key = leaf_files(
        tmp_path,
        trustme.CA().issue_cert(
            "future.example", not_before=NOW + dt.timedelta(days=1), not_after=NOW + dt.timedelta(days=90)
        ),
    )
    with pytest.raises(CertificateProblem, match="is not valid before"):
        inspect_certificate(cert, key)


def test_an_expired_certificate_further_down_the_chain_is_named_by_position(tmp_path: Path) -> None:
    leaf = trustme.CA().issue_cert("chain.example")
    expired = trustme.CA().issue_cert(
        "old.example", not_before=NOW - dt.timedelta(days=9), not_after=NOW - dt.timedelta(days=2)
    )
    chain = write(tmp_path, "chain.pem", leaf.cert_chain_pems[0].bytes() + expired.cert_chain_pems[0].bytes())
    with pytest.raises(CertificateProblem, match=r"chain\.pem: certificate 2 in the chain \(.*\) expired on"):
        inspect_certificate(chain, None)


def test_a_chain_in_the_wrong_order_is_refused(tmp_path: Path) -> None:
    leaf = trustme.CA().create_child_ca().issue_cert("chain.example")
    assert len(leaf.cert_chain_pems) == 2
    good = inspect_certificate(*leaf_files(tmp_path, leaf))
    reversed_chain = write(tmp_path, "reversed.pem", b"".join(p.bytes() for p in reversed(leaf.cert_chain_pems)))
    with pytest.raises(CertificateProblem, match=r"chain out of order: certificate 2 .* did not issue certificate 1"):
        inspect_certificate(reversed_chain, None)
    assert good.subject


def test_a_file_without_a_certificate_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "notes.pem", b"not a certificate\n")
    with pytest.raises(CertificateProblem, match=r"notes\.pem: no PEM certificate in it"):
        inspect_certificate(path, None)


def test_check_config_names_the_listener_key_and_the_rule_in_one_line(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, _ = leaf_files(tmp_path, ca.issue_cert("a.example"), "a")
    _, other_key = leaf_files(tmp_path, ca.issue_cert("b.example"), "b")
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(tls_config(cert, other_key)))
    result = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", "--config", str(config_file)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[0] == f"config error in {config_file}:"
    assert lines[1].startswith("listeners[1].tls.key_file: ")
    assert "private key does not match" in lines[1]
    assert len(lines) == 2 and "Traceback" not in result.stderr


def test_an_expired_client_ca_is_refused_but_a_bundle_with_one_valid_ca_is_not(tmp_path: Path) -> None:
    cert, key = leaf_files(tmp_path, trustme.CA().issue_cert("a.example"))
    expired_ca = trustme.CA().issue_cert(
        "x.example", not_before=NOW - dt.timedelta(days=9), not_after=NOW - dt.timedelta(days=2)
    )
    only_expired = write(tmp_path, "expired-ca.pem", expired_ca.cert_chain_pems[0].bytes())
    with pytest.raises(ConfigError, match=r"listeners\[1\]\.tls\.ca_file: .*no CA certificate in it is valid now"):
        parse_config(tls_config(cert, key, only_expired))
    bundle = write(tmp_path, "bundle.pem", expired_ca.cert_chain_pems[0].bytes() + trustme.CA().cert_pem.bytes())
    parse_config(tls_config(cert, key, bundle))


def test_expiry_is_exported_per_listener_and_stale_labels_are_dropped(tmp_path: Path) -> None:
    not_after = (NOW + dt.timedelta(days=12)).replace(microsecond=0)
    cert, key = leaf_files(tmp_path, trustme.CA().issue_cert("a.example", not_after=not_after))
    gauge: Gauge = Metrics().certificate_expiry
    export_certificate_expiry(parse_config(tls_config(cert, key)).tls_files(), gauge)
    samples = {s.labels["listener"]: s.value for m in gauge.collect() for s in m.samples}
    assert samples == {"secure": not_after.timestamp()}
    plain_only = tls_config(cert, key)
    plain_only["listeners"] = plain_only["listeners"][:1]  # type: ignore[index]
    export_certificate_expiry(parse_config(plain_only).tls_files(), gauge)
    assert [s for m in gauge.collect() for s in m.samples] == []


def test_certificate_files_names_every_file_a_reload_must_watch(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, key = leaf_files(tmp_path, ca.issue_cert("a.example"))
    ca_file = write(tmp_path, "ca.pem", ca.cert_pem)
    client_cert, client_key = leaf_files(tmp_path, ca.issue_cert("client@example.com"), "client")
    raw = tls_config(cert, key, ca_file)
    raw["upstream"] = {
        "bootstrap_servers": ["127.0.0.1:9092"],
        "tls": {"enabled": True, "ca_file": ca_file, "cert_file": client_cert, "key_file": client_key},
    }
    assert certificate_files(parse_config(raw).tls_files()) == sorted({cert, key, ca_file, client_cert, client_key})
