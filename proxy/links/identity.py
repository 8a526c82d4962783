"""Client identities toward brokers: for a client whose certificate a listener verified,
the proxy connects to the broker with a short-lived certificate it issues with the
identity CA, carrying the client's subject DN (every RDN, in order) and SANs. The broker
maps that subject to a principal as for a direct connection (Kafka's
``DefaultKafkaPrincipalBuilder`` with ``ssl.principal.mapping.rules``, KIP-371), so its
ACLs, quotas and audit log still tell clients apart.

Issuing is CPU (a key pair and a signature): it runs in a worker thread, two at a time
at most. One certificate and one SSLContext per subject are cached (``cache_size`` of
them, ~27 KB each, least recently used first out) and issued again at two thirds of
their lifetime. The CA key is read here only and never logged; issued certificates only
ever go to brokers."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import ssl
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID

from proxy.config.model import ClientIdentity, UpstreamTls
from proxy.errors import TlsMaterialError
from proxy.evidence.metrics import Metrics
from proxy.links.tls import upstream_trust

__all__ = ["ClientCertificate", "IdentityIssuer", "IdentityRefused", "verified_client_certificate"]

RENEW_AT = 2 / 3  # of a certificate's lifetime
# A broker whose clock runs a little behind still accepts a certificate issued just now.
CLOCK_SKEW = dt.timedelta(minutes=5)
MINTS_AT_ONCE = 2


class IdentityRefused(Exception):
    """No identity for this client: it has no verified certificate and the config says
    refuse, or the CA could not issue one. The message says which."""


@dataclass(frozen=True, slots=True)
class ClientCertificate:
    """What a client connection brings to its broker connections: the DER of the
    certificate its listener verified, or None (no certificate, or none verified)."""

    der: bytes | None


def verified_client_certificate(sock: ssl.SSLSocket) -> ClientCertificate:
    """The peer's certificate, only when the handshake verified it: ``getpeercert()``
    is an empty dict for a certificate received but not verified (client_auth: none),
    and a certificate that fails verification fails the handshake (optional, required)."""
    if not sock.getpeercert():
        return ClientCertificate(None)
    return ClientCertificate(sock.getpeercert(binary_form=True))


@dataclass(frozen=True, slots=True)
class _Issued:
    context: ssl.SSLContext
    certificate: x509.Certificate
    not_after: dt.datetime
    renew_at: dt.datetime


def _signature_hash(key: CertificateIssuerPrivateKeyTypes) -> hashes.SHA256 | None:
    return None if isinstance(key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey) else hashes.SHA256()


def _load_ca(settings: ClientIdentity) -> tuple[x509.Certificate, CertificateIssuerPrivateKeyTypes, bytes]:
    """The CA certificate, its key, and a digest of both files (what a reload compares)."""
    try:
        cert_pem = Path(settings.ca_cert_file).read_bytes()
        key_pem = Path(settings.ca_key_file).read_bytes()
    except OSError as exc:
        raise TlsMaterialError(f"cannot read the identity CA {exc.filename}: {exc.strerror}") from None
    try:
        cert = x509.load_pem_x509_certificates(cert_pem)[0]
    except ValueError:
        raise TlsMaterialError(f"{settings.ca_cert_file}: no PEM certificate in it (identity CA)") from None
    try:
        key = serialization.load_pem_private_key(key_pem, None)
    except (ValueError, TypeError):  # never the key's bytes in a message
        raise TlsMaterialError(f"{settings.ca_key_file}: not an unencrypted PEM private key (identity CA)") from None
    if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
        raise TlsMaterialError(f"{settings.ca_key_file}: this kind of key cannot sign certificates")
    return cert, key, hashlib.sha256(cert_pem + b"\0" + key_pem).digest()


def _load_identity(context: ssl.SSLContext, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    """The stdlib loads a certificate only from a file: an anonymous in-memory one
    (memfd), so the issued key never touches a disk."""
    pem = cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.memfd_create("kafka-admission-identity", os.MFD_CLOEXEC)
    try:
        os.write(fd, pem)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


class IdentityIssuer:
    """Issues, caches and renews the certificates of client identities; one per identity
    CA (a rotated CA gets a new issuer: new connections, new certificates)."""

    def __init__(
        self,
        settings: ClientIdentity,
        upstream: UpstreamTls,
        metrics: Metrics,
        *,
        capacity: int | None = None,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.settings = settings
        self._upstream = upstream
        self._metrics = metrics
        self._capacity = capacity if capacity is not None else settings.cache_size
        self._clock = clock
        self._ca_cert, self._ca_key, digest = _load_ca(settings)
        upstream_trust(upstream)  # fails now, not at the first client, when the broker CA cannot load
        # A reload keeps this issuer (and its cache) only while none of its files changed:
        # the broker CA too, which every cached context trusts.
        brokers_ca = Path(upstream.ca_file).read_bytes() if upstream.ca_file is not None else b""
        self.fingerprint = (digest, hashlib.sha256(brokers_ca).digest(), settings, upstream)
        self._cache: OrderedDict[bytes, _Issued] = OrderedDict()
        self._minting: dict[bytes, trio.Event] = {}
        self._turns = trio.CapacityLimiter(MINTS_AT_ONCE)

    @property
    def without_certificate(self) -> str:
        return self.settings.without_certificate

    def __len__(self) -> int:
        return len(self._cache)

    def issued(self, der: bytes) -> x509.Certificate | None:
        """The certificate cached for this client's subject (tests, diagnostics)."""
        issued = self._cache.get(_subject_key(x509.load_der_x509_certificate(der)))
        return None if issued is None else issued.certificate

    async def context_for(self, der: bytes) -> ssl.SSLContext:
        """The TLS context that presents this client's identity to brokers: cached, or
        issued now (off the event loop); raises IdentityRefused when it cannot be issued."""
        client = x509.load_der_x509_certificate(der)
        key = _subject_key(client)
        while True:
            issued = self._cache.get(key)
            if issued is not None and self._clock() < issued.renew_at:
                self._cache.move_to_end(key)
                return issued.context
            pending = self._minting.get(key)
            if pending is None:
                break
            await pending.wait()  # the same subject is being issued: take that one
        done = self._minting[key] = trio.Event()
        try:
            issued = await trio.to_thread.run_sync(self._issue, client, limiter=self._turns)
        except Exception as exc:
            self._metrics.upstream_identity_mint_failures.inc()
            raise IdentityRefused(f"the identity CA could not issue a certificate: {exc!r}") from None
        finally:
            del self._minting[key]
            done.set()
        self._metrics.upstream_identities_minted.inc()
        self._cache[key] = issued
        self._cache.move_to_end(key)
        while len(self._cache) > self._capacity:
            self._cache.popitem(last=False)
        self._metrics.upstream_identity_cache_size.set(len(self._cache))
        return issued.context

    def _issue(self, client: x509.Certificate) -> _Issued:
        """A worker thread: a new key pair and a certificate for ``client``'s subject."""
        now = self._clock()
        # Never outlives the client's own certificate.
        not_after = min(now + dt.timedelta(seconds=self.settings.validity), client.not_valid_after_utc)
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(client.subject)  # the whole DN, its RDNs in order, as the client's
            .issuer_name(self._ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()),
                critical=False,
            )
        )
        try:
            san = client.extensions.get_extension_for_class(x509.SubjectAlternativeName)
            builder = builder.add_extension(san.value, critical=san.critical)
        except x509.ExtensionNotFound:
            pass
        cert = builder.sign(self._ca_key, _signature_hash(self._ca_key))
        context = upstream_trust(self._upstream)
        _load_identity(context, cert, key)
        return _Issued(context, cert, not_after, now + (not_after - now) * RENEW_AT)


def _subject_key(client: x509.Certificate) -> bytes:
    """What the issued certificate carries: the subject DN and the SANs (DER)."""
    try:
        san = client.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.public_bytes()
    except x509.ExtensionNotFound:
        san = b""
    return client.subject.public_bytes() + b"\0" + san
