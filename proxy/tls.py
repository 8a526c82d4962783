"""TLS contexts: termination toward clients (optional mTLS) and verified TLS
toward brokers. A reload gives a listener a new context, so new handshakes
present a renewed certificate (and trust only the CAs its files name now) while
the connections already open keep theirs."""

from __future__ import annotations

import ssl

from .config import ListenerTls, UpstreamTls

_CLIENT_AUTH = {
    "none": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


def server_context(settings: ListenerTls) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(settings.cert_file, settings.key_file)
    if settings.ca_file is not None:
        ctx.load_verify_locations(settings.ca_file)
    ctx.verify_mode = _CLIENT_AUTH[settings.client_auth]
    return ctx


class TlsTermination:
    """A listener's TLS toward clients: the context of its next handshake. A reload
    replaces ``context`` (never loads into it: an SSLContext only adds, so it would go on
    presenting the old certificate beside a renewed one of another key type, and go on
    trusting a client CA taken out of ``ca_file``)."""

    def __init__(self, settings: ListenerTls) -> None:
        self.context = server_context(settings)


def upstream_context(settings: UpstreamTls) -> ssl.SSLContext | None:
    if not settings.enabled:
        return None
    ctx = ssl.create_default_context(cafile=settings.ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if settings.cert_file is not None and settings.key_file is not None:
        ctx.load_cert_chain(settings.cert_file, settings.key_file)
    return ctx
