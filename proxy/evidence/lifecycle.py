"""A connection's open and close as evidence, in one shape for every kind of connection
(terminating or ``tls: passthrough``): the observation window's connection counts and, when
the audit keeps evidence (files or a topic), one ``connection`` event each. With ``workers: N``
the owner of the connection limits writes each ``open`` (proxy/workers/owner_connections.py):
its counts are the owner's, known there when it counts the connection, and a worker admits
most connections from slots without asking (docs/workers.md)."""

from __future__ import annotations

from collections.abc import Mapping

from policies.close_cause import CloseCause, Closing
from policies.connections import OpenCounts
from proxy.evidence.audit import AuditSink
from proxy.evidence.observation_window import ObservationWindow

_CLIENT_CLOSED = Closing(CloseCause.CLIENT_CLOSED)


def record_lifecycle(
    audit: AuditSink,
    window: ObservationWindow | None,
    event: str,
    *,
    conn_id: str,
    listener: str,
    peer: str,
    tls: bool,
    counts: OpenCounts | None,
    closed: Mapping[str, object],
    closing: Closing | None = None,
    passthrough: bool = False,
    ts: float | None = None,
) -> None:
    """``event`` is "open" or "close"; ``closed`` holds the close event's own fields, and
    ``closing`` why it closed (its ``reason``: the label the metrics count it under; None:
    the client closed). ``ts``: when it happened, if not now (an open the owner writes after
    the worker admitted it from a slot)."""
    if window is not None:
        if event == "open":
            window.on_connection_open(listener, tls)
        else:
            window.on_connection_close(listener, tls)
    if not audit.keeps_evidence or (event == "open" and audit.proxy is not None):
        return  # a worker's sink (it names its proxy): the owner writes the opens
    record: dict[str, object] = {
        "type": "connection",
        "event": event,
        "conn_id": conn_id,
        "listener": listener,
        "client_address": peer,
        "tls": tls,
    }
    if passthrough:
        record["passthrough"] = True
    if ts is not None:
        record["ts"] = ts
    if event == "open" and counts is not None:
        # the counts the connection limits compared at its admission (the report's connection impact)
        record.update(open_connections=counts.broker, open_ssl_connections=counts.ssl, open_ip_connections=counts.ip)
        if counts.node_id is not None:
            record["node_id"] = counts.node_id  # cluster mode: the broker whose limits counted it
    if event == "close":
        record["reason"] = (closing or _CLIENT_CLOSED).label
        record.update(closed)
    audit.record(record)
