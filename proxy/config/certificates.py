"""Inspect TLS certificate files at load and at reload, before a handshake needs them.

The checks an operator otherwise meets as a failed handshake: the private key
matches the certificate (OpenSSL's own ``SSL_CTX_check_private_key``, through
pyOpenSSL), the chain in ``cert_file`` runs leaf first and each certificate is
issued by the next, and no certificate is not yet valid or expired. Each
problem is one line naming the config key, the file and the rule. The leaf's
expiry is exported as ``kafka_admission_tls_certificate_expiry_timestamp_seconds``. The
identity CA (upstream.tls.client_identity) must also be a CA: basicConstraints CA:TRUE.
A private key or key password file that others can read is a warning, not an
error (as OpenSSH refuses such a key, but a running proxy must not stop for it).
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from OpenSSL import SSL
from prometheus_client import Gauge

from proxy.config.key_password import KeyPasswordError, read_key_password

__all__ = [
    "CertificateInfo",
    "CertificateProblem",
    "TlsFiles",
    "certificate_files",
    "certificate_problems",
    "export_certificate_expiry",
    "inspect_ca_file",
    "inspect_certificate",
    "inspect_issuing_ca",
    "secret_file_warnings",
]

log = logging.getLogger("kafka_admission_proxy.tls")


# The metric label of the client certificate presented to brokers (upstream.tls.cert_file).
UPSTREAM_CERTIFICATE = "upstream"
# The metric label of the identity CA (upstream.tls.client_identity.ca_cert_file).
IDENTITY_CA_CERTIFICATE = "upstream_identity_ca"


class CertificateProblem(ValueError):
    """A certificate file that cannot serve; the message names the file and the rule,
    ``field`` the config key it is about (``cert_file``, ``key_file``)."""

    def __init__(self, message: str, field: str = "cert_file") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class CertificateInfo:
    path: str
    subject: str
    not_before: dt.datetime
    not_after: dt.datetime


def _now(now: dt.datetime | None) -> dt.datetime:
    return now if now is not None else dt.datetime.now(dt.UTC)


def _stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _info(path: str, cert: x509.Certificate) -> CertificateInfo:
    return CertificateInfo(path, cert.subject.rfc4514_string(), cert.not_valid_before_utc, cert.not_valid_after_utc)


def _load_pem_certificates(path: str, what: str) -> list[x509.Certificate]:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CertificateProblem(f"{path}: cannot read {what}: {exc.strerror}") from None
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CertificateProblem(f"{path}: no PEM certificate in it ({what})") from None
    return certs


def _check_validity(path: str, index: int, cert: x509.Certificate, now: dt.datetime) -> None:
    name = cert.subject.rfc4514_string() or "(empty subject)"
    where = "certificate" if index == 0 else f"certificate {index + 1} in the chain"
    if now < cert.not_valid_before_utc:
        raise CertificateProblem(f"{path}: {where} ({name}) is not valid before {_stamp(cert.not_valid_before_utc)}")
    if now > cert.not_valid_after_utc:
        raise CertificateProblem(f"{path}: {where} ({name}) expired on {_stamp(cert.not_valid_after_utc)}")


def _check_chain_order(path: str, chain: list[x509.Certificate]) -> None:
    """Leaf first, then each issuer: what TLS sends and what peers expect."""
    for index, (child, issuer) in enumerate(itertools.pairwise(chain)):
        try:
            child.verify_directly_issued_by(issuer)
        except (ValueError, TypeError, InvalidSignature):
            raise CertificateProblem(
                f"{path}: chain out of order: certificate {index + 2} ({issuer.subject.rfc4514_string()}) "
                f"did not issue certificate {index + 1} ({child.subject.rfc4514_string()}); "
                "put the leaf first, then each issuer"
            ) from None


def _check_key_matches(cert_file: str, key_file: str, password: bytes | None, source: str) -> None:
    context = SSL.Context(SSL.TLS_METHOD)
    try:
        context.use_certificate_chain_file(cert_file)
    except SSL.Error:
        raise CertificateProblem(f"{cert_file}: OpenSSL cannot load it as a certificate chain") from None
    try:
        key = serialization.load_pem_private_key(Path(key_file).read_bytes(), password)
    except TypeError:  # encrypted and no password, or a password for a key that has none
        if password is None:
            message = f"{key_file}: private key is encrypted: set key_password_file or key_password_env"
        else:
            message = f"{key_file}: private key is not encrypted, but a password is set ({source})"
        raise CertificateProblem(message, "key_file") from None
    except (ValueError, OSError):
        with_password = f" with the password from {source} (wrong password?)" if password is not None else ""
        raise CertificateProblem(f"{key_file}: private key cannot be opened{with_password}", "key_file") from None
    try:
        context.use_privatekey(key)  # type: ignore[arg-type]
        context.check_privatekey()
    except SSL.Error:
        raise CertificateProblem(
            f"{key_file}: private key does not match the certificate in {cert_file}", "key_file"
        ) from None


def inspect_certificate(
    cert_file: str,
    key_file: str | None,
    *,
    now: dt.datetime | None = None,
    password: bytes | None = None,
    password_source: str = "",
) -> CertificateInfo:
    """The leaf of ``cert_file``, after checking its chain, its dates and its key (opened with
    ``password`` when it is encrypted)."""
    chain = _load_pem_certificates(cert_file, "certificate chain")
    moment = _now(now)
    for index, cert in enumerate(chain):
        _check_validity(cert_file, index, cert, moment)
    _check_chain_order(cert_file, chain)
    if key_file is not None:
        _check_key_matches(cert_file, key_file, password, password_source)
    return _info(cert_file, chain[0])


def inspect_ca_file(ca_file: str, *, now: dt.datetime | None = None) -> list[CertificateInfo]:
    """A CA bundle may hold retired certificates; at least one must be valid now."""
    certs = _load_pem_certificates(ca_file, "CA bundle")
    moment = _now(now)
    infos = [_info(ca_file, c) for c in certs]
    if not any(i.not_before <= moment <= i.not_after for i in infos):
        ends = ", ".join(f"{i.subject} until {_stamp(i.not_after)}" for i in infos)
        raise CertificateProblem(f"{ca_file}: no CA certificate in it is valid now ({ends})")
    return infos


@dataclass(frozen=True)
class TlsFiles:
    """The TLS files of one config section (a listener's, or the upstream client's)."""

    key: str  # the config key of the section, e.g. listeners[0].tls
    label: str  # the metric label: the listener name, or 'upstream'
    cert_file: str | None
    key_file: str | None
    ca_file: str | None
    key_password_file: str | None = None
    key_password_env: str | None = None
    field_prefix: str = ""  # the section's keys are ca_cert_file, ca_key_file: 'ca_'
    issues_certificates: bool = False  # an identity CA: the proxy signs with its key

    def field(self, name: str) -> str:
        """The config key of one of its files (``cert_file`` -> ``...client_identity.ca_cert_file``)."""
        prefixed = self.field_prefix + name if name in ("cert_file", "key_file") else name
        return f"{self.key}.{prefixed}"


def inspect_issuing_ca(path: str) -> list[str]:
    """A certificate the proxy signs with must be a CA (basicConstraints CA:TRUE, and keyCertSign
    when keyUsage is there), or brokers refuse what it signs; raises CertificateProblem. Returns
    warnings: a CA that may sign further CAs (no pathLenConstraint 0) lets a stolen key do more."""
    cert = _load_pem_certificates(path, "CA certificate")[0]
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        raise CertificateProblem(f"{path}: not a CA certificate (no basicConstraints CA:TRUE)") from None
    if not constraints.ca:
        raise CertificateProblem(f"{path}: not a CA certificate (basicConstraints CA:FALSE)")
    try:
        usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        usage = None
    if usage is not None and not usage.key_cert_sign:
        raise CertificateProblem(f"{path}: its keyUsage does not allow signing certificates (keyCertSign)")
    if constraints.path_length != 0:
        return [
            f"{path}: the identity CA has no pathLenConstraint: 0, so its key could also sign other CAs; "
            "issue it with pathlen:0"
        ]
    return []


def certificate_files(sections: Iterable[TlsFiles]) -> list[str]:
    """Every certificate, key and CA file named: what a reload must watch."""
    paths = (path for f in sections for path in (f.cert_file, f.key_file, f.ca_file))
    return sorted({path for path in paths if path is not None})


def _readers_besides_the_proxy(path: str) -> tuple[str, int] | None:
    """(who else can read ``path``, its mode), or None. Its group is allowed when the proxy
    reads it through that group (Kubernetes' fsGroup with a Secret's ``defaultMode: 0440``)."""
    try:
        info = os.stat(path)
    except OSError:
        return None  # the load names an unreadable file
    mode = stat.S_IMODE(info.st_mode)
    if mode & stat.S_IROTH:
        return "every user", mode
    uid = os.geteuid()
    through_group = uid not in (0, info.st_uid) and info.st_gid in (os.getegid(), *os.getgroups())
    if mode & stat.S_IRGRP and not through_group:
        return f"group {info.st_gid}", mode
    return None


def secret_file_warnings(sections: Iterable[TlsFiles]) -> list[str]:
    """One line per private key or key password file that others than the proxy's user can read."""
    lines = []
    for files in sections:
        for field, path in (("key_file", files.key_file), ("key_password_file", files.key_password_file)):
            exposed = _readers_besides_the_proxy(path) if path is not None else None
            if exposed is not None:
                who, mode = exposed
                lines.append(
                    f"{files.field(field)}: {path} is readable by {who} (mode {mode:04o}): a private key or its "
                    "password should be readable by the proxy's user only (chmod 0600, or 0440 for a group "
                    "only the proxy is in)"
                )
    return lines


