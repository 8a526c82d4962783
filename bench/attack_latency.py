"""What one hostile client costs everyone else (issue 33, attacks 2 and 4): a
well-behaved client's round trips while another connection sends one hostile frame,
and the proxy's RSS after a flood of request headers naming distinct API versions.

One proxy (the ``run`` CLI, cluster mode, ``group.max.size`` set so that JoinGroup
is decoded) in front of an embedded Tansu. For each scenario and round: a pinger
(ApiVersions round trips on its own connection, 10 ms apart) runs alone for
``--quiet`` seconds, then a fresh connection sends the hostile frame and waits for
its answer or its close, then the pinger runs ``--quiet`` seconds more. Reported:
the pinger's round trips (p50, p99, max) over the whole round, and how long the
hostile frame took from its last byte sent to its answer or close.

Scenarios:
- ``none``: no hostile frame (the baseline);
- ``produce-tagged``: 16 MiB of zeros after a Produce v9 header claiming 8 million
  tagged fields (refused by the count now; walked in full before);
- ``join-group-3mb``: a JoinGroup of a million 3-byte protocols (over
  MAX_REQUEST_ELEMENTS: refused before kio reads it);
- ``join-group-at-budget``: a JoinGroup of MAX_REQUEST_ELEMENTS (100,000) 3-byte
  protocols: accepted, walked, decoded and forwarded: the most one frame costs now.

The flood: ``--flood`` headers (14 bytes each, 4,681 per connection, the broker
closes each connection at the first) naming distinct (API key, version) pairs kio
does not know, after as many naming one pair; RSS (VmRSS) before and after.

    .venv/bin/python bench/attack_latency.py [--rounds 3] [--flood 299584]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from harness import KafkaSocket, Service, api_versions_frame, load_average, rss_kib
from kio.index import load_request_schema

from demo.tansu import TansuBroker, free_port
from proxy.protocol import count_guard, wire

HOST = "127.0.0.1"
_HEADER = struct.Struct(">ihhih")  # length 10, api key, version, correlation id, null client id
MAX_REQUEST_ELEMENTS = getattr(count_guard, "MAX_REQUEST_ELEMENTS", 100_000)  # (main before it had none)
HEADERS_PER_CONNECTION = 4_681  # 64 KiB of 14-byte frames: one receive of the proxy's


class Pinger:
    def __init__(self, port: int) -> None:
        self.port = port
        self.round_trips: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: str | None = None

    def _run(self) -> None:
        try:
            conn = KafkaSocket((HOST, self.port), timeout=60)
            frame = api_versions_frame()
            while not self._stop.wait(0.01):
                started = time.perf_counter()
                conn.round_trip(frame)
                self.round_trips.append(time.perf_counter() - started)
            conn.close()
        except Exception as exc:
            self.error = repr(exc)

    def __enter__(self) -> Pinger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def produce_tagged(size: int = 16 << 20) -> bytes:
    head = struct.pack(">hhih", 0, 9, 1, -1)
    body = head + varint((size - len(head)) // 2)
    body += bytes(size - len(body))
    return len(body).to_bytes(4, "big") + body


def join_group(protocols: int) -> bytes:
    schema = load_request_schema(11, 9)
    module = sys.modules[schema.__module__]
    body = schema(
        group_id="bench-hostile",
        session_timeout=__import__("datetime").timedelta(seconds=30),
        rebalance_timeout=__import__("datetime").timedelta(seconds=30),
        member_id="",
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(module.JoinGroupRequestProtocol(name="", metadata=b""),) * protocols,
        reason=None,
    )
    return wire.encode_frame(wire.request_header_for(11, 9, 1, "bench-hostile"), body)


SCENARIOS: dict[str, Callable[[], bytes | None]] = {
    "none": lambda: None,
    "produce-tagged": produce_tagged,
    "join-group-3mb": lambda: join_group(1_000_000),
    "join-group-at-budget": lambda: join_group(MAX_REQUEST_ELEMENTS),
}


def send_hostile(port: int, frame: bytes) -> float:
    """Seconds from the frame's last byte sent to its answer or close."""
    with socket.create_connection((HOST, port), timeout=120) as sock:
        sock.sendall(frame)
        sent = time.perf_counter()
        with contextlib.suppress(ConnectionResetError):
            sock.recv(1)
        return time.perf_counter() - sent


