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
  blocking  no trio wake-up for a socket: the forwarder is served from trio's
            ``before_io_wait`` instrument hook; when trio has nothing to run it blocks in its
            own ``epoll.poll``, which also holds trio's epoll fd, serving sockets as they
            become ready, until trio's fd is ready or trio's timeout passes. Trio's epoll fd
            is private (trio 0.35: ``runner.io_manager._epoll``)

Like the epoll forwarder, it connects to the broker with a blocking ``connect`` (loopback;
only established connections are measured), where it serves sockets.

    python bench/trio_epoll_forwarder.py --listen 127.0.0.1:9093 --upstream 127.0.0.1:9092
"""

from __future__ import annotations

import gc
import select
import time

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


class IdleWait(trio.abc.Instrument):
    """The ``blocking`` variant: the forwarder is served from trio's ``before_io_wait`` hook,
    the one point where trio itself knows whether any task is runnable.

    Runnable tasks (timeout 0): one pass of what is ready, no wait. Nothing runnable: block in
    our own epoll, which also holds trio's epoll fd, serving sockets as they become ready,
    until trio's fd is ready or trio's timeout (its next deadline) passes; then return, and
    trio's own ``epoll_wait`` finds its events at once. No task wakes for a socket."""

    def __init__(self, forwarder: Forwarder) -> None:
        from trio._core._run import GLOBAL_RUN_CONTEXT  # private: this thread's trio runner

        self.forwarder = forwarder
        self.trio_fd = GLOBAL_RUN_CONTEXT.runner.io_manager._epoll.fileno()
        self.token = trio.lowlevel.current_trio_token()
        forwarder.epoll.register(self.trio_fd, select.EPOLLIN)

    def before_io_wait(self, timeout: float) -> None:
        poll, serve, trio_fd = self.forwarder.epoll.poll, self.forwarder.serve, self.trio_fd
        if timeout <= 0:
            serve(poll(0, BUDGET))  # trio's fd among them is no socket: serve skips it
            return
        deadline = time.monotonic() + timeout
        while True:
            ready = poll(timeout)
            serve(ready)
            if any(fd == trio_fd for fd, _ in ready):
                return
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                # trio's epoll_wait would now wait its whole timeout again: end it at once
                self.token.run_sync_soon(_nothing)
                return


def _nothing() -> None:
    pass


async def serve_idle_wait(forwarder: Forwarder) -> None:
    instrument = IdleWait(forwarder)
    trio.lowlevel.add_instrument(instrument)
    try:
        await trio.sleep_forever()
    finally:
        trio.lowlevel.remove_instrument(instrument)


async def run(forwarder: Forwarder, variant: str) -> None:
    async with trio.open_nursery() as nursery:  # the I/O driver lives in a nursery, as the proxy's would
        if variant == "pass":
            nursery.start_soon(serve_passes, forwarder)
        elif variant == "budget":
            nursery.start_soon(serve_passes, forwarder, BUDGET)
        else:
            nursery.start_soon(serve_idle_wait, forwarder)


def main() -> None:
    args = parse_args(variants=("pass", "budget", "blocking"))
    if args.gc_freeze:
        gc.freeze()
    # SIGTERM (how the benchmarks stop it) ends the process at once: nothing to clean up
    trio.run(run, Forwarder(args.listen, args.upstream), args.variant)


if __name__ == "__main__":
    main()
