"""What a TLS handshake flood costs the clients already connected, and what
``max.ssl.handshakes.per.turn`` buys back.

A fresh proxy (the ``run`` CLI, one TLS listener, no connection caps) runs in
front of an embedded Tansu broker for each setting of the limit. One normal
client holds an established TLS connection and does ApiVersions round trips
one after the other, for ``--seconds`` with no flood, then for ``--seconds``
while a flood process keeps ``--flooders`` connections handshaking in a loop.

The flood is the cheap kind an attacker would send: each connection writes one
ClientHello (recorded once from Python's ssl module), reads the server's first
flight (ServerHello to Finished: the server's key exchange and signature are
done by then) and closes. The client pays no crypto; the proxy pays a
handshake each time, on its event loop.

Reported per setting: the normal client's round trips, p50 / p99 / max
latency, and the flood's answered handshakes per second. The client, the flood,
the proxy and the broker share this machine's CPUs (the load average is
printed).

``--flood HOST:PORT --flooders N --seconds S`` runs only the flood and prints
one JSON line (tests/integration/test_client_resources.py runs it so).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import HOST, BenchError, Certs, KafkaSocket, Service, api_versions_frame, load_average

from demo.tansu import TansuBroker, free_port

ROOT = Path(__file__).resolve().parent.parent
NO_LIMIT = 2147483647  # the key's maximum: as good as no limit
UNSET = 0  # --limits 0: the key left out of the config (how to run this against a checkout without it)


# --- the flood process ---------------------------------------------------------------------------


def client_hello() -> bytes:
    """One ClientHello as Python's ssl module writes it (TLS 1.2-1.3, ECDHE key share)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=HOST)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


async def flood(address: str, flooders: int, seconds: float) -> dict[str, Any]:
    host, port = address.rsplit(":", 1)
    hello = client_hello()
    answered = failed = 0
    deadline = time.monotonic() + seconds

    async def one() -> None:
        nonlocal answered, failed
        while time.monotonic() < deadline:
            writer = None
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 5)
                writer.write(hello)
                if await asyncio.wait_for(reader.read(1), 15):
                    answered += 1
                else:
                    failed += 1
            except (OSError, TimeoutError):
                failed += 1
            finally:
                if writer is not None:
                    writer.transport.abort()

    started = time.monotonic()
    await asyncio.gather(*(one() for _ in range(flooders)))
    took = time.monotonic() - started
    return {"answered": answered, "failed": failed, "seconds": round(took, 2), "per_second": round(answered / took)}


def bursts(address: str, size: int, seconds: float) -> dict[str, Any]:
    """Bursts of ``size`` ClientHellos at once: open ``size`` connections, then write the
    ClientHello on each in one pass, read each server's first byte, close them all; again
    until ``seconds`` are over. The proxy finds them all ready at the same moment."""
    import socket

    host, port = address.rsplit(":", 1)
    hello = client_hello()
    answered = failed = rounds = 0
    deadline = time.monotonic() + seconds
    started = time.monotonic()
    while time.monotonic() < deadline:
        socks = []
        try:
            for _ in range(size):
                socks.append(socket.create_connection((host, int(port)), timeout=15))
            for sock in socks:
                sock.sendall(hello)
            for sock in socks:
                try:
                    if sock.recv(1):
                        answered += 1
                    else:
                        failed += 1
                except OSError:
                    failed += 1
        finally:
            for sock in socks:
                sock.close()
        rounds += 1
    took = time.monotonic() - started
    return {"answered": answered, "failed": failed, "rounds": rounds, "per_second": round(answered / took)}


def make_certs(directory: Path, key_type: str) -> Certs:
    """A test CA (trustme) and a server certificate for 127.0.0.1, with RSA 2048 or ECDSA P-256
    keys (a handshake's signature: ~0.7 ms with RSA 2048 here, ~0.06 ms with P-256)."""
    import trustme

    ca = trustme.CA(key_type=trustme.KeyType[key_type.upper()])
    server = ca.issue_cert(HOST, "localhost", key_type=trustme.KeyType[key_type.upper()])
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    server.cert_chain_pems[0].write_to_path(str(directory / "server.pem"))
    server.private_key_pem.write_to_path(str(directory / "server.key"))
    return Certs(str(directory / "ca.pem"), str(directory / "server.pem"), str(directory / "server.key"))


# --- the measurement -------------------------------------------------------------------------------


