"""TLS contexts: termination toward clients (optional mTLS) and verified TLS
toward brokers. TLS 1.2 or newer only, and on TLS 1.2 only forward-secret AEAD
cipher suites (ECDHE with AES-GCM or ChaCha20-Poly1305); TLS 1.3's suites are
all of that kind. Key passwords come from a file or an environment variable,
never from the config file, and are read here only, when a context is built.
A reload gives a listener a new context, so new handshakes present a renewed
certificate (and trust only the CAs its files name now) while the connections
already open keep theirs.

Listeners issue no session tickets and resume no sessions. OpenSSL's ticket key
is made with the context and never rotated (the stdlib has no hook to rotate it),
so whoever reads it from memory could decrypt every recorded TLS 1.2 session
that had a ticket. What resumption would save is small: a Kafka client holds its
connections for hours, a flood of handshakes never resumes, and a resumed TLS 1.3
handshake still does its ECDHE (bench/RESULTS.md has the figures)."""

from __future__ import annotations

import ssl

from proxy.config.key_password import KeyPasswordError, read_key_password
from proxy.config.model import Config, ListenerTls, UpstreamTls
from proxy.errors import TlsMaterialError

_CLIENT_AUTH = {
    "none": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}
# Mozilla's "intermediate" TLS 1.2 suites: forward secrecy and AEAD, no CBC, no RSA key exchange.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL"


def _load_cert_chain(ctx: ssl.SSLContext, cert_file: str, key_file: str, settings: ListenerTls | UpstreamTls) -> None:
    try:
        password, source = read_key_password(settings.key_password_file, settings.key_password_env)
    except KeyPasswordError as exc:
        raise TlsMaterialError(str(exc)) from None

    def no_password() -> bytes:
        # Without this OpenSSL would prompt on the terminal for an encrypted key.
        raise TlsMaterialError(f"key_file {key_file} is encrypted: set key_password_file or key_password_env")

    try:
        ctx.load_cert_chain(cert_file, key_file, password=password if password is not None else no_password)
    except ssl.SSLError as exc:
        with_password = f" with the password from {source} (wrong password?)" if password is not None else ""
        raise TlsMaterialError(
            f"cannot load cert_file {cert_file} and key_file {key_file}{with_password}: {exc.reason or exc}"
        ) from None
    except OSError as exc:
        raise TlsMaterialError(f"cannot read cert_file {cert_file} or key_file {key_file}: {exc.strerror}") from None


def _modern(ctx: ssl.SSLContext) -> None:
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(TLS12_CIPHERS)
    ctx.options |= ssl.OP_NO_RENEGOTIATION  # a client-initiated renegotiation costs the server a handshake


def _trusted_cas(ca_file: str | None, purpose: ssl.Purpose) -> ssl.SSLContext:
    """A context trusting ``ca_file`` (or, without one, the system's CAs)."""
    try:
        return ssl.create_default_context(purpose, cafile=ca_file)
    except (ssl.SSLError, OSError) as exc:
        raise TlsMaterialError(f"cannot load ca_file {ca_file}: {getattr(exc, 'reason', None) or exc}") from None


def server_context(settings: ListenerTls) -> ssl.SSLContext:
    if settings.ca_file is not None:
        ctx = _trusted_cas(settings.ca_file, ssl.Purpose.CLIENT_AUTH)
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _modern(ctx)
    _load_cert_chain(ctx, settings.cert_file, settings.key_file, settings)
    ctx.verify_mode = _CLIENT_AUTH[settings.client_auth]
    ctx.options |= ssl.OP_NO_TICKET  # TLS 1.2: no ticket (and no session id: nothing resumes)
    ctx.num_tickets = 0  # TLS 1.3: no ticket after the handshake
    return ctx


class TlsTermination:
    """A listener's TLS toward clients: the context of its next handshake. A reload
    replaces ``context`` (never loads into it: an SSLContext only adds, so it would go on
    presenting the old certificate beside a renewed one of another key type, and go on
    trusting a client CA taken out of ``ca_file``)."""

    def __init__(self, settings: ListenerTls) -> None:
        self.context = server_context(settings)


def upstream_trust(settings: UpstreamTls) -> ssl.SSLContext:
    """Toward brokers, verifying them, with no client certificate yet (an identity
    issued for a client is loaded into one of these)."""
    ctx = _trusted_cas(settings.ca_file, ssl.Purpose.SERVER_AUTH)
    _modern(ctx)
    return ctx


def upstream_context(settings: UpstreamTls) -> ssl.SSLContext | None:
    if not settings.enabled:
        return None
    ctx = upstream_trust(settings)
    if settings.cert_file is not None and settings.key_file is not None:
        _load_cert_chain(ctx, settings.cert_file, settings.key_file, settings)
    return ctx


def material_problems(config: Config) -> list[str]:
    """Build every TLS context the config asks for; one line per one that cannot be built."""
    problems = []
    for i, listener in enumerate(config.listeners):
        if listener.termination is not None:
            try:
                server_context(listener.termination)
            except TlsMaterialError as exc:
                problems.append(f"listeners[{i}].tls: {exc}")
    try:
        upstream_context(config.upstream.tls)
    except TlsMaterialError as exc:
        problems.append(f"upstream.tls: {exc}")
    return problems
