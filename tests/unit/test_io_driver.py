"""The I/O driver (proxy/serve/driver.py) with real sockets (socketpairs) in a real trio run:
what it serves, what it hands back, and that one pass serves every ready socket."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator

import pytest
import trio
import trio.testing

from proxy.serve.driver import MORE, IODriver


@pytest.fixture
def pairs() -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    made: list[tuple[socket.socket, socket.socket]] = []
    yield made
    for a, b in made:
        a.close()
        b.close()


def pair(pairs: list[tuple[socket.socket, socket.socket]]) -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)
    pairs.append((a, b))
    return a, b


@pytest.fixture(params=["hook", "task"])
async def driver(request: pytest.FixtureRequest) -> AsyncIterator[IODriver]:
    driver = IODriver(hook=request.param == "hook")
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        assert driver.wait == request.param
        yield driver
        nursery.cancel_scope.cancel()


async def test_the_hook_is_what_runs_on_this_trio() -> None:
    """trio 0.35 keeps its epoll and run queue where the driver looks: the proxy serves from the
    hook here. A trio that moved them would make this fail (the driver then serves from a task)."""
    driver = IODriver()
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        assert driver.wait == "hook"
        nursery.cancel_scope.cancel()


async def test_a_serve_that_returns_none_stays_parked_and_is_served_again(
    driver: IODriver, pairs: list[tuple[socket.socket, socket.socket]]
) -> None:
    ours, theirs = pair(pairs)
    got: list[bytes] = []
    arrived = [trio.Event() for _ in range(3)]

    def serve(now: float, started: float) -> object:
        data = ours.recv(100)
        got.append(data)
        arrived[len(got) - 1].set()
        return "done" if data == b"last" else None

    async def send_later() -> None:
        for chunk, event in zip((b"one", b"two", b"last"), arrived, strict=True):
            theirs.send(chunk)
            with trio.fail_after(5):
                await event.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_later)
        with trio.fail_after(5):
            assert await driver.park(ours.fileno(), serve) == "done"
    assert got == [b"one", b"two", b"last"]
    assert driver.parked == 0


async def test_an_error_in_serve_is_raised_in_the_parked_task(
    driver: IODriver, pairs: list[tuple[socket.socket, socket.socket]]
) -> None:
    ours, theirs = pair(pairs)

    def serve(now: float, started: float) -> object:
        raise ConnectionResetError("gone")

    theirs.send(b"x")
    with trio.fail_after(5), pytest.raises(ConnectionResetError, match="gone"):
        await driver.park(ours.fileno(), serve)
    assert driver.parked == 0


async def test_a_cancelled_park_gives_its_socket_back(
    driver: IODriver, pairs: list[tuple[socket.socket, socket.socket]]
) -> None:
    ours, _ = pair(pairs)
    with trio.move_on_after(0.05) as scope:
        await driver.park(ours.fileno(), lambda now, started: None)
    assert scope.cancelled_caught
    assert driver.parked == 0
    # the socket can be parked again (it was unregistered from the epoll)
    with trio.move_on_after(0.01):
        await driver.park(ours.fileno(), lambda now, started: None)
    assert driver.parked == 0


async def test_more_serves_again_without_an_event(
    driver: IODriver, pairs: list[tuple[socket.socket, socket.socket]]
) -> None:
    """What TLS holds inside OpenSSL makes the socket say nothing: MORE asks for another pass."""
    ours, theirs = pair(pairs)
    calls = 0

    def serve(now: float, started: float) -> object:
        nonlocal calls
        calls += 1
        if calls == 1:
            ours.recv(1)  # one byte of the two: the second stays, but say MORE anyway
            return MORE
        return calls

    theirs.send(b"x")
    with trio.fail_after(5):
        assert await driver.park(ours.fileno(), serve) == 2


async def test_one_pass_serves_every_ready_socket(
    driver: IODriver, pairs: list[tuple[socket.socket, socket.socket]]
) -> None:
    """Sixteen sockets ready at once: served in one pass, not a wake-up each."""
    sockets = [pair(pairs) for _ in range(16)]
    served: list[int] = []
    all_served = trio.Event()

    async def parker(i: int, ours: socket.socket) -> None:
        def serve(now: float, started: float) -> object:
            ours.recv(10)
            served.append(i)
            if len(served) == 16:
                all_served.set()
            return None

        await driver.park(ours.fileno(), serve)

    async with trio.open_nursery() as nursery:
        for i, (ours, _) in enumerate(sockets):
            nursery.start_soon(parker, i, ours)
        await trio.testing.wait_all_tasks_blocked()
        assert driver.parked == 16
        before = driver.passes
        for _, theirs in sockets:
            theirs.send(b"x")
        with trio.fail_after(5):
            await all_served.wait()
        assert sorted(served) == list(range(16))
        assert driver.passes - before <= 2  # one pass (two if a send raced the first)
        nursery.cancel_scope.cancel()


async def test_a_deadline_set_in_a_pass_is_kept_on_time(pairs: list[tuple[socket.socket, socket.socket]]) -> None:
    """A serve that sets a cancel scope's deadline (a request body's timeout) from the hook: trio
    computed its wait before the pass, so without deadline_set it would sleep through it (here,
    until the outer 5 s)."""
    driver = IODriver()
    ours, theirs = pair(pairs)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        assert driver.wait == "hook"
        with trio.CancelScope() as body_deadline:

            def serve(now: float, started: float) -> object:
                ours.recv(10)
                body_deadline.deadline = now + 0.05
                driver.deadline_set()
                return None

            with trio.fail_after(5):
                await trio.testing.wait_all_tasks_blocked()  # trio waits with no deadline but the 5 s
                theirs.send(b"x")
                began = trio.current_time()
                await driver.park(ours.fileno(), serve)
        assert body_deadline.cancelled_caught
        assert trio.current_time() - began < 1.0
        nursery.cancel_scope.cancel()