@dataclasses.dataclass
class Round:
    round_trips: list[float]
    hostile_s: float | None


def run_round(port: int, frame: bytes | None, quiet: float) -> Round:
    with Pinger(port) as pinger:
        time.sleep(quiet)
        hostile = send_hostile(port, frame) if frame is not None else None
        time.sleep(quiet)
    if pinger.error is not None:
        raise SystemExit(f"the pinger failed: {pinger.error}")
    return Round(pinger.round_trips, hostile)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f}"


def flood(port: int, pairs: list[tuple[int, int]]) -> None:
    for i in range(0, len(pairs), HEADERS_PER_CONNECTION):
        data = b"".join(_HEADER.pack(10, k, v, n, -1) for n, (k, v) in enumerate(pairs[i : i + HEADERS_PER_CONNECTION]))
        with socket.create_connection((HOST, port), timeout=30) as sock:
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                sock.sendall(data)
                while sock.recv(65536):
                    pass


def distinct_pairs(count: int) -> list[tuple[int, int]]:
    pairs = [(k, v) for k in (*range(2, 8), *range(1000, 1100)) for v in range(100, 3100)]
    if count > len(pairs):
        raise SystemExit(f"--flood at most {len(pairs)}")
    return pairs[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quiet", type=float, default=1.0, help="seconds of pinging before and after the frame")
    parser.add_argument("--flood", type=int, default=64 * HEADERS_PER_CONNECTION)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = parser.parse_args()

    print(f"load average at start {load_average()}")
    with TansuBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        port, admin = free_port(), free_port()
        config = {
            "upstream": {"bootstrap_servers": [broker.bootstrap]},
            "listeners": [{"name": "external", "bind": f"{HOST}:{port}", "node_port_base": free_port()}],
            "admin": {"bind": f"{HOST}:{admin}"},
            "policies": {"group.max.size": 1000},
        }
        config_path = Path(tmp) / "proxy.yaml"
        config_path.write_text(yaml.safe_dump(config))
        argv = [sys.executable, "-m", "proxy.cli", "run", "--config", str(config_path)]
        proxy = Service("proxy", argv, Path(tmp) / "proxy.log")
        try:
            proxy.wait_for_port(admin)
            print("| scenario | frame bytes | round trips | p50 ms | p99 ms | max ms | hostile frame done after, ms |")
            print("|---|---:|---:|---:|---:|---:|---:|")
            for name in args.scenarios.split(","):
                frame = SCENARIOS[name]()
                rounds = [run_round(port, frame, args.quiet) for _ in range(args.rounds)]
                proxy.check_running(f" during {name}")
                trips = sorted(t for r in rounds for t in r.round_trips)
                p99 = trips[min(len(trips) - 1, int(len(trips) * 0.99))]
                maxes = "/".join(ms(max(r.round_trips)) for r in rounds)
                hostile = "/".join(ms(r.hostile_s) for r in rounds if r.hostile_s is not None) or "-"
                print(
                    f"| {name} | {len(frame) if frame else 0:,} | {len(trips)} | {ms(statistics.median(trips))} "
                    f"| {ms(p99)} | {maxes} | {hostile} |"
                )
            total = args.flood
            flood(port, [(1000, 0)] * total)
            before = rss_kib(proxy.pid)
            started = time.perf_counter()
            flood(port, distinct_pairs(total))
            after = rss_kib(proxy.pid)
            proxy.check_running(" after the flood")
            print(
                f"\nversion flood: {total:,} headers naming distinct pairs in {time.perf_counter() - started:.1f} s "
                f"(after as many naming one pair): RSS {before / 1024:.1f} -> {after / 1024:.1f} MiB "
                f"({(after - before) / 1024:+.1f} MiB)"
            )
        finally:
            proxy.stop()
    print(f"load average at end {load_average()}")


if __name__ == "__main__":
    main()
