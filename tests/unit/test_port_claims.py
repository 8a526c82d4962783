"""The supervisor's claim on its workers' ports (proxy/workers/port_claims.py), with real sockets.
The kernel's rules for a second bind look at the user, not the process: the sockets of this test
stand for another process of the same user (another proxy, or anything it runs)."""

from __future__ import annotations

import socket

import pytest

from proxy.errors import BindError
from proxy.workers.port_claims import PortClaims
from tests.conftest import free_listen_port


def bound(port: int, *, reuseaddr: bool = True, reuseport: bool = False, listen: bool = True) -> socket.socket:
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, int(reuseaddr))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, int(reuseport))
        sock.bind(("127.0.0.1", port))
        if listen:
            sock.listen()
    except OSError:
        sock.close()
        raise
    return sock


@pytest.mark.parametrize(
    "other",
    [
        {"reuseaddr": True},  # as trio's listeners (one proxy process) bind
        {"reuseaddr": False},
        {"reuseaddr": True, "listen": False},
    ],
)
def test_a_claimed_port_is_taken_by_no_other_socket_even_before_a_worker_binds_it(other: dict[str, bool]) -> None:
    port = free_listen_port()
    with PortClaims() as claims:
        claims.claim("listener external", "127.0.0.1", port)
        with pytest.raises(OSError):
            bound(port, **other).close()


def test_the_workers_join_a_claimed_port_and_get_every_connection_and_it_stays_claimed_after_them() -> None:
    port = free_listen_port()
    with PortClaims() as claims:
        claims.claim("listener external", "127.0.0.1", port)
        workers = [bound(port, reuseport=True) for _ in range(2)]  # as each worker binds it
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(16)]
        accepted = 0
        for worker in workers:
            worker.setblocking(False)
            while True:
                try:
                    worker.accept()[0].close()
                except BlockingIOError:
                    break
                accepted += 1
        assert accepted == len(clients)  # none went to the claim's socket, which never listens
        for sock in [*workers, *clients]:
            sock.close()
        # Every worker gone (restarting, say): the port is still this proxy's.
        with pytest.raises(OSError):
            bound(port).close()
    bound(port).close()  # released on leaving the block


def test_a_port_in_use_is_named_and_nothing_is_held() -> None:
    port = free_listen_port()
    with bound(port, reuseport=True):  # another proxy's worker: its supervisor claimed it
        claims = PortClaims()
        with pytest.raises(BindError) as raised:
            claims.claim("listener external", "127.0.0.1", port)
    assert str(raised.value) == f"listener external: cannot listen on 127.0.0.1:{port}: Address already in use"
    bound(port).close()  # the failed claim kept no socket


def test_port_zero_claims_nothing() -> None:
    with PortClaims() as claims:
        claims.claim("admin", "127.0.0.1", 0)
        assert not claims._held
