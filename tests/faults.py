"""Fault-injection helpers for black-box reliability tests: they act on the
broker and on sockets only, never on the proxy's internals, so they serve any
implementation of the request path.

- ``FaultyTansu``: Tansu on one fixed port for its whole life, killed (-9),
  stalled (SIGSTOP) and resumed, restarted on the same port. Its storage is
  memory: a restart loses every topic (count records across a *stall*, or use
  Apache Kafka, to prove nothing acknowledged is lost across a restart).
- ``ProducerTraffic``: an idempotent confluent-kafka producer in a thread,
  counting acknowledged and failed records and timing each acknowledgement.
- ``ConnectionStorm``: connection attempts at a set rate (5,000/s) from
  another process, over raw non-blocking sockets closed with a reset (no
  TIME_WAIT, so the ephemeral ports last).
- ``Slowloris``: connections that announce a frame and send its body a byte
  at a time.
- ``NonReadingClient``: a client that keeps sending requests and never reads
  a response.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

from demo.tansu import TansuBroker
from tests.apache_kafka.broker import ApacheKafkaBroker
from tests.processes import process_tree
from tests.raw_kafka import RawConnection, api_versions_frame, metadata_frame

_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, leaves no TIME_WAIT


class _BrokerFaults:
    """Kill, stall and restart for a broker run as one child process (``_process``)."""

    _process: subprocess.Popen[bytes] | None

    def pid(self) -> int:
        assert self._process is not None, "not running"
        return self._process.pid

    def kill(self) -> None:
        """SIGKILL: the broker vanishes mid-request, its sockets reset by the kernel."""
        assert self._process is not None
        self._process.kill()
        self._process.wait()
        self._process = None

    def stall(self) -> None:
        """SIGSTOP: connections stay open (the kernel still accepts and acknowledges), nothing is answered."""
        os.kill(self.pid(), signal.SIGSTOP)
        # The signal is delivered asynchronously: a broker thread on the other core may
        # still answer a request or two. Return once every thread has stopped.
        deadline = time.monotonic() + 5
        while any(_state(task) not in ("T", "gone") for task in Path(f"/proc/{self.pid()}/task").iterdir()):
            assert time.monotonic() < deadline, "the broker did not stop"
            time.sleep(0.005)

    def resume(self) -> None:
        os.kill(self.pid(), signal.SIGCONT)

    def restart(self, down_for: float = 0.0) -> None:
        """Kill, stay down ``down_for`` seconds, start again on the same port."""
        if self._process is not None:
            self.kill()
        time.sleep(down_for)
        self._start_again()

    def _start_again(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        if self._process is not None:
            self.resume()  # a stopped process would not act on SIGTERM
        super().stop()  # type: ignore[misc]


def _state(task: Path) -> str:
    """A thread's state letter from /proc (T: stopped), or "gone"."""
    try:
        return (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


class FaultyTansu(_BrokerFaults, TansuBroker):
    """Tansu that can be killed, stalled and restarted on the same port (empty: memory storage)."""

    def _start_again(self) -> None:
        self.start()


class FaultyApacheKafka(_BrokerFaults, ApacheKafkaBroker):
    """Apache Kafka that can be killed, stalled and restarted on the same ports with the
    records it had written (its storage is a directory): what counts records across a
    broker restart."""

    def _start_again(self) -> None:
        self.launch()


def sockets_to(pid: int, port: int) -> int:
    """TCP sockets process ``pid`` and its descendants (a proxy's workers) hold whose remote
    port is ``port`` (any state: one in CLOSE_WAIT that nobody closes is a leak too), read
    from /proc as ``ss -tnp`` would."""
    inodes = set()
    for held_by in process_tree(pid):
        try:
            fds = list(Path(f"/proc/{held_by}/fd").iterdir())
        except OSError:
            continue  # exited meanwhile
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue  # closed meanwhile
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    held = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[9] in inodes:
                held += 1
    return held


def serves(address: str) -> bool:
    """True if an ApiVersions request through ``address`` is answered within 3 s."""
    try:
        with RawConnection(address, timeout=3) as conn:
            conn.send(api_versions_frame(1))
            return bool(conn.read_response(18, 3).header.correlation_id == 1)
    except (OSError, ConnectionError):
        return False


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class ProducerTraffic:
    """Records produced continuously to ``topic`` until ``stop()``; ``acked`` holds
    the value of every record the broker acknowledged (exactly what to count later)."""

    bootstrap: str
    topic: str
    interval: float = 0.01
    name: str = "record"  # values are name-0, name-1, ...: unique per producer when names are
    config: dict[str, Any] = field(default_factory=dict)
    acked: list[bytes] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # produce() to acknowledgement, seconds
    unflushed: int = -1  # records neither acknowledged nor failed when stop() gave up waiting
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> ProducerTraffic:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _producer(self) -> Producer:
        return Producer(
            {"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 0, **self.config}
        )

    def _run(self) -> None:
        producer = self._producer()
        sent = 0
        while not self._stop.wait(self.interval):
            value = f"{self.name}-{sent}".encode()
            started = time.monotonic()

            def delivered(err: Any, msg: Any, started: float = started) -> None:
                if err is None:
                    self.acked.append(msg.value())
                    self.latencies.append(time.monotonic() - started)
                else:
                    self.failed.append(str(err))

            try:
                producer.produce(self.topic, value=value, on_delivery=delivered)
                sent += 1
            except BufferError:
                pass  # the local queue is full while the broker is away; try again next tick
            except KafkaException as exc:
                # Fatal (e.g. a restarted broker that forgot this idempotent producer): an
                # application would start a new producer, and so does this one.
                self.failed.append(f"fatal: {exc}")
                producer = self._producer()
            producer.poll(0)
        self.unflushed = producer.flush(30)

    def stop(self) -> None:
        """Stop producing and wait for every record to be acknowledged or failed (at most 30 s)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
            assert not self._thread.is_alive(), "the producer thread hangs"

    def p99_ms(self, since: int = 0) -> float:
        """p99 of the acknowledgement latencies from index ``since`` on, in ms."""
        window = sorted(self.latencies[since:])
        return 1000 * window[min(len(window) - 1, int(len(window) * 0.99))] if window else float("nan")


@dataclass
class StormResult:
    attempts: int
    connected: int
    failed: int
    issue_seconds: float  # from the first attempt to the last
    seconds: float  # until the last attempt connected or failed

    @property
    def rate(self) -> float:
        """Attempts per second, as issued."""
        return self.attempts / self.issue_seconds if self.issue_seconds else 0.0


class ConnectionStorm:
    """``rate`` connection attempts per second for ``seconds``, from ``workers`` separate
    processes (this module run as a script), so the test process's own sockets and CPU
    are not the limit."""

    def __init__(self, address: str, rate: int = 5000, seconds: float = 5.0, workers: int = 2) -> None:
        self.address, self.rate, self.seconds, self.workers = address, rate, seconds, workers
        self._processes: list[subprocess.Popen[str]] = []

    def start(self) -> ConnectionStorm:
        share = str(self.rate // self.workers)
        self._processes = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.faults", "storm", self.address, share, str(self.seconds)],
                stdout=subprocess.PIPE,
                text=True,
                cwd=Path(__file__).resolve().parents[1],
            )
            for _ in range(self.workers)
        ]
        return self

    def result(self) -> StormResult:
        parts = [StormResult(**json.loads(p.communicate(timeout=self.seconds + 60)[0])) for p in self._processes]
        return StormResult(
            attempts=sum(p.attempts for p in parts),
            connected=sum(p.connected for p in parts),
            failed=sum(p.failed for p in parts),
            issue_seconds=max(p.issue_seconds for p in parts),
            seconds=max(p.seconds for p in parts),
        )


def _storm(address: str, rate: int, seconds: float) -> StormResult:
    """Open connections at ``rate``/s; each is reset as soon as it connects (or fails)."""
    host, port = address.rsplit(":", 1)
    target = (host, int(port))
    selector = selectors.DefaultSelector()
    attempts = connected = failed = 0
    started = time.monotonic()
    last_issued = started
    deadline = started + seconds
    while True:
        now = time.monotonic()
        due = min(int((now - started) * rate), int(seconds * rate)) - attempts
        for _ in range(max(0, due)):
            sock = socket.socket()
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
            attempts += 1
            if sock.connect_ex(target) not in (0, 115):  # 115: EINPROGRESS
                failed += 1
                sock.close()
                continue
            selector.register(sock, selectors.EVENT_WRITE, now)
            last_issued = time.monotonic()
        for key, _ in selector.select(timeout=0.001):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            selector.unregister(sock)
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                connected += 1
            else:
                failed += 1
            sock.close()
        for key in list(selector.get_map().values()):  # gave up on: no answer within 3 s
            if now - key.data > 3:
                selector.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]
                failed += 1
        if now >= deadline and not selector.get_map():
            break
    return StormResult(attempts, connected, failed, last_issued - started, time.monotonic() - started)


class Slowloris:
    """``count`` connections, each announcing a ``size``-byte request, sending the first
    ``prefill`` bytes of its body as fast as the proxy takes them and the rest one byte
    every ``interval`` seconds, until the proxy closes it or ``stop()``."""

    def __init__(
        self, address: str, count: int, size: int = 1_000_000, interval: float = 0.5, prefill: int = 0
    ) -> None:
        host, port = address.rsplit(":", 1)
        self.sockets = [socket.create_connection((host, int(port)), timeout=10) for _ in range(count)]
        self.size, self.interval, self.prefill = size, interval, prefill
        self.closed_by_peer = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._dribble, daemon=True)

    def start(self) -> Slowloris:
        for sock in self.sockets:
            sock.sendall(self.size.to_bytes(4, "big") + b"\x00\x12\x00\x03")  # ApiVersions v3 begins
            sock.setblocking(False)
        self._thread.start()
        return self

    def _dribble(self) -> None:
        alive = {sock: 4 for sock in self.sockets}  # socket -> body bytes sent
        filler = bytes(65536)
        while alive and not self._stop.wait(self.interval if all(n >= self.prefill for n in alive.values()) else 0.01):
            for sock, sent in list(alive.items()):
                try:
                    if sock.recv(1) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    pass  # nothing to read: still open
                except OSError:
                    del alive[sock]
                    self.closed_by_peer += 1
                    continue
                try:
                    while sent < self.prefill:  # as much as the socket takes now
                        sent += sock.send(filler[: self.prefill - sent])
                    if sent < self.size - 1:
                        sent += sock.send(b"\x00")
                except BlockingIOError:
                    pass
                except OSError:
                    del alive[sock]
                    self.closed_by_peer += 1
                    continue
                alive[sock] = sent

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for sock in self.sockets:
            sock.close()


class NonReadingClient:
    """Sends ``frame`` over and over and never reads: how far can it get ahead?"""

    def __init__(self, address: str, frame: bytes) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self.frame = frame
        self.sent_frames = 0

    def send_until_blocked(self, seconds: float) -> bool:
        """Keep sending for up to ``seconds``; True if the proxy stopped taking bytes (backpressure)."""
        self.sock.settimeout(1.0)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                self.sock.sendall(self.frame)
            except TimeoutError:
                return True  # a whole second without room in the socket: the proxy stopped reading
            self.sent_frames += 1
        return False

    def close(self) -> None:
        self.sock.close()


def consumed_values(bootstrap: str, topic: str, expected: int, timeout: float = 30) -> list[bytes]:
    """Every record of ``topic`` from the start (partitions assigned, no group to join),
    read until ``expected`` have come and nothing more arrives for a second."""
    # A group id is required; with assign() no group is joined and nothing is committed.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "count", "enable.auto.commit": False})
    values: list[bytes] = []
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + timeout
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None or message.error() is not None:
                if len(values) >= expected and time.monotonic() - quiet_since > 1:
                    break
                continue
            values.append(message.value())
            quiet_since = time.monotonic()
    finally:
        consumer.close()
    return values


def assert_exactly_once(traffic: list[ProducerTraffic], values: list[bytes]) -> int:
    """Every acknowledged record is among ``values`` exactly once, and no record is there
    twice; returns how many were acknowledged."""
    acked = [v for t in traffic for v in t.acked]
    assert len(set(acked)) == len(acked)
    duplicated = len(values) - len(set(values))
    lost = set(acked) - set(values)
    assert duplicated == 0 and not lost, f"{duplicated} duplicated, {len(lost)} lost of {len(acked)}"
    return len(acked)


class StoppedClient:
    """A client process that talks to ``address`` and then is stopped (SIGSTOP) for good:
    its kernel keeps the connection open and acknowledges, nothing reads or sends again,
    no FIN ever comes, the way a frozen or partitioned client looks to a server.

    ``mode``: ``idle`` (one ApiVersions round trip), ``request`` (a Metadata request it
    never reads the answer to), ``unread`` (Metadata requests until the proxy stops taking
    them, none read)."""

    def __init__(self, address: str, mode: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.faults", "stopped-client", address, mode],
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        assert self.process.stdout is not None
        self.sent = int(self.process.stdout.readline() or -1)
        assert self.sent >= 0, f"the {mode} client failed"
        deadline = time.monotonic() + 10
        while Path(f"/proc/{self.process.pid}/stat").read_text().split(") ")[1][0] != "T":
            assert time.monotonic() < deadline, "the client did not stop"
            time.sleep(0.01)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


def _stopped_client(address: str, mode: str) -> None:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sent = 0
    if mode == "idle":
        sock.sendall(api_versions_frame(1))
        size = int.from_bytes(sock.recv(4, socket.MSG_WAITALL), "big")
        sock.recv(size, socket.MSG_WAITALL)
    elif mode == "request":
        sock.sendall(metadata_frame(1))
        sent = 1
    else:
        sock.settimeout(1)
        frame = metadata_frame(1)
        try:
            while True:
                sock.sendall(frame)
                sent += 1
        except TimeoutError:
            pass  # the proxy stopped reading: what it has taken it cannot answer
    print(sent, flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(3600)


if __name__ == "__main__" and sys.argv[1] == "storm":
    result = _storm(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    print(json.dumps(result.__dict__))
elif __name__ == "__main__" and sys.argv[1] == "stopped-client":
    _stopped_client(sys.argv[2], sys.argv[3])
