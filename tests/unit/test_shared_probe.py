"""proxy.serve.server.SharedProbe: one upstream probe at a time, its answer kept a second
(trio's MockClock: virtual time, no wall-clock bounds)."""

from __future__ import annotations

import trio
import trio.testing

from proxy.serve.server import SharedProbe


def run(test: object) -> None:
    trio.run(test, clock=trio.testing.MockClock(autojump_threshold=0))  # type: ignore[arg-type]


def test_concurrent_callers_share_one_probe_and_its_answer_for_the_ttl() -> None:
    probes: list[float] = []

    async def probe() -> str | None:
        probes.append(trio.current_time())
        await trio.sleep(0.5)
        return f"answer {len(probes)}"

    async def test() -> None:
        shared = SharedProbe(probe, ttl=1.0)
        answers: list[str | None] = []

        async def ask() -> None:
            answers.append(await shared())

        async with trio.open_nursery() as nursery:
            for _ in range(100):
                nursery.start_soon(ask)
        assert probes == [0.0] and answers == ["answer 1"] * 100
        await trio.sleep(0.9)  # 0.4 s after the answer: still fresh
        assert await shared() == "answer 1" and len(probes) == 1
        await trio.sleep(0.2)
        assert await shared() == "answer 2" and len(probes) == 2

    run(test)


def test_a_cancelled_prober_leaves_the_waiters_to_probe_again() -> None:
    probes = 0

    async def probe() -> str | None:
        nonlocal probes
        probes += 1
        await trio.sleep(1.0)
        return None

    async def test() -> None:
        shared = SharedProbe(probe, ttl=1.0)
        answers: list[str | None] = []

        async def ask() -> None:
            answers.append(await shared())

        async with trio.open_nursery() as nursery:
            first = trio.CancelScope()

            async def hangs_up() -> None:
                with first:  # its caller goes away (an HTTP client hung up)
                    await shared()

            nursery.start_soon(hangs_up)
            await trio.sleep(0.1)
            nursery.start_soon(ask)
            nursery.start_soon(ask)
            await trio.sleep(0.1)
            assert probes == 1  # the two wait on the one in flight
            first.cancel()
        assert probes == 2 and answers == [None, None]  # one of them probed again, for both

    run(test)
