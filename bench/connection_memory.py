"""Memory per idle client connection through the proxy, and how fast it admits connections.

For each protocol (plaintext, TLS) and each connection count (default 2,000
and 5,000) a fresh proxy (the ``run`` CLI, cluster mode, no connection caps)
is started in front of an embedded Tansu broker, and then:

1. warm-up: a few connections each exchange one ApiVersions with the broker
   through the proxy and close (so code paths, codecs and TLS contexts are
   loaded before the baseline); the proxy's RSS is read (``VmRSS``);
2. a client process (asyncio, separate from this one and from the proxy) opens
   N connections as fast as it can, at most ``--concurrency`` of them being
   set up at a time; each completes one ApiVersions round trip with the broker
   (TLS: after its handshake) and then stays open and idle;
3. once all N are open and answered, and after ``--settle`` seconds, the
   proxy's RSS is read again; it must report N active connections.

Reported per run: RSS before and after, (after - before) / N as the memory
per idle connection (what the proxy holds for one client connection *and* its
upstream connection to the broker: two sockets, the tasks, buffers and, for
TLS, the OpenSSL session); the accept rate, N / the client's wall time from
its first connect to its last answer; and the proxy's CPU time per admitted
connection. The client, the proxy and the broker share this machine's CPUs,
so the accept rate is that of the whole setup, not of the proxy alone (the
proxy's share of a core while opening is printed next to it).

Only 127.0.0.1 is used. Each proxied connection takes two file descriptors in
the proxy (it raises its soft limit to the hard one) and one in the client
and in the broker: 5,000 connections need a hard ``ulimit -n`` above 10,000.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from harness import HOST, BenchError, Certs, Service, api_versions_frame, cpu_seconds, make_certs, rss_kib

from demo.tansu import TansuBroker, free_port

ROOT = Path(__file__).resolve().parent.parent
CLIENT_TIMEOUT_S = 120.0


# --- the client process ------------------------------------------------------------------------


async def _open_all(
    host: str, port: int, count: int, concurrency: int, frame: bytes, ca_file: str | None
) -> dict[str, Any]:
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    limit = asyncio.Semaphore(concurrency)
    writers: list[asyncio.StreamWriter] = []
    errors: list[str] = []
    expected_id = frame[8:12]  # request header: api key, version, correlation id

    async def open_one() -> None:
        async with limit:
            try:
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=context, server_hostname=host if context else None
                )
                writer.write(frame)
                size = int.from_bytes(await reader.readexactly(4), "big")
                body = await reader.readexactly(size)
                if body[:4] != expected_id or body[4:6] != b"\x00\x00":
                    raise ValueError(f"unexpected ApiVersions answer {body[:6].hex()}")
                writers.append(writer)
            except (OSError, asyncio.IncompleteReadError, ValueError, ssl.SSLError) as exc:
                errors.append(repr(exc))

    cpu = time.process_time()
    started = time.monotonic()
    await asyncio.gather(*(open_one() for _ in range(count)))
    seconds = time.monotonic() - started
    report = {
        "opened": len(writers),
        "failed": len(errors),
        "first_error": errors[0] if errors else None,
        "seconds": seconds,
        "client_cpu": time.process_time() - cpu,
    }
    print(json.dumps(report), flush=True)
    # Idle until told to go (a line or EOF on stdin), then close everything.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    for writer in writers:
        writer.close()
    return report


def client_main(args: argparse.Namespace) -> int:
    raise_fd_limit()
    host, port = args.client.rsplit(":", 1)
    asyncio.run(_open_all(host, int(port), args.count, args.concurrency, bytes.fromhex(args.frame), args.ca_file))
    return 0


# --- the measuring process ---------------------------------------------------------------------


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def active_connections(admin: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "kafka_admission_connections_active"
    )


class Proxy:
    """The proxy's ``run`` CLI with one listener (TLS with ``certs``) and no connection caps."""

    def __init__(self, workdir: Path, name: str, upstream: str, certs: Certs | None) -> None:
        self.address = f"{HOST}:{free_port()}"
        self.admin = f"{HOST}:{free_port()}"
        listener: dict[str, Any] = {"name": "bench", "bind": self.address}
        if certs is not None:
            listener["tls"] = {"cert_file": certs.cert_file, "key_file": certs.key_file}
        config = {
            "mode": "cluster",
            "upstream": {"bootstrap_servers": [upstream]},
            "listeners": [listener],
            "admin": {"bind": self.admin},
        }
        config_path = workdir / f"{name}.yaml"
        config_path.write_text(json.dumps(config))  # JSON is YAML
        self.service = Service(
            "the proxy",
            [sys.executable, "-m", "proxy.cli", "run", "--config", str(config_path), "--drain-timeout", "1"],
            workdir / f"{name}.log",
            cwd=ROOT,
        )
        try:
            self.service.wait_for_port(int(self.admin.rsplit(":", 1)[1]))
        except BenchError:
            self.service.stop()
            raise
        self.pid = self.service.pid
        self.log_tail = self.service.log_tail

    def stop(self) -> None:
        self.service.stop(timeout=15)


def warm_up(address: str, frame: bytes, certs: Certs | None, count: int) -> None:
    """``count`` connections, one after the other, each with one ApiVersions round trip."""
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=certs.ca_file) if certs else None
    for _ in range(count):
        sock = socket.create_connection((host, int(port)), timeout=10)
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname=host)
        with sock:
            sock.sendall(frame)
            data = b""
            while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
                chunk = sock.recv(65536)
                if not chunk:
                    raise BenchError(f"warm-up connection to {address} closed before its answer")
                data += chunk


