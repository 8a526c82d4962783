"""TlsTransport.handshake with ``turns`` (max.ssl.handshakes.per.turn): real TLS handshakes
over socket pairs, clients in threads. A trio instrument counts the event loop's turns (one
per I/O wait), and the server's SNI callback (run inside OpenSSL's first handshake step, the
one that signs) notes the turn it ran in. Without turns every ready ClientHello is computed
in one turn, which is what holds up the established connections; with turns at most that
many are."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections import Counter

import pytest
import trio
import trustme

from proxy.links.transport import TlsTransport

CLIENTS = 12


@pytest.fixture(scope="module")
def contexts(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client


def first_steps_per_turn(contexts: tuple[ssl.SSLContext, ssl.SSLContext], turns: int | None) -> Counter[int]:
    server_context, client_context = contexts
    pairs = [socket.socketpair() for _ in range(CLIENTS)]
    done: list[bool] = []

    def client(sock: socket.socket) -> None:
        with client_context.wrap_socket(sock, server_hostname="localhost") as tls:
            done.append(True)
            tls.recv(1)  # until the server closes

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for _, c in pairs]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while not all(_ready(s) for s, _ in pairs):
        assert time.monotonic() < deadline, "the ClientHellos did not arrive"
        time.sleep(0.01)  # every ClientHello is in before the server reads one

    turns_run = _Turns()
    steps: Counter[int] = Counter()

    def on_sni(sock: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
        steps[turns_run.count] += 1

    server_context.sni_callback = on_sni  # type: ignore[assignment]

    async def main() -> None:
        limiter = trio.CapacityLimiter(turns) if turns is not None else None

        async def serve(sock: socket.socket) -> None:
            sock.setblocking(False)
            transport = await TlsTransport.handshake(sock, server_context, server_side=True, turns=limiter)
            await transport.aclose()

        async with trio.open_nursery() as servers:
            for s, _ in pairs:
                servers.start_soon(serve, s)

    trio.run(main, instruments=[turns_run])
    for thread in threads:
        thread.join(10)
    assert len(done) == CLIENTS  # every handshake completed
    return steps


class _Turns(trio.abc.Instrument):
    """Counts the scheduler's turns: one I/O wait each."""

    def __init__(self) -> None:
        self.count = 0

    def after_io_wait(self, timeout: float) -> None:
        self.count += 1


def _ready(sock: socket.socket) -> bool:
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return False


def test_without_turns_every_ready_handshake_is_computed_in_one_turn(contexts) -> None:  # type: ignore[no-untyped-def]
    steps = first_steps_per_turn(contexts, None)
    assert sum(steps.values()) == CLIENTS and max(steps.values()) == CLIENTS


@pytest.mark.parametrize("turns", [1, 4])
def test_with_turns_at_most_that_many_handshakes_are_computed_in_one_turn(contexts, turns: int) -> None:  # type: ignore[no-untyped-def]
    steps = first_steps_per_turn(contexts, turns)
    assert sum(steps.values()) == CLIENTS and max(steps.values()) == turns
