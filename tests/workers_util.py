"""Tests of ``workers: N``: start the proxy with N worker processes, and tell which worker
served each connection from the proxy's own record, so a spread over workers is seen,
not assumed.

A worker logs every connection it accepts (at DEBUG) with its connection id, prefixed
``w<index>:``, the client's address and its index::

    ... connection accepted conn_id=w1:external-3 peer=127.0.0.1:40712 worker=1

``start_workers`` runs the proxy at DEBUG so those lines are written; ``worker_of(proxy,
conn)`` waits for the line of a client socket (a ``RawConnection`` or a socket) and
returns the worker's index. ``worker_pids`` gives each worker's current process id (from
the supervisor's ``worker <i> serving pid=...`` lines), to SIGKILL one.
"""

from __future__ import annotations

import re
import socket
from typing import Any

from tests.conftest import ProxyProcess, wait_until

_ACCEPTED = re.compile(r"connection accepted conn_id=w(\d+):\S+ peer=(\S+) worker=(\d+)")
_SERVING = re.compile(r"supervisor worker (\d+) serving pid=(\d+)")


def start_workers(start_proxy: Any, bootstrap: str | list[str], workers: int, **kwargs: Any) -> ProxyProcess:
    """``start_proxy`` with ``workers: N`` and the DEBUG log that names each connection's worker."""
    extra = kwargs.pop("extra_args", None) or []
    proxy: ProxyProcess = start_proxy(bootstrap, workers=workers, extra_args=["--log-level", "DEBUG", *extra], **kwargs)
    return proxy


def served_by(proxy: ProxyProcess) -> dict[str, int]:
    """Client address (``host:port``) to the index of the worker that accepted it (the last
    connection from that address, should a port be used again)."""
    found = {}
    for conn_worker, peer, worker in _ACCEPTED.findall(proxy.log()):
        assert conn_worker == worker, f"connection id w{conn_worker}: logged by worker {worker}"
        found[peer] = int(worker)
    return found


def client_address(conn: Any) -> str:
    """``host:port`` of the client end of a RawConnection or a socket."""
    sock: socket.socket = getattr(conn, "sock", conn)
    host, port = sock.getsockname()[:2]
    return f"{host}:{port}"


def worker_of(proxy: ProxyProcess, conn: Any, timeout: float = 5.0) -> int:
    """The index of the worker that accepted this client connection."""
    address = client_address(conn)
    wait_until(lambda: address in served_by(proxy), timeout=timeout)
    return served_by(proxy)[address]


def worker_pids(proxy: ProxyProcess) -> dict[int, int]:
    """Each worker's current process id."""
    return {int(index): int(pid) for index, pid in _SERVING.findall(proxy.log())}