@dataclass
class Row:
    protocol: str
    count: int
    rss_before_kib: int
    rss_after_kib: int
    fds_added: int
    seconds: float
    proxy_cpu: float
    client_cpu: float

    @property
    def per_connection_kib(self) -> float:
        return (self.rss_after_kib - self.rss_before_kib) / self.count

    @property
    def rate(self) -> float:
        return self.count / self.seconds


def measure(
    workdir: Path, upstream: str, protocol: str, count: int, certs: Certs | None, args: argparse.Namespace
) -> Row:
    frame = api_versions_frame()
    proxy = Proxy(workdir, f"proxy-{protocol}-{count}", upstream, certs)
    client: subprocess.Popen[str] | None = None
    try:
        warm_up(proxy.address, frame, certs, args.warmup)
        time.sleep(args.settle)
        rss_before, fds_before, cpu_before = rss_kib(proxy.pid), open_fds(proxy.pid), cpu_seconds(proxy.pid)
        argv = [
            sys.executable,
            __file__,
            "--client",
            proxy.address,
            "--count",
            str(count),
            "--concurrency",
            str(args.concurrency),
            "--frame",
            frame.hex(),
        ]
        if certs is not None:
            argv += ["--ca-file", certs.ca_file]
        client = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True
        )
        assert client.stdout is not None and client.stdin is not None
        line = _read_line(client, CLIENT_TIMEOUT_S)
        cpu_after = cpu_seconds(proxy.pid)
        report = json.loads(line)
        if report["failed"] or report["opened"] != count:
            raise BenchError(
                f"{protocol}: {report['opened']} of {count} connections answered, {report['failed']} failed "
                f"(first: {report['first_error']}); proxy log:\n{proxy.log_tail()}"
            )
        time.sleep(args.settle)
        rss_after, fds_after = rss_kib(proxy.pid), open_fds(proxy.pid)
        active = active_connections(proxy.admin)
        if active != count:
            raise BenchError(f"{protocol}: the proxy reports {active:g} active connections, expected {count}")
        client.stdin.write("close\n")
        client.stdin.flush()
        client.wait(timeout=60)
        return Row(
            protocol,
            count,
            rss_before,
            rss_after,
            fds_after - fds_before,
            report["seconds"],
            cpu_after - cpu_before,
            report["client_cpu"],
        )
    finally:
        if client is not None and client.poll() is None:
            client.kill()
            client.wait()
        proxy.stop()


def _read_line(process: subprocess.Popen[str], timeout: float) -> str:
    assert process.stdout is not None
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(process.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise BenchError(f"the client process gave no report within {timeout:.0f}s")
    line = process.stdout.readline()
    if not line:
        raise BenchError(f"the client process exited with {process.wait()} before reporting")
    return line


def table(rows: list[Row]) -> str:
    lines = [
        "| protocol | connections | proxy RSS before MiB | after MiB | per idle connection KiB | proxy fds added "
        "| accept rate conn/s | open time s | proxy CPU ms/conn | proxy CPU share | client CPU share |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.protocol} | {r.count:,} | {r.rss_before_kib / 1024:.1f} | {r.rss_after_kib / 1024:.1f} "
            f"| {r.per_connection_kib:.1f} | {r.fds_added:,} | {r.rate:,.0f} | {r.seconds:.2f} "
            f"| {1000 * r.proxy_cpu / r.count:.2f} | {r.proxy_cpu / r.seconds:.0%} | {r.client_cpu / r.seconds:.0%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[2000, 5000], help="connections per run")
    parser.add_argument("--protocols", nargs="+", choices=("plaintext", "tls"), default=["plaintext", "tls"])
    parser.add_argument("--concurrency", type=int, default=64, help="connections being set up at once")
    parser.add_argument("--warmup", type=int, default=20, help="connections before the baseline")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds before each RSS reading")
    # the client process (internal)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--frame", help=argparse.SUPPRESS)
    parser.add_argument("--ca-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        return client_main(args)

    raise_fd_limit()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2 * max(args.counts) + 100:
        print(f"ulimit -n (hard) is {hard}: too low for {max(args.counts):,} connections", file=sys.stderr)
        return 1

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    started = time.monotonic()
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; connections {args.counts}, "
        f"at most {args.concurrency} being set up at once",
        flush=True,
    )
    rows: list[Row] = []
    try:
        with tempfile.TemporaryDirectory(prefix="connection-memory-") as tmp, TansuBroker() as broker:
            workdir = Path(tmp)
            certs = make_certs(workdir) if "tls" in args.protocols else None
            for protocol in args.protocols:
                for count in args.counts:
                    tls = certs if protocol == "tls" else None
                    row = measure(workdir, broker.bootstrap, protocol, count, tls, args)
                    rows.append(row)
                    print(
                        f"{protocol:9} {count:6,} connections: {row.per_connection_kib:6.1f} KiB each, "
                        f"{row.rate:6,.0f} conn/s",
                        flush=True,
                    )
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print()
    print(table(rows))
    print(
        f"\nper idle connection: (RSS after - RSS before) / connections; accept rate: connections / the client's "
        f"time from first connect to last answer; {time.monotonic() - started:.0f}s in all"
    )
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
