"""The identity CA's issuer (proxy/links/identity.py) with real certificates: what an issued
certificate carries, the per-subject cache, renewal, the bound, and check-config's
rules for the CA files."""

from __future__ import annotations

import datetime as dt
import logging
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from proxy.config.certificates import certificate_files
from proxy.config.model import ClientIdentity, ConfigError, UpstreamTls, parse_config
from proxy.evidence.metrics import Metrics
from proxy.links.identity import RENEW_AT, ClientCertificate, IdentityIssuer, IdentityRefused
from proxy.links.upstream import UpstreamConnector
from tests.identity_certs import NOW, cert_pem, client_certificate, identity_ca, person, rdn, write_ca


class Clock:
    """Wall-clock time the test moves (certificates are dated by the wall clock)."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> dt.datetime:
        return self.now


def der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(Encoding.DER)


@pytest.fixture
def ca(tmp_path: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, ClientIdentity]:
    cert, key = identity_ca()
    cert_file, key_file = write_ca(tmp_path, cert, key)
    return cert, key, ClientIdentity(ca_cert_file=cert_file, ca_key_file=key_file, validity=3600)


def issuer_of(settings: ClientIdentity, metrics: Metrics, clock: Clock | None = None, **kw: int) -> IdentityIssuer:
    upstream = UpstreamTls(enabled=True, ca_file=settings.ca_cert_file, client_identity=settings)
    return IdentityIssuer(settings, upstream, metrics, clock=clock or Clock(), **kw)


def minted(metrics: Metrics) -> float:
    return metrics.upstream_identities_minted._value.get()  # type: ignore[attr-defined,no-any-return]


async def test_the_issued_certificate_carries_the_clients_whole_subject_and_sans(ca) -> None:  # type: ignore[no-untyped-def]
    ca_cert, _, settings = ca
    client_ca = identity_ca("client CA")
    # Several RDNs (O, two OUs, a multi-valued one), in an order the proxy must keep.
    rdns = [
        rdn(NameOID.COUNTRY_NAME, "DE"),
        rdn(NameOID.ORGANIZATION_NAME, "Example"),
        rdn(NameOID.ORGANIZATIONAL_UNIT_NAME, "payments"),
        rdn(NameOID.ORGANIZATIONAL_UNIT_NAME, "team-b"),
        x509.RelativeDistinguishedName(
            [x509.NameAttribute(NameOID.COMMON_NAME, "alice"), x509.NameAttribute(NameOID.USER_ID, "a1")]
        ),
    ]
    sans = [
        x509.DNSName("alice.example"),
        x509.RFC822Name("alice@example.com"),
        x509.UniformResourceIdentifier("spiffe://example/alice"),
    ]
    client, _ = client_certificate(client_ca, rdns, sans)
    issuer = issuer_of(settings, Metrics())
    context = await issuer.context_for(der(client))
    assert isinstance(context, ssl.SSLContext)
    issued = issuer.issued(der(client))
    assert issued is not None
    assert issued.subject.public_bytes() == client.subject.public_bytes()  # byte for byte: every RDN, in order
    assert issued.subject.rfc4514_string() == client.subject.rfc4514_string()
    assert (
        issued.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        == client.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    )
    issued.verify_directly_issued_by(ca_cert)
    assert issued.issuer == ca_cert.subject
    assert issued.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert ExtendedKeyUsageOID.CLIENT_AUTH in issued.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert issued.public_key() != client.public_key()  # its own key: the client's key never reaches the proxy
    assert issued.not_valid_after_utc - NOW == dt.timedelta(seconds=3600)


async def test_a_second_connection_of_the_same_subject_reuses_the_cached_certificate(ca) -> None:  # type: ignore[no-untyped-def]
    _, _, settings = ca
    client_ca = identity_ca("client CA")
    alice, _ = client_certificate(client_ca, person("alice"))
    alice_again, _ = client_certificate(client_ca, person("alice"))  # another certificate, same subject
    bob, _ = client_certificate(client_ca, person("bob"))
    metrics = Metrics()
    issuer = issuer_of(settings, metrics)
    first = await issuer.context_for(der(alice))
    assert await issuer.context_for(der(alice)) is first
    assert await issuer.context_for(der(alice_again)) is first
    assert minted(metrics) == 1
    assert await issuer.context_for(der(bob)) is not first
    assert minted(metrics) == 2
    assert metrics.upstream_identity_cache_size._value.get() == 2  # type: ignore[attr-defined]


async def test_a_certificate_near_its_expiry_is_issued_again(ca) -> None:  # type: ignore[no-untyped-def]
    _, _, settings = ca
    alice, _ = client_certificate(identity_ca("client CA"), person("alice"))
    clock, metrics = Clock(), Metrics()
    issuer = issuer_of(settings, metrics, clock)
    first = await issuer.context_for(der(alice))
    old = issuer.issued(der(alice))
    clock.now = NOW + dt.timedelta(seconds=3600 * RENEW_AT - 1)
    assert await issuer.context_for(der(alice)) is first  # not yet
    clock.now = NOW + dt.timedelta(seconds=3600 * RENEW_AT + 1)
    renewed = await issuer.context_for(der(alice))
    assert renewed is not first
    new = issuer.issued(der(alice))
    assert old is not None and new is not None
    assert new.serial_number != old.serial_number
    assert new.not_valid_after_utc == clock.now + dt.timedelta(seconds=3600)
    assert minted(metrics) == 2


async def test_the_cache_is_bounded_least_recently_used_first_out(ca) -> None:  # type: ignore[no-untyped-def]
    _, _, settings = ca
    client_ca = identity_ca("client CA")
    a, b, c = (client_certificate(client_ca, person(n))[0] for n in ("a", "b", "c"))
    issuer = issuer_of(settings, Metrics(), capacity=2)
    await issuer.context_for(der(a))
    await issuer.context_for(der(b))
    await issuer.context_for(der(a))  # a used last: b goes first
    await issuer.context_for(der(c))
    assert len(issuer) == 2
    assert issuer.issued(der(b)) is None
    assert issuer.issued(der(a)) is not None and issuer.issued(der(c)) is not None


async def test_an_issued_certificate_never_outlives_the_clients_own(ca) -> None:  # type: ignore[no-untyped-def]
    _, _, settings = ca
    ends = NOW + dt.timedelta(minutes=10)
    alice, _ = client_certificate(identity_ca("client CA"), person("alice"), not_after=ends)
    issuer = issuer_of(settings, Metrics())
    await issuer.context_for(der(alice))
    issued = issuer.issued(der(alice))
    assert issued is not None and issued.not_valid_after_utc == ends.replace(microsecond=0)


# -- check-config: the CA files ------------------------------------------------------------


def config_with(identity: dict[str, object]) -> dict[str, object]:
    brokers_ca = Path(str(identity["ca_cert_file"])).parent / "brokers-ca.pem"  # verifies the brokers
    brokers_ca.write_bytes(cert_pem(identity_ca("brokers' CA")[0]))
    tls = {"enabled": True, "ca_file": str(brokers_ca), "client_identity": identity}
    return {
        "upstream": {"bootstrap_servers": ["127.0.0.1:9093"], "tls": tls},
        "listeners": [{"name": "external", "bind": "127.0.0.1:29092"}],
    }


def test_client_identity_needs_a_ca_file_for_the_brokers(tmp_path: Path) -> None:
    cert_file, key_file = write_ca(tmp_path, *identity_ca())
    raw = config_with({"ca_cert_file": cert_file, "ca_key_file": key_file})
    raw["upstream"]["tls"]["ca_file"] = None  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"^upstream\.tls: client_identity needs ca_file"):
        parse_config(raw)


def test_a_certificate_that_is_not_a_ca_is_refused_naming_the_file(tmp_path: Path) -> None:
    for name, (cert, key) in {"leaf": identity_ca(ca=False), "bare": identity_ca(ca=None)}.items():
        cert_file, key_file = write_ca(tmp_path, cert, key, name)
        with pytest.raises(ConfigError) as raised:
            parse_config(config_with({"ca_cert_file": cert_file, "ca_key_file": key_file}))
        assert str(raised.value) == (
            f"upstream.tls.client_identity.ca_cert_file: {cert_file}: not a CA certificate "
            + ("(basicConstraints CA:FALSE)" if name == "leaf" else "(no basicConstraints CA:TRUE)")
        )


def test_an_expired_identity_ca_is_refused_naming_the_file(tmp_path: Path) -> None:
    cert, key = identity_ca(not_before=NOW - dt.timedelta(days=60), not_after=NOW - dt.timedelta(days=1))
    cert_file, key_file = write_ca(tmp_path, cert, key)
    with pytest.raises(
        ConfigError, match=rf"^upstream\.tls\.client_identity\.ca_cert_file: {cert_file}: .* expired on"
    ):
        parse_config(config_with({"ca_cert_file": cert_file, "ca_key_file": key_file}))


def test_a_missing_identity_ca_file_is_refused_naming_the_key(tmp_path: Path) -> None:
    cert_file, _ = write_ca(tmp_path, *identity_ca())
    missing = str(tmp_path / "gone.key")
    with pytest.raises(ConfigError, match=rf"upstream\.tls\.client_identity\.ca_key_file: file not found: '{missing}'"):
        parse_config(config_with({"ca_cert_file": cert_file, "ca_key_file": missing}))


def test_a_ca_key_that_is_not_the_ca_certificates_is_refused(tmp_path: Path) -> None:
    cert_file, _ = write_ca(tmp_path, *identity_ca(), "one")
    _, other_key = write_ca(tmp_path, *identity_ca(), "two")
    with pytest.raises(ConfigError, match=r"upstream\.tls\.client_identity\.ca_key_file: .* does not match"):
        parse_config(config_with({"ca_cert_file": cert_file, "ca_key_file": other_key}))


def test_client_identity_needs_upstream_tls(tmp_path: Path) -> None:
    cert_file, key_file = write_ca(tmp_path, *identity_ca())
    raw = config_with({"ca_cert_file": cert_file, "ca_key_file": key_file})
    raw["upstream"]["tls"]["enabled"] = False  # type: ignore[index]
    with pytest.raises(ConfigError, match="client_identity needs enabled: true"):
        parse_config(raw)


@pytest.mark.parametrize(
    ("written", "seconds"), [(3600, 3600), ("90s", 90), ("15m", 900), ("1h", 3600), ("2d", 172800)]
)
def test_validity_is_seconds_or_a_duration(tmp_path: Path, written: object, seconds: int) -> None:
    cert_file, key_file = write_ca(tmp_path, *identity_ca())
    config = parse_config(config_with({"ca_cert_file": cert_file, "ca_key_file": key_file, "validity": written}))
    identity = config.upstream.tls.client_identity
    assert identity is not None and identity.validity == seconds


@pytest.mark.parametrize("written", ["1 hour", "h", "-5m", 10, "31d"])
def test_a_validity_out_of_range_or_unreadable_is_refused(tmp_path: Path, written: object) -> None:
    cert_file, key_file = write_ca(tmp_path, *identity_ca())
    with pytest.raises(ConfigError, match=r"^upstream\.tls\.client_identity\.validity: "):
        parse_config(config_with({"ca_cert_file": cert_file, "ca_key_file": key_file, "validity": written}))


def test_a_ca_key_others_can_read_and_a_ca_without_path_length_zero_are_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cert_file, key_file = write_ca(tmp_path, *identity_ca(path_length=None))
    Path(key_file).chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="kafka_admission_proxy.tls"):
        parse_config(config_with({"ca_cert_file": cert_file, "ca_key_file": key_file}))
    warnings = [r.getMessage() for r in caplog.records]
    assert any(
        w.startswith(f"upstream.tls.client_identity.ca_key_file: {key_file} is readable by every user")
        for w in warnings
    )
    assert any(
        w.startswith(
            f"upstream.tls.client_identity.ca_cert_file: {cert_file}: the identity CA has no pathLenConstraint: 0"
        )
        for w in warnings
    )
    key_text = Path(key_file).read_text()
    assert not any(key_text.splitlines()[1] in w for w in warnings)  # never the key itself


# -- rotation: the connector keeps an issuer while its files are the same -------------------


async def test_a_reload_with_the_same_ca_keeps_the_cache_and_a_replaced_ca_starts_a_new_one(tmp_path: Path) -> None:
    old_ca = identity_ca("identity CA 1")
    cert_file, key_file = write_ca(tmp_path, *old_ca)
    config = parse_config(config_with({"ca_cert_file": cert_file, "ca_key_file": key_file}))
    assert {cert_file, key_file} <= set(certificate_files(config.tls_files()))  # the same file watch
    metrics = Metrics()
    connector = UpstreamConnector(config.upstream.tls, None, metrics, recorder=None)  # type: ignore[arg-type]  # records nothing here
    first = connector.identity
    assert first is not None
    alice, _ = client_certificate(identity_ca("client CA"), person("alice"))
    await first.context_for(der(alice))
    assert connector.prepare_identity(config.upstream.tls) is first  # nothing changed: cache kept
    assert config.upstream.tls.ca_file == write_ca(tmp_path, *identity_ca("brokers' CA, renewed"), "brokers-ca")[0]
    assert connector.prepare_identity(config.upstream.tls) is not first  # its contexts trust the old one
    new_ca = identity_ca("identity CA 2")
    write_ca(tmp_path, *new_ca)  # the same paths, new contents
    second = connector.prepare_identity(config.upstream.tls)
    assert second is not None and second is not first and len(second) == 0
    connector.use_tls(config.upstream.tls, None, second)
    await second.context_for(der(alice))
    issued = second.issued(der(alice))
    assert issued is not None
    issued.verify_directly_issued_by(new_ca[0])
    assert issued.issuer == new_ca[0].subject


@pytest.mark.parametrize("without_certificate", ["refuse", "proxy"])
async def test_a_client_without_a_certificate_gets_what_the_config_says(
    tmp_path: Path, without_certificate: str
) -> None:
    cert_file, key_file = write_ca(tmp_path, *identity_ca())
    identity = {"ca_cert_file": cert_file, "ca_key_file": key_file, "without_certificate": without_certificate}
    config = parse_config(config_with(identity))
    own = ssl.create_default_context()  # stands for the proxy's own context (cert_file)
    metrics = Metrics()
    connector = UpstreamConnector(config.upstream.tls, own, metrics, recorder=None)  # type: ignore[arg-type]
    assert await connector._context_for(None) is own  # the proxy's own requests
    if without_certificate == "proxy":
        assert await connector._context_for(ClientCertificate(None)) is own
    else:
        with pytest.raises(IdentityRefused, match="presented no verified certificate"):
            await connector._context_for(ClientCertificate(None))
    assert minted(metrics) == 0
