"""Under trio's floor (issue 28): ``bench/epoll_forwarder.py``'s framed forwarding driven by
one trio task that owns the ``select.epoll`` object, so a trio wake-up serves every socket
that is ready at once instead of one socket per wake-up (the ``trio-epoll`` paths of
``bench/concurrency.py`` and ``bench/proxy_vs_direct.py``).

The sockets, the frames and the forwarding are the epoll forwarder's own (``Forwarder``:
non-blocking sockets registered once, level-triggered; ``recv_into`` and ``send`` directly;
a send the kernel cannot take whole registers EPOLLOUT for that socket and stops reading the
other side). Only the wait differs, per ``--variant``:

  pass      ``await trio.lowlevel.wait_readable(epoll_fd)``, then ``epoll.poll(0)`` and serve
            every ready event in one pass; wait again
  budget    the same, at most 64 events a pass; a full pass (more may be ready) ends in a
            ``trio.lowlevel.checkpoint()`` (other tasks run) and polls again without waiting
  blocking  no trio wake-up while trio has nothing else to do: the task blocks in its own
            ``epoll.poll``, which also holds trio's epoll fd and times out at trio's next
            deadline; when trio's fd is ready or a task is runnable it checkpoints. It reads
            trio's run queue, deadlines and epoll object, which are private (trio 0.35)

Like the epoll forwarder, it connects to the broker with a blocking ``connect`` (loopback;
only established connections are measured), in the same task.

    python bench/trio_epoll_forwarder.py --listen 127.0.0.1:9093 --upstream 127.0.0.1:9092
"""

from __future__ import annotations

import gc
import math
import select

import trio
from epoll_forwarder import Forwarder
from floor_forwarder import parse_args

BUDGET = 64  # events per pass of the ``budget`` variant


async def serve_passes(forwarder: Forwarder, budget: int = -1) -> None:
    """Wait for the epoll fd through trio; serve what is ready, ``budget`` events a pass (-1: all)."""
    epoll_fd, poll, serve = forwarder.epoll.fileno(), forwarder.epoll.poll, forwarder.serve
    wait_readable, checkpoint = trio.lowlevel.wait_readable, trio.lowlevel.checkpoint
    while True:
        ready = poll(0, budget)
        serve(ready)
        if len(ready) == budget:
            await checkpoint()  # more may be ready: let other tasks run first
        else:
            await wait_readable(epoll_fd)


async def serve_blocking(forwarder: Forwarder) -> None:
    """Block in our own ``epoll.poll`` while trio has nothing to run; checkpoint when it has."""
    from trio._core._run import GLOBAL_RUN_CONTEXT  # private: the runner of this thread

    runner = GLOBAL_RUN_CONTEXT.runner
    trio_fd = runner.io_manager._epoll.fileno()
    forwarder.epoll.register(trio_fd, select.EPOLLIN)
    poll, serve, checkpoint = forwarder.epoll.poll, forwarder.serve, trio.lowlevel.checkpoint
    runq, deadlines, clock = runner.runq, runner.deadlines, runner.clock
    while True:
        if runq:
            await checkpoint()
            continue
        deadline = deadlines.next_deadline()
        timeout = -1.0 if deadline == math.inf else max(0.0, deadline - clock.current_time())
        ready = poll(timeout)
        if any(fd == trio_fd for fd, _ in ready):
            serve([event for event in ready if event[0] != trio_fd])
            await checkpoint()  # trio polls its own epoll (timeout 0: we are runnable) and runs its tasks
        elif ready:
            serve(ready)
        else:
            await checkpoint()  # trio's deadline passed


async def run(forwarder: Forwarder, variant: str) -> None:
    async with trio.open_nursery() as nursery:  # the I/O driver lives in a nursery, as the proxy's would
        if variant == "pass":
            nursery.start_soon(serve_passes, forwarder)
        elif variant == "budget":
            nursery.start_soon(serve_passes, forwarder, BUDGET)
        else:
            nursery.start_soon(serve_blocking, forwarder)


def main() -> None:
    args = parse_args(variants=("pass", "budget", "blocking"))
    if args.gc_freeze:
        gc.freeze()
    # SIGTERM (how the benchmarks stop it) ends the process at once: nothing to clean up
    trio.run(run, Forwarder(args.listen, args.upstream), args.variant)


if __name__ == "__main__":
    main()