class Proxy:
    """The proxy's ``run`` CLI with one TLS listener and the handshake limit given."""

    def __init__(self, workdir: Path, upstream: str, certs: Certs, limit: int) -> None:
        self.address = f"{HOST}:{free_port()}"
        admin = f"{HOST}:{free_port()}"
        listener = {
            "name": "bench",
            "bind": self.address,
            "tls": {"cert_file": certs.cert_file, "key_file": certs.key_file},
        }
        config: dict[str, Any] = {
            "mode": "cluster",
            "upstream": {"bootstrap_servers": [upstream]},
            "listeners": [listener],
            "admin": {"bind": admin},
        }
        if limit != UNSET:
            config["policies"] = {"max.ssl.handshakes.per.turn": limit}
        config_path = workdir / f"proxy-{limit}.yaml"
        config_path.write_text(json.dumps(config))  # JSON is YAML
        self.service = Service(
            "the proxy",
            [sys.executable, "-m", "proxy.cli", "run", "--config", str(config_path), "--drain-timeout", "1"],
            workdir / f"proxy-{limit}.log",
            cwd=ROOT,
        )
        try:
            self.service.wait_for_port(int(admin.rsplit(":", 1)[1]))
        except BenchError:
            self.service.stop()
            raise

    def stop(self) -> None:
        self.service.stop(timeout=15)


def round_trips(address: str, certs: Certs, seconds: float) -> list[float]:
    """ApiVersions round trip times (ms) on one established TLS connection, for ``seconds``."""
    host, port = address.rsplit(":", 1)
    frame = api_versions_frame()
    conn = KafkaSocket((host, int(port)), ca_file=certs.ca_file, timeout=30)
    try:
        conn.round_trip(frame)  # the handshake is not what is measured
        times = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.perf_counter()
            conn.round_trip(frame)
            times.append((time.perf_counter() - started) * 1000)
        return times
    finally:
        conn.close()


def flood_process(address: str, flooders: int, seconds: float, burst: bool) -> Any:
    import subprocess

    return subprocess.Popen(
        [sys.executable, __file__, "--flood", address, "--flooders", str(flooders), "--seconds", str(seconds)]
        + (["--burst"] if burst else []),
        stdout=subprocess.PIPE,
        text=True,
    )


def summary(times: list[float]) -> str:
    q = statistics.quantiles(times, n=100)
    return f"{len(times):6,} round trips, p50 {q[49]:7.2f} ms, p99 {q[98]:7.2f} ms, max {max(times):7.1f} ms"


def measure(workdir: Path, upstream: str, certs: Certs, limit: int, args: argparse.Namespace) -> None:
    proxy = Proxy(workdir, upstream, certs, limit)
    try:
        quiet = round_trips(proxy.address, certs, args.seconds)
        flooding = [
            flood_process(proxy.address, args.flooders, args.seconds + 1, args.burst) for _ in range(args.processes)
        ]
        time.sleep(0.5)  # the flood under way
        during = round_trips(proxy.address, certs, args.seconds)
        results = [json.loads(p.communicate(timeout=60)[0]) for p in flooding]
        result = {k: sum(r[k] for r in results) for k in ("per_second", "failed")}
        name = {NO_LIMIT: "no limit", UNSET: "unset"}.get(limit, f"limit {limit}")
        print(f"{name:9} quiet:  {summary(quiet)}", flush=True)
        print(
            f"{name:9} flood:  {summary(during)}; {result['per_second']:,} handshakes/s answered "
            f"({result['failed']:,} not), load {load_average()}",
            flush=True,
        )
    finally:
        proxy.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--limits",
        type=int,
        nargs="+",
        default=[NO_LIMIT, 64, 16],
        help="max.ssl.handshakes.per.turn (0: leave it out)",
    )
    parser.add_argument("--flooders", type=int, default=256, help="connections handshaking at once, per process")
    parser.add_argument("--processes", type=int, default=2, help="flood processes")
    parser.add_argument("--seconds", type=float, default=5.0, help="of round trips, quiet and flooded")
    parser.add_argument("--key-type", choices=("rsa", "ecdsa"), default="rsa", help="of the server certificate")
    parser.add_argument("--burst", action="store_true", help="flood in bursts of --flooders ClientHellos at once")
    parser.add_argument("--flood", help="only flood this address; print one JSON line")
    args = parser.parse_args(argv)
    if args.flood:
        if args.burst:
            result = bursts(args.flood, args.flooders, args.seconds)
        else:
            result = asyncio.run(flood(args.flood, args.flooders, args.seconds))
        print(json.dumps(result), flush=True)
        return 0
    print(
        f"{os.cpu_count()} CPUs, load average {load_average()}; {args.processes} x {args.flooders} flooders"
        f"{' in bursts' if args.burst else ''}, {args.key_type} key",
        flush=True,
    )
    try:
        with tempfile.TemporaryDirectory(prefix="handshake-flood-") as tmp, TansuBroker() as broker:
            workdir = Path(tmp)
            certs = make_certs(workdir, args.key_type)
            for limit in args.limits:
                measure(workdir, broker.bootstrap, certs, limit, args)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
