"""The supervisor-worker link (proxy/workers/link.py) over a real Unix socket pair."""

from __future__ import annotations

import socket
from types import MappingProxyType

import pytest
import trio

from policies.decision import Action, Decision, Policy
from policies.mode import Mode
from proxy.serve.driver import IODriver
from proxy.workers.link import Link, LinkClosed, RemoteError


async def test_ask_gets_the_handlers_answer_and_tells_arrive_in_order() -> None:
    owner, worker = Link.pair()
    seen: list[object] = []
    owner.handlers["closed"] = seen.append
    owner.handlers["open"] = lambda conn_id: (seen.append(("open", conn_id)), f"admit {conn_id}")[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(owner.run)
        nursery.start_soon(worker.run)
        worker.tell("closed", "c1")
        assert await worker.ask("open", "c2") == "admit c2"
        assert seen == ["c1", ("open", "c2")]  # the close told first is applied first
        nursery.cancel_scope.cancel()


async def test_an_async_handler_does_not_hold_up_other_messages() -> None:
    owner, worker = Link.pair()
    release = trio.Event()

    async def slow() -> str:
        await release.wait()
        return "late"

    owner.handlers["slow"] = slow
    owner.handlers["fast"] = lambda: "fast"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(owner.run)
        nursery.start_soon(worker.run)
        answers: list[str] = []
        answered = trio.Event()

        async def ask_slow() -> None:
            answers.append(await worker.ask("slow"))
            answered.set()

        nursery.start_soon(ask_slow)
        assert await worker.ask("fast") == "fast"
        assert answers == []
        release.set()
        with trio.fail_after(5):
            await answered.wait()
        assert answers == ["late"]
        nursery.cancel_scope.cancel()


async def test_tells_queued_beyond_what_the_socket_takes_are_all_sent_before_sent_returns() -> None:
    """A worker's last tells before it exits: more than the socket takes at once wait in the
    link's queue; once ``sent`` returns, ending the link loses none of them."""
    worker, owner = Link.pair()
    seen: list[int] = []
    owner.handlers["closed"] = lambda n, _padding: seen.append(n)
    padding = b"x" * 4096
    async with trio.open_nursery() as nursery:
        nursery.start_soon(owner.run)
        async with trio.open_nursery() as sending:
            sending.start_soon(worker.run)
            for n in range(1000):  # 4 MB: the socket pair's buffers take far less
                worker.tell("closed", n, padding)
            await worker.sent()
            sending.cancel_scope.cancel()  # the worker's link ends, its socket closed
        await owner.closed.wait()  # read to the end
    assert seen == list(range(1000))


async def test_a_raising_handler_is_a_remote_error_and_an_unknown_kind_too() -> None:
    owner, worker = Link.pair()

    def broken() -> None:
        raise ValueError("bad cap")

    owner.handlers["broken"] = broken
    async with trio.open_nursery() as nursery:
        nursery.start_soon(owner.run)
        nursery.start_soon(worker.run)
        with pytest.raises(RemoteError, match="ValueError: bad cap"):
            await worker.ask("broken")
        with pytest.raises(RemoteError, match="no handler for 'nope'"):
            await worker.ask("nope")
        nursery.cancel_scope.cancel()


async def test_a_pending_ask_fails_when_the_peer_goes_away() -> None:
    owner, worker = Link.pair()
    never = trio.Event()

    async def hang() -> None:
        await never.wait()

    owner.handlers["hang"] = hang
    async with trio.open_nursery() as nursery:
        owner_scope = trio.CancelScope()

        async def run_owner() -> None:
            with owner_scope:
                await owner.run()

        nursery.start_soon(run_owner)
        nursery.start_soon(worker.run)
        failures: list[BaseException] = []
        failed = trio.Event()

        async def ask() -> None:
            try:
                await worker.ask("hang")
            except LinkClosed as exc:
                failures.append(exc)
                failed.set()

        nursery.start_soon(ask)
        await trio.sleep(0.05)
        owner_scope.cancel()  # the owner's end closes, as when its process dies
        with trio.fail_after(5):
            await worker.closed.wait()
            await failed.wait()
        assert isinstance(failures[0], LinkClosed)
        with pytest.raises(LinkClosed):
            await worker.ask("hang")


async def test_a_decision_crosses_the_link_with_its_mappings_read_only() -> None:
    """Every Decision holds mappingproxies (its default element errors and subject), which pickle
    refuses by itself: a refusal must still reach the worker that asked."""
    owner, worker = Link.pair()
    refusal = Decision(
        Policy.GROUP_SIZE,
        Action.REFUSE,
        Mode.ENFORCE,
        "group.max.size",
        "group.max.size=2 reached",
        limit=2,
        error_code=81,
        subject=MappingProxyType({"group_id": "g"}),
    )
    owner.handlers["decide"] = lambda: refusal
    async with trio.open_nursery() as nursery:
        nursery.start_soon(owner.run)
        nursery.start_soon(worker.run)
        answer = await worker.ask("decide")
        assert answer == refusal
        assert isinstance(answer.element_errors, MappingProxyType) and isinstance(answer.subject, MappingProxyType)
        nursery.cancel_scope.cancel()


async def test_a_link_read_by_the_io_driver_answers_asks_and_keeps_the_order_of_tells() -> None:
    """A worker's link is read within its I/O driver's pass: answers go straight to the asking
    task; tells and asks of its own handlers run in the link's task, in the order they came."""
    owner, worker = Link.pair()
    driver = IODriver()
    seen: list[object] = []
    owner.handlers["open"] = lambda conn_id: f"admit {conn_id}"
    worker.handlers["close"] = seen.append
    worker.handlers["idle"] = lambda: len(seen)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        nursery.start_soon(owner.run)
        nursery.start_soon(worker.run, driver)
        assert [await worker.ask("open", f"c{i}") for i in range(3)] == ["admit c0", "admit c1", "admit c2"]
        owner.tell("close", "c1")
        owner.tell("close", "c2")
        assert await owner.ask("idle") == 2  # asked of the worker: after both tells, in order
        assert seen == ["c1", "c2"]
        assert driver.passes > 0  # read in the driver's passes, not by a task of its own
        nursery.cancel_scope.cancel()


async def test_a_link_read_by_the_io_driver_ends_when_the_peer_closes() -> None:
    owner, worker = Link.pair()
    driver = IODriver()
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        nursery.start_soon(worker.run, driver)
        await owner._stream.aclose()  # the supervisor's end goes away
        with trio.fail_after(5):
            await worker.closed.wait()
        with pytest.raises(LinkClosed):
            await worker.ask("open", "c1")
        nursery.cancel_scope.cancel()


def test_the_first_message_is_read_alone_before_the_link_runs() -> None:
    a, b = socket.socketpair()
    with a, b:
        sender = Link(trio.SocketStream(trio.socket.from_stdlib_socket(a)))
        sender.tell("worker.start", 3, {"config": True}, [])
        sender.tell("worker.reload", 4, {"config": False})  # stays in the socket for the link
        assert Link.first_message(b) == ("worker.start", (3, {"config": True}, []))
        assert b.recv(4) != b""  # the next message was not taken with it
