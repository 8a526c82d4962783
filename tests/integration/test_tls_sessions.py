"""TLS listeners issue no session tickets and resume no sessions (proxy/links/tls.py says why): a
client that kept the session of its first connection makes a full handshake on its second."""

from __future__ import annotations

import ssl
from typing import Any

import pytest

from demo.tansu import TansuBroker
from tests.raw_kafka import api_versions_over_tls


def connect_twice(address: str, ca_file: str, version: ssl.TLSVersion) -> list[tuple[bool, bool]]:
    """(the session has a ticket, the session was resumed) for two connections, the second
    offering the first one's session; each reads an answer, so any ticket has arrived."""
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.minimum_version = ctx.maximum_version = version
    session, seen = None, []
    for _ in range(2):
        correlation_id, session, reused = api_versions_over_tls(address, ctx, 7, session)
        assert correlation_id == 7
        assert session is not None
        seen.append((session.has_ticket, reused))
    return seen


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2], ids=["tls1.3", "tls1.2"])
def test_a_tls_listener_issues_no_session_ticket_and_resumes_no_session(
    version: ssl.TLSVersion, tansu: TansuBroker, start_proxy: Any, certs: Any
) -> None:
    tls = {"cert_file": certs.server_cert, "key_file": certs.server_key}
    proxy = start_proxy(tansu.bootstrap, listeners=[{"name": "tls", "tls": tls}])
    # Before: [(True, False), (True, True)] for both versions (tickets, and the second connection resumed).
    assert connect_twice(proxy.bootstrap, certs.ca_file, version) == [(False, False), (False, False)]
    assert proxy.metric("kafka_admission_requests_total") == 2
