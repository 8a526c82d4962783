"""TLS contexts: termination toward clients (optional mTLS) and verified TLS
toward brokers. A listener's context is kept for the life of the proxy and
reloaded in place, so new handshakes present a renewed certificate while the
connections already open keep theirs."""

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
    load_server_settings(ctx, settings)
    return ctx


def load_server_settings(ctx: ssl.SSLContext, settings: ListenerTls) -> None:
    """(Re)load certificate, key, CA and client authentication into ``ctx``: takes
    effect for the next handshake."""
    ctx.load_cert_chain(settings.cert_file, settings.key_file)
    if settings.ca_file is not None:
        ctx.load_verify_locations(settings.ca_file)
    ctx.verify_mode = _CLIENT_AUTH[settings.client_auth]


def upstream_context(settings: UpstreamTls) -> ssl.SSLContext | None:
    if not settings.enabled:
        return None
    ctx = ssl.create_default_context(cafile=settings.ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if settings.cert_file is not None and settings.key_file is not None:
        ctx.load_cert_chain(settings.cert_file, settings.key_file)
    return ctx
