"""What an identity-preserving upstream connection adds to connection setup
(upstream.tls.client_identity), against a plain TLS one with the proxy's own certificate.

In one process: a TLS "broker" (trio, the stdlib's ssl, requiring a client certificate
from the identity CA) and the proxy's own ``UpstreamConnector``. Timed: ``connect`` to
that broker (TCP, the TLS handshake, the client certificate verified) with

- ``plain``: the proxy's own certificate (its context, made once);
- ``mint``: a subject seen for the first time (a key pair, a certificate signed by the
  identity CA in a worker thread, a new SSLContext, then the handshake);
- ``cached``: a subject seen before (its cached context).

Reported: p50 / p99 / max per kind, and the added p50 against ``plain``. The target
(issue 31): a cached identity adds at most 1 ms at p50.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio
import trustme

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cryptography.hazmat.primitives.serialization import Encoding

from proxy.config.model import ClientIdentity, UpstreamTls
from proxy.evidence.metrics import Metrics
from proxy.links.identity import ClientCertificate
from proxy.links.tls import upstream_context
from proxy.links.upstream import UpstreamConnector
from tests.identity_certs import client_certificate, identity_ca, person, write_ca


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def broker(context: ssl.SSLContext, listeners: list[trio.SocketListener]) -> None:
    async def serve(stream: trio.SocketStream) -> None:
        tls = trio.SSLStream(stream, context, server_side=True)
        try:
            await tls.do_handshake()
            await tls.receive_some(1)  # until the proxy closes
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    await trio.serve_listeners(serve, listeners)


async def main(rounds: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="identity-bench-"))
    server_ca = trustme.CA()
    server_ca.cert_pem.write_to_path(str(work / "server-ca.pem"))
    id_ca = identity_ca()
    ca_cert, ca_key = write_ca(work, *id_ca)
    own_cert, own_key = client_certificate(id_ca, person("kafka-admission-proxy", "proxies"))
    write_ca(work, own_cert, own_key, "own")  # the same writer: cert and 0600 key
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca_cert)
    server_ca.issue_cert("127.0.0.1").configure_cert(server)
    server.verify_mode = ssl.CERT_REQUIRED
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    tls = UpstreamTls(
        enabled=True,
        ca_file=str(work / "server-ca.pem"),
        cert_file=str(work / "own.pem"),
        key_file=str(work / "own.key"),
        client_identity=ClientIdentity(ca_cert_file=ca_cert, ca_key_file=ca_key, validity=3600),
    )
    metrics = Metrics()
    connector = UpstreamConnector(tls, upstream_context(tls), metrics, recorder=None)  # type: ignore[arg-type]
    client_ca = identity_ca("client CA")
    subjects = [
        ClientCertificate(client_certificate(client_ca, person(f"user-{i}"))[0].public_bytes(Encoding.DER))
        for i in range(rounds)
    ]
    timings: dict[str, list[float]] = {"plain": [], "mint": [], "cached": []}

    async def timed(kind: str, client: ClientCertificate | None) -> None:
        start = time.perf_counter()
        link = await connector.connect("127.0.0.1", port, client=client)
        timings[kind].append((time.perf_counter() - start) * 1000)
        await link.transport.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(broker, server, listeners)
        for subject in subjects[:10]:  # warm up every path
            await timed("mint", subject)
            await timed("cached", subject)
            await timed("plain", None)
        for values in timings.values():
            values.clear()
        for subject in subjects[10:]:  # interleaved, so the machine's load falls on each alike
            await timed("plain", None)
            await timed("mint", subject)
            await timed("cached", subject)
        nursery.cancel_scope.cancel()
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {rounds - 10} rounds, load average {os.getloadavg()[0]:.1f}")
    print("| connection | p50 ms | p99 ms | max ms | p50 added to plain ms |")
    print("|---|---:|---:|---:|---:|")
    base = statistics.median(timings["plain"])
    for kind, values in timings.items():
        p50 = statistics.median(values)
        print(f"| {kind} | {p50:.2f} | {percentile(values, 0.99):.2f} | {max(values):.2f} | {p50 - base:+.2f} |")
    print(f"minted: {metrics.upstream_identities_minted._value.get():.0f}")  # type: ignore[attr-defined]
    # The added work itself, without the handshakes' noise: a cached lookup, and a mint.
    issuer = connector.identity
    assert issuer is not None
    known = subjects[-1].der
    assert known is not None
    start = time.perf_counter()
    for _ in range(10_000):
        await issuer.context_for(known)
    lookup_us = (time.perf_counter() - start) / 10_000 * 1e6
    fresh = [client_certificate(client_ca, person(f"fresh-{i}"))[0].public_bytes(Encoding.DER) for i in range(100)]
    start = time.perf_counter()
    for der in fresh:
        await issuer.context_for(der)
    mint_ms = (time.perf_counter() - start) / len(fresh) * 1000
    print(
        f"cached lookup (context_for: parse, LRU): {lookup_us:.1f} us; mint (key, signature, context): {mint_ms:.2f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=310)
    trio.run(main, parser.parse_args().rounds)
