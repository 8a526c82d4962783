"""What the benchmarks in bench/ share: the processes they start (and stop), their CPU
time and memory from /proc, test certificates, and the few Kafka requests they
send by hand (kio encodes).

Everything measured here is a black box: a process started from its command
line, talking Kafka on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kio.serial import entity_reader, entity_writer

# The benchmarks run as scripts (python bench/NAME.py), with bench/ first on the path: the
# repository's root joins it for the helpers they share with the tests (demo/, tests/).
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(1, str(ROOT))

from demo.tansu import stop_process  # noqa: E402

HOST = "127.0.0.1"
START_TIMEOUT_S = 20.0
API_VERSIONS = 18
FETCH = 1


class BenchError(Exception):
    """A path could not be set up or measured; the message says which and why."""


class Service:
    """One subprocess of a benchmark, its output in a log file, stopped with ``stop``."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log_path: Path,
        *,
        cwd: Path | None = None,
        stdin: int | None = subprocess.DEVNULL,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._log = log_path.open("wb")
        try:
            self.process = subprocess.Popen(
                argv,
                stdin=stdin,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env={**os.environ, "RUST_LOG": "warn"},
                start_new_session=True,  # Ctrl-C reaches the benchmark, which stops it in order
            )
        except OSError as exc:
            self._log.close()
            raise BenchError(f"{name}: cannot start {argv[0]}: {exc}") from None

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 15) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(f"    | {line}" for line in text) or "    | (no output)"

    def check_running(self, what: str = "") -> None:
        if self.process.poll() is not None:
            raise BenchError(
                f"{self.name} exited with status {self.process.returncode}{what}; its output:\n{self.log_tail()}"
            )

    def wait_for_port(self, port: int, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.check_running(f" before listening on {HOST}:{port}")
            try:
                with socket.create_connection((HOST, port), timeout=0.5):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"{self.name} does not listen on {HOST}:{port} after {timeout:.0f}s; "
                        f"its output:\n{self.log_tail()}"
                    ) from None
                time.sleep(0.05)

    def cpu_seconds(self) -> float:
        """Its CPU and that of its child processes (a proxy with ``workers: N`` is N + 1 processes)."""
        return sum(cpu_seconds(pid) for pid in process_tree(self.pid))

    def stop(self, timeout: float = 10.0) -> None:
        stop_process(self.process, timeout)
        self._log.close()


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (/proc/PID/task/TID/children)."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for task in Path(f"/proc/{current}/task").iterdir():
                with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                    todo.extend(int(child) for child in (task / "children").read_text().split())
    return tree


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a process's live threads so far, in nanosecond resolution.

    From /proc/PID/task/*/schedstat (time on CPU); /proc/PID/stat counts in clock
    ticks of 10 ms, too coarse for a thousand round trips of ~100 us. Threads that
    ended are not counted: measure across a window in which the middle's threads live."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def context_switches(pid: int) -> tuple[int, int]:
    """Voluntary (the thread blocked: waited for I/O or a lock) and involuntary (preempted)
    context switches of a process's live threads so far."""
    voluntary = involuntary = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    voluntary += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    involuntary += int(line.split()[1])
    return voluntary, involuntary


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise BenchError(f"no VmRSS for pid {pid}")


def read_metrics(url: str) -> dict[str, float]:
    """Unlabelled samples of a Prometheus text page, by name."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if line and not line.startswith("#") and "{" not in name:
            with contextlib.suppress(ValueError):
                samples[name] = float(value)
    return samples


def load_average() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def quantile_us(seconds: list[float], q: float) -> float:
    """The ``q`` quantile of these durations, in microseconds (the nearest rank at or below)."""
    ordered = sorted(seconds)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6


# --- TLS --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certs:
    ca_file: str
    cert_file: str
    key_file: str


def make_certs(directory: Path) -> Certs:
    """A test CA (trustme) and a server certificate for 127.0.0.1 and localhost."""
    import trustme

    ca = trustme.CA()
    server = ca.issue_cert(HOST, "localhost")
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    server.cert_chain_pems[0].write_to_path(str(directory / "server.pem"))
    server.private_key_pem.write_to_path(str(directory / "server.key"))
    (directory / "server.key").chmod(0o600)  # the proxy warns about keys others can read
    return Certs(str(directory / "ca.pem"), str(directory / "server.pem"), str(directory / "server.key"))


# --- Kafka requests by hand ---------------------------------------------------------------------


def request_frame(body: Any, correlation_id: int = 1, client_id: str = "bench") -> bytearray:
    """A whole request frame (length prefix, header, body) for a kio request entity.

    The correlation id sits at bytes 8-12; a caller may rewrite it in place."""
    from kio.static.primitive import i16, i32

    header = type(body).__header_schema__(
        request_api_key=i16(body.__api_key__),
        request_api_version=i16(body.__version__),
        correlation_id=i32(correlation_id),
        client_id=client_id,
    )
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    entity_writer(type(header))(out, header)
    entity_writer(type(body))(out, body)
    frame = bytearray(out.getbuffer())
    frame[:4] = (len(frame) - 4).to_bytes(4, "big")
    return frame


def api_versions_frame(correlation_id: int = 1) -> bytes:
    from kio.schema.api_versions.v3.request import ApiVersionsRequest

    body = ApiVersionsRequest(client_software_name="bench", client_software_version="1")
    return bytes(request_frame(body, correlation_id))


def fetch_frame(topic: str, offset: int, max_bytes: int, correlation_id: int = 1) -> bytearray:
    """Fetch v12 (topics by name) of partition 0 from ``offset``, at most ``max_bytes``
    (at least one record batch), answered as soon as there is one byte.

    The maximum wait is 500 ms, not 0: Tansu answers a Fetch with max wait 0
    with no partitions at all, records or not."""
    from kio.schema.fetch.v12 import request as m
    from kio.schema.types import BrokerId, TopicName
    from kio.static.primitive import i8, i32, i32Timedelta, i64

    partition = m.FetchPartition(
        partition=i32(0),
        current_leader_epoch=i32(-1),
        fetch_offset=i64(offset),
        last_fetched_epoch=i32(-1),
        log_start_offset=i64(-1),
        partition_max_bytes=i32(max_bytes),
    )
    body = m.FetchRequest(
        replica_id=BrokerId(-1),
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=500)),
        min_bytes=i32(1),
        max_bytes=i32(max_bytes),
        isolation_level=i8(0),
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=(m.FetchTopic(topic=TopicName(topic), partitions=(partition,)),),
        forgotten_topics_data=(),
        rack_id="",
    )
    return request_frame(body, correlation_id)


def fetch_high_watermark(response: bytes) -> int:
    """The high watermark of partition 0 in a whole Fetch v12 response frame."""
    from kio.schema.fetch.v12.response import FetchResponse

    _, header_size = entity_reader(FetchResponse.__header_schema__)(response, 4)
    body, _ = entity_reader(FetchResponse)(response, 4 + header_size)
    partition = body.responses[0].partitions[0]
    if partition.error_code != 0:
        raise BenchError(f"Fetch answered error code {int(partition.error_code)}")
    return int(partition.high_watermark)


def produce_frame(topic: str, value: bytes, correlation_id: int = 1) -> bytearray:
    """Produce v9, acks=1, of one record (``value``, no key) to partition 0 of ``topic``:
    one uncompressed v2 record batch, encoded by kafka-python's builder (CRC-32C included)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kio.schema.produce.v9 import request as m
    from kio.schema.types import TopicName
    from kio.static.primitive import Records, i16, i32, i32Timedelta

    batch = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=len(value) + 1024,
    )
    batch.append(0, timestamp=None, key=None, value=value, headers=[])
    partition = m.PartitionProduceData(index=i32(0), records=Records(bytes(batch.build())))
    body = m.ProduceRequest(
        acks=i16(1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        topic_data=(m.TopicProduceData(name=TopicName(topic), partition_data=(partition,)),),
    )
    return request_frame(body, correlation_id)


def produce_error_code(response: bytes) -> int:
    """The error code of the one partition in a whole Produce v9 response frame."""
    from kio.schema.produce.v9.response import ProduceResponse

    _, header_size = entity_reader(ProduceResponse.__header_schema__)(response, 4)
    body, _ = entity_reader(ProduceResponse)(response, 4 + header_size)
    return int(body.responses[0].partition_responses[0].error_code)


class KafkaSocket:
    """A blocking Kafka connection that sends prepared frames and reads whole responses."""

    def __init__(self, address: tuple[str, int], ca_file: str | None = None, timeout: float = 10.0) -> None:
        sock = socket.create_connection(address, timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ca_file is not None:
            sock = ssl.create_default_context(cafile=ca_file).wrap_socket(sock, server_hostname=address[0])
        self.sock = sock
        self._buffer = bytearray()

    def round_trip(self, frame: bytes | bytearray) -> bytes:
        """Send one request; its whole response frame (length prefix included)."""
        self.sock.sendall(frame)
        while len(self._buffer) < 4 or len(self._buffer) < 4 + int.from_bytes(self._buffer[:4], "big"):
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise BenchError("the connection closed before a whole response")
            self._buffer += chunk
        size = 4 + int.from_bytes(self._buffer[:4], "big")
        response = bytes(self._buffer[:size])
        del self._buffer[:size]
        return response

    def close(self) -> None:
        self.sock.close()
