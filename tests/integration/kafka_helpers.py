"""The external processes the integration tests run beside the proxy:
librdkafka's mock cluster, stunnel (TLS in front of a plaintext broker) and a
gate that lets only the proxy reach a broker's advertised address. Plain
functions and classes, imported by the test modules; the Kafka client
workloads themselves are in tests/clients.py."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import TracebackType

from confluent_kafka import Producer

from demo.tansu import free_port, stop_process, wait_for_port
from tests.processes import process_tree


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


# --- librdkafka's mock cluster -----------------------------------------------


class MockCluster:
    """librdkafka's built-in mock cluster: real broker sockets on 127.0.0.1
    that live as long as the client object that created them.

    Node ids are 1..n. Topics are auto-created (4 partitions) or made with
    CreateTopics; partition leaders are spread over the brokers.
    """

    def __init__(self, brokers: int = 3) -> None:
        lines: queue.Queue[str] = queue.Queue()

        class _Collect(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                lines.put(record.getMessage())

        self._logger = logging.getLogger(f"mock-cluster-{id(self)}")
        self._logger.propagate = False
        self._logger.addHandler(_Collect())
        self._logger.setLevel(logging.DEBUG)
        self._owner: Producer | None = Producer(
            {"test.mock.num.brokers": brokers, "debug": "mock", "logger": self._logger}
        )
        self.bootstrap_servers: list[str] = []
        deadline = time.monotonic() + 10
        while not self.bootstrap_servers and time.monotonic() < deadline:
            self._owner.poll(0.05)
            while not lines.empty():
                found = re.search(r"bootstrap\.servers=(\S+)", lines.get())
                if found:
                    self.bootstrap_servers = found.group(1).split(",")
        if not self.bootstrap_servers:
            raise AssertionError("librdkafka mock cluster did not log its bootstrap.servers")
        for address in self.bootstrap_servers:
            wait_for_port(*host_port(address))

    @property
    def ports(self) -> set[int]:
        return {host_port(a)[1] for a in self.bootstrap_servers}

    def close(self) -> None:
        self._owner = None  # the mock brokers go with their client


# --- stunnel: TLS in front of a plaintext broker -----------------------------


def stunnel_binary() -> str | None:
    return shutil.which("stunnel4") or shutil.which("stunnel")


class Stunnel:
    """``stunnel`` terminating TLS on ``accept`` and forwarding to ``connect``."""

    def __init__(
        self,
        binary: str,
        workdir: Path,
        *,
        connect: str,
        cert_file: str,
        key_file: str,
        accept_port: int | None = None,
    ) -> None:
        self.port = accept_port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = workdir / f"stunnel-{self.port}.log"
        self.config_path = workdir / f"stunnel-{self.port}.conf"
        self.output_path = workdir / f"stunnel-{self.port}.out"
        self.config_path.write_text(
            "foreground = yes\n"
            "pid =\n"
            f"output = {self.log_path}\n"
            "debug = info\n"
            "[kafka]\n"
            f"accept = {self.address}\n"
            f"connect = {connect}\n"
            f"cert = {cert_file}\n"
            f"key = {key_file}\n"
        )
        self._binary = binary
        self._process: subprocess.Popen[bytes] | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def accepted_connections(self) -> int:
        return len(re.findall(r"accepted connection from", self.log()))

    def start(self) -> Stunnel:
        with self.output_path.open("wb") as output:
            self._process = subprocess.Popen(
                [self._binary, str(self.config_path)],
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_for_port("127.0.0.1", self.port, timeout=10)
        except TimeoutError:
            printed = self._stop()
            raise AssertionError(f"stunnel did not listen on {self.address}:\n{printed}\n{self.log()}") from None
        return self

    def _stop(self) -> str:
        if self._process is None:
            return ""
        stop_process(self._process)
        self._process = None
        return self.output_path.read_text(errors="replace")

    def stop(self) -> None:
        self._stop()

    def __enter__(self) -> Stunnel:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# --- a broker address only the proxy may use ---------------------------------


def _socket_inode(local_port: int, remote_port: int) -> int | None:
    """The inode of the TCP socket ``127.0.0.1:local_port -> ...:remote_port``."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if int(local.rsplit(":", 1)[1], 16) == local_port and int(remote.rsplit(":", 1)[1], 16) == remote_port:
                return int(inode)
    return None


def _process_owns_socket(pid: int, inode: int) -> bool:
    target = f"socket:[{inode}]"
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # the process is gone
        return False
    for fd in fds:
        try:
            if os.readlink(fd) == target:
                return True
        except OSError:
            continue
    return False


class ProxyOnlyGate:
    """A TCP forwarder standing at a broker's advertised address that serves
    one process only (the proxy, with its workers): a connection from anyone else is recorded in
    ``refused`` and closed. A client that ever used an address the proxy did
    not rewrite would show up there, and fail."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.address = f"127.0.0.1:{self.port}"
        self.allowed_pid: int | None = None  # None: refuse everyone
        self.open = False  # True: forward everyone (a plain forwarder)
        self.forwarded: list[int] = []  # client ports of the proxy's connections
        self.refused: list[int] = []  # client ports of anyone else's
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, (_, peer_port) = self._listener.accept()
            except OSError:
                return
            inode = _socket_inode(peer_port, self.port)
            pid = self.allowed_pid
            admitted = self.open or (
                pid is not None and inode is not None and any(_process_owns_socket(p, inode) for p in process_tree(pid))
            )
            if not admitted:
                self.refused.append(peer_port)
                conn.close()
                continue
            try:
                upstream = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                conn.close()
                continue
            upstream.settimeout(None)
            self.forwarded.append(peer_port)
            self._sockets += [conn, upstream]
            threading.Thread(target=self._pipe, args=(conn, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, conn), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
