"""Black-box fuzzing of the running proxy (a subprocess) in front of a real
Tansu: random and mutated frames, each on its own connection, from sixteen
sender threads, while a well-behaved client on another connection keeps
asking ApiVersions and a confluent-kafka producer keeps producing. Only the
offending connections close, each close the proxy makes is counted in
/metrics, the well-behaved clients never notice, no connection ends in an
internal error, and the proxy stays up and small.

The mutated frames are real requests of every API the proxy decodes (kio
schemas, every version) with their bytes mutated; with the group and
identifier policies on, the proxy decodes them. It runs under an address-space
limit (as a container memory limit would hold it), so an allocation far beyond
the frame fails the same way on every machine.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections import Counter as Tally
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import Producer

from demo.tansu import TansuBroker
from tests.fuzz.budget import BUDGET, Counter
from tests.fuzz.mutations import mutate, reframed
from tests.fuzz.wire_corpus import wire_corpus
from tests.raw_kafka import RawConnection, api_versions_frame

SPECIAL = [
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 32,  # a TLS ClientHello
    b"GET / HTTP/1.1\r\nHost: kafka\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    b"\xff\xff\xff\xff",  # a negative length
    b"\x7f\xff\xff\xff" + b"\0" * 64,  # 2 GiB announced
    b"\x00\x00\x00\x00",  # an empty frame
    b"\x00\x00\x00\x03\x00\x12\x00",  # too short for a header
    b"\x00\x00\x10\x00" + b"\x00\x12" * 8,  # announces 4 KiB, sends 16 bytes, stops
]
POLICIES = {
    # Decode what the policies read: group APIs, KIP-1233 identifiers, the memory pool.
    "group.max.size": 1000,
    "group.consumer.max.size": 1000,
    "resource.identifier.limit.enable": True,
    "queued.max.request.bytes": 209715200,
    "request.body.timeout.ms": 2000,
}
ADDRESS_SPACE = 2 * 1024**3  # the proxy's whole virtual memory, as a container limit would cap it


def hostile_frame(i: int, seed: int) -> bytes:
    rng = random.Random(seed * 1_000_003 + i)
    requests = [b.frame for b in wire_corpus() if not b.response]
    roll = rng.random()
    if roll < 0.6:  # a real request, its body mutated, its length prefix right
        return reframed(lambda body: mutate(body, rng), rng.choice(requests))
    if roll < 0.75:  # a real request mutated prefix and all
        return mutate(rng.choice(requests), rng)
    if roll < 0.85:
        return rng.randbytes(rng.randint(1, 64))
    return mutate(rng.choice(SPECIAL), rng, max_edits=1) if rng.random() < 0.5 else rng.choice(SPECIAL)


def send_hostile(address: str, frame: bytes) -> str:
    """Send one frame on a new connection; what the proxy did: closed, answered or nothing."""
    host, port = address.rsplit(":", 1)
    try:
        sock = socket.create_connection((host, int(port)), timeout=5)
    except OSError:
        return "refused"  # nobody listens: the proxy is gone
    with sock:
        sock.settimeout(0.3)
        try:
            sock.sendall(frame)
            data = sock.recv(65536)
        except TimeoutError:
            return "open"
        except (ConnectionResetError, BrokenPipeError):
            return "closed"
        return "answered" if data else "closed"


@dataclass
class WellBehaved:
    """A raw client asking ApiVersions every 20 ms and a producer producing every 20 ms."""

    address: str
    stop: threading.Event = field(default_factory=threading.Event)
    round_trips: int = 0
    failures: list[str] = field(default_factory=list)
    produced: int = 0
    delivered: int = 0
    delivery_errors: list[str] = field(default_factory=list)

    def run(self) -> Iterator[None]:
        threads = [threading.Thread(target=self._ask, daemon=True), threading.Thread(target=self._produce, daemon=True)]
        for thread in threads:
            thread.start()
        yield
        self.stop.set()
        for thread in threads:
            thread.join(30)

    def _ask(self) -> None:
        try:
            with RawConnection(self.address) as conn:
                correlation = 0
                while not self.stop.wait(0.02):
                    correlation += 1
                    conn.send(api_versions_frame(correlation))
                    response = conn.read_response(18, 3)
                    if response.header.correlation_id != correlation or response.body.error_code != 0:
                        self.failures.append(f"bad answer to {correlation}")
                    self.round_trips += 1
        except Exception as exc:
            self.failures.append(repr(exc))

    def _produce(self) -> None:
        def delivered(err: Any, _msg: Any) -> None:
            if err is None:
                self.delivered += 1
            else:
                self.delivery_errors.append(str(err))

        producer = Producer({"bootstrap.servers": self.address, "enable.idempotence": True, "linger.ms": 0})
        while not self.stop.wait(0.02):
            producer.produce("fuzz-well-behaved", value=f"record {self.produced}".encode(), on_delivery=delivered)
            self.produced += 1
            producer.poll(0)
        self.failures.extend(f"{n} records not delivered" for n in [producer.flush(5)] if n)


@pytest.fixture
def own_tansu() -> Iterator[TansuBroker]:
    """A broker of its own: mutated requests reach it, and must not disturb other tests."""
    with TansuBroker() as broker:
        yield broker


def fuzz_the_running_proxy(proxy: Any, seed: int) -> dict[str, Any]:
    wire_corpus()
    frames = [hostile_frame(i, seed) for i in range(BUDGET.socket_frames)]
    counter = Counter("hostile frames over sockets to a running proxy")
    well_behaved = WellBehaved(proxy.bootstrap)
    rss_before = proxy.rss_kib()
    failures_before = proxy.metric("kafka_admission_connection_failures_total")
    started = time.monotonic()
    run = well_behaved.run()
    next(run)
    time.sleep(1)  # the producer connects and gets its producer id
    with ThreadPoolExecutor(16) as pool:
        outcomes = Tally(pool.map(lambda f: send_hostile(proxy.bootstrap, f), frames))
    next(run, None)
    note = ", ".join(f"{n} {what}" for what, n in sorted(outcomes.items()))
    counter.done(len(frames) - outcomes["refused"], time.monotonic() - started, note)  # frames the proxy received
    return {
        "outcomes": outcomes,
        "well_behaved": well_behaved,
        "rss_growth_kib": proxy.rss_kib() - rss_before if proxy.process.poll() is None else None,
        "failures_counted": proxy.metric("kafka_admission_connection_failures_total") - failures_before
        if proxy.process.poll() is None
        else None,
    }


def assert_survived(proxy: Any, result: dict[str, Any]) -> None:
    print(f"outcomes: {dict(result['outcomes'])}, failures counted: {result['failures_counted']}")
    assert proxy.process.poll() is None, f"the proxy died:\n{proxy.log()[-1500:]}"
    well_behaved = result["well_behaved"]
    assert well_behaved.failures == [], well_behaved.failures
    assert well_behaved.round_trips > 20
    assert well_behaved.delivery_errors == []
    assert well_behaved.delivered == well_behaved.produced > 20
    outcomes = result["outcomes"]
    assert outcomes["closed"] > 0
    # Every connection the proxy closed on its own is a counted failure, with its cause.
    assert result["failures_counted"] >= outcomes["closed"]
    assert "internal error" not in proxy.log()
    assert result["rss_growth_kib"] < 64 * 1024
    assert proxy.get("/readyz")[0] == 200


def test_hostile_frames_close_only_their_connections(own_tansu: TansuBroker, start_proxy: Any) -> None:
    """Requests are peeked and forwarded, not decoded (no group or identifier policy)."""
    proxy = start_proxy(own_tansu.bootstrap, command_prefix=["prlimit", f"--as={ADDRESS_SPACE}"])
    result = fuzz_the_running_proxy(proxy, seed=1)
    assert_survived(proxy, result)


def test_hostile_frames_close_only_their_connections_with_every_policy_decoding(
    own_tansu: TansuBroker,
    start_proxy: Any,
) -> None:
    proxy = start_proxy(
        own_tansu.bootstrap,
        policies=POLICIES,
        command_prefix=["prlimit", f"--as={ADDRESS_SPACE}"],
    )
    result = fuzz_the_running_proxy(proxy, seed=2)
    assert_survived(proxy, result)