def certificate_problems(sections: Iterable[TlsFiles], *, now: dt.datetime | None = None) -> list[str]:
    """One line per unusable certificate, key or CA file, naming its config key. When every file
    serves, key files that others can read are logged as warnings (at start, in check-config and
    at each reload); a refused config gets only its errors."""
    sections = list(sections)
    problems = []
    warnings = []
    for files in sections:
        if files.cert_file is not None:
            try:
                password, source = read_key_password(files.key_password_file, files.key_password_env)
                inspect_certificate(files.cert_file, files.key_file, now=now, password=password, password_source=source)
                if files.issues_certificates:
                    warnings += [f"{files.field('cert_file')}: {w}" for w in inspect_issuing_ca(files.cert_file)]
            except CertificateProblem as exc:
                problems.append(f"{files.field(exc.field)}: {exc}")
            except KeyPasswordError as exc:
                problems.append(f"{files.key}: {exc}")
        if files.ca_file is not None:
            try:
                inspect_ca_file(files.ca_file, now=now)
            except CertificateProblem as exc:
                problems.append(f"{files.key}.ca_file: {exc}")
    if not problems:
        for line in [*warnings, *secret_file_warnings(sections)]:
            log.warning(line)
    return problems


def export_certificate_expiry(sections: Iterable[TlsFiles], gauge: Gauge) -> None:
    """Set ``{listener}`` to the notAfter of each certificate presented; drop stale labels."""
    gauge.clear()
    for files in sections:
        if files.cert_file is not None:
            try:
                leaf = _load_pem_certificates(files.cert_file, "certificate chain")[0]
            except CertificateProblem:
                continue  # unreadable now: the next load or reload names it
            gauge.labels(files.label).set(leaf.not_valid_after_utc.timestamp())
