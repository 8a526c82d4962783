"""Certificates for the identity-CA tests, made with cryptography: an identity CA
(pathLenConstraint 0, or whatever a test needs wrong), and client certificates with
whole subject DNs (several RDNs, O and OU included) and SANs."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)  # as certificates carry it


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def identity_ca(
    name: str = "identity CA",
    *,
    ca: bool | None = True,
    path_length: int | None = 0,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA (``ca=None``: no basicConstraints at all)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Example"), x509.NameAttribute(NameOID.COMMON_NAME, name)]
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or NOW - dt.timedelta(days=1))
        .not_valid_after(not_after or NOW + dt.timedelta(days=30))
    )
    if ca is not None:
        builder = builder.add_extension(
            x509.BasicConstraints(ca=ca, path_length=path_length if ca else None), critical=True
        )
    return builder.sign(key, hashes.SHA256()), key


def write_ca(
    directory: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, prefix: str = "identity-ca"
) -> tuple[str, str]:
    cert_file, key_file = directory / f"{prefix}.pem", directory / f"{prefix}.key"
    cert_file.write_bytes(cert_pem(cert))
    key_file.write_bytes(key_pem(key))
    key_file.chmod(0o600)
    return str(cert_file), str(key_file)


def client_certificate(
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    rdns: list[x509.RelativeDistinguishedName],
    sans: list[x509.GeneralName] | None = None,
    *,
    not_after: dt.datetime | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert, ca_key = issuer
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(rdns))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - dt.timedelta(days=1))
        .not_valid_after(not_after or NOW + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def rdn(oid: x509.ObjectIdentifier, value: str) -> x509.RelativeDistinguishedName:
    return x509.RelativeDistinguishedName([x509.NameAttribute(oid, value)])


def person(name: str, unit: str = "payments") -> list[x509.RelativeDistinguishedName]:
    """O=Example, OU=<unit>, CN=<name>: written most-specific last, so Kafka (RFC 2253)
    reads it as CN=<name>,OU=<unit>,O=Example."""
    return [
        rdn(NameOID.ORGANIZATION_NAME, "Example"),
        rdn(NameOID.ORGANIZATIONAL_UNIT_NAME, unit),
        rdn(NameOID.COMMON_NAME, name),
    ]
