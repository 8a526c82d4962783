"""The I/O driver: one ``select.epoll`` for the established connections' sockets, served in
passes, so that one trio wake-up, or none, serves every socket that is ready, instead of a
task wake-up per ready socket (issue 28; bench/RESULTS.md, "The choice for the proxy's I/O
driver").

A connection's pump does not wait on its socket itself: it parks its direction here
(:meth:`IODriver.park`: the socket registered, the pump's task asleep). When the socket is
ready, the driver calls the direction's ``serve`` within its pass. ``serve`` reads, hands the
bytes to the sans-I/O core and carries out the common case itself (a lone Forward or Answer
that the other socket takes whole); it returns None to stay parked. Anything else (a send the
kernel took only in part, a pool wait, a hook, a close, an error) it returns, or raises, and
the driver hands that back to the pump: its task wakes with it, carries it out as before,
and parks again. So the data path's common case costs no task switch, and every rare case
keeps running in its connection's own task, under its cancel scopes.

How the driver waits (chosen at start, :attr:`IODriver.wait`):

  ``hook``  served from trio's ``before_io_wait`` instrument hook, the one point where trio
            knows whether a task is runnable. Tasks runnable: one pass of what is ready.
            None: it blocks in its own epoll, which also holds trio's, serving sockets as
            they become ready, until trio's fd is ready, trio's timeout passes or a pass made
            a task runnable (then it ends trio's own wait at once). Needs trio's epoll and
            run queue where trio 0.35 keeps them (private).
  ``task``  otherwise: a task waits on the epoll fd with ``wait_readable`` and serves what is
            ready, at most ``BUDGET`` events a pass, then lets other tasks run.
"""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Callable
from time import perf_counter
from typing import Any

import outcome
import trio

log = logging.getLogger("kafka_admission_proxy.driver")

BUDGET = 64  # events per pass: no other task waits behind more than this many
BUSY_POLL_S = 100e-6  # while tasks keep trio busy, how often the hook looks at the sockets

# What a direction's serve returns: None (stay parked), MORE (stay, and serve again in the next
# pass: bytes wait inside the transport, where the socket does not report them), or anything
# else, which wakes the pump with it.
MORE = object()

# A direction's serve is called with the pass's time: trio's clock (the policies' clock) and
# perf_counter's (the added-latency clock), read once per pass, not once per socket.
Serve = Callable[[float, float], object]


class IODriver:
    """One per process (the server's): two would each block in their own epoll in the hook.
    ``hook=False`` serves from a task even where the hook would work."""

    def __init__(self, *, hook: bool = True) -> None:
        self._hook = hook
        self.passes = 0  # passes that had events to serve (tests count wake-ups by it)
        self._epoll = select.epoll()
        self._parked: dict[int, tuple[trio.lowlevel.Task, Serve]] = {}
        self._again: list[int] = []  # parked fds to serve in the next pass without an event
        self.wait = "task"
        self._runner: Any = None
        self._trio_fd = -1
        self._trio_ready = False  # trio's own epoll had events in the last pass
        self._deadline_set = False  # a serve set a trio deadline: trio must look again before waiting
        self._next_busy_poll = 0.0
        self._token: trio.lowlevel.TrioToken | None = None
        self._now: Callable[[], float] = trio.current_time

    # -- the pumps' side -----------------------------------------------------------------

    async def park(self, fd: int, serve: Serve) -> object:
        """Sleep until ``serve`` hands something back (or raises) when ``fd`` was readable."""
        self._epoll.register(fd, select.EPOLLIN)
        self._parked[fd] = (trio.lowlevel.current_task(), serve)

        def abort(_: object) -> trio.lowlevel.Abort:  # cancelled: the pump takes its socket back
            self._unpark(fd)
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)

    def _unpark(self, fd: int) -> None:
        if self._parked.pop(fd, None) is not None:
            self._epoll.unregister(fd)

    def deadline_set(self) -> None:
        """A serve set a cancel scope's deadline: trio computed its wait before, so the hook ends
        that wait for trio to see the new deadline (a task's serve needs nothing)."""
        self._deadline_set = True

    @property
    def parked(self) -> int:
        return len(self._parked)

    # -- serving ------------------------------------------------------------------------

    def _serve(self, ready: list[tuple[int, int]]) -> None:
        if not ready and not self._again:
            return
        parked = self._parked
        self.passes += 1
        now, started = self._now(), perf_counter()
        if self._again:
            again, self._again = self._again, []
            ready = [*((fd, select.EPOLLIN) for fd in again), *ready]
        for fd, _ in ready:
            entry = parked.get(fd)
            if entry is None:
                if fd == self._trio_fd:
                    self._trio_ready = True
                continue  # or handed back earlier in this pass
            task, serve = entry
            try:
                result = serve(now, started)
            except Exception as exc:  # the pump meets it as if its own call had raised
                self._hand_back(fd, task, outcome.Error(exc))
                continue
            if result is None:
                continue
            if result is MORE:
                if fd not in self._again:
                    self._again.append(fd)
                continue
            self._hand_back(fd, task, outcome.Value(result))

    def _hand_back(self, fd: int, task: trio.lowlevel.Task, result: outcome.Outcome[object]) -> None:
        self._unpark(fd)
        trio.lowlevel.reschedule(task, result)

    # -- waiting ------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve parked sockets until cancelled (start it before any connection parks)."""
        runner = _trio_runner() if self._hook else None
        if runner is None:
            log.debug("I/O driver serves from a task")
            task_status.started()
            await self._serve_from_task()
            return
        self.wait = "hook"
        self._runner = runner
        self._trio_fd = runner.io_manager._epoll.fileno()
        self._now = runner.clock.current_time  # trio.current_time without its wrappers
        self._token = trio.lowlevel.current_trio_token()
        self._epoll.register(self._trio_fd, select.EPOLLIN)
        instrument = _IdleWait(self)
        trio.lowlevel.add_instrument(instrument)
        log.debug("I/O driver serves from trio's before_io_wait hook")
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            trio.lowlevel.remove_instrument(instrument)
            self._epoll.unregister(self._trio_fd)

    async def _serve_from_task(self) -> None:
        poll, fd = self._epoll.poll, self._epoll.fileno()
        while True:
            ready = poll(0, BUDGET)
            self._serve(ready)
            if len(ready) == BUDGET or self._again:
                await trio.lowlevel.checkpoint()  # more may be ready: let other tasks run first
            else:
                await trio.lowlevel.wait_readable(fd)

    def before_io_wait(self, timeout: float) -> None:
        poll, runq = self._epoll.poll, self._runner.runq
        if timeout <= 0:
            # Tasks to run: a look at the sockets, at most every BUSY_POLL_S (a scheduler batch
            # is a few microseconds; an epoll_wait each would be a good share of it).
            clock = time.monotonic()
            if self._again or clock >= self._next_busy_poll:
                self._next_busy_poll = clock + BUSY_POLL_S
                self._serve(poll(0, BUDGET))
            self._deadline_set = False  # trio does not wait: it reads its deadlines again first
            return
        if not self._parked:
            return  # nothing to serve: trio waits in its own epoll
        self._next_busy_poll = 0.0
        deadline = time.monotonic() + timeout
        self._trio_ready = False
        while True:
            self._serve(poll(0 if self._again else timeout, BUDGET))
            if runq or self._deadline_set:
                self._deadline_set = False
                self._end_trio_wait()  # trio would wait its whole timeout before running them
                return
            if self._trio_ready:
                return  # trio's own wait finds its events at once
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                self._end_trio_wait()  # trio's wait would now last its whole timeout again
                return

    def _end_trio_wait(self) -> None:
        assert self._token is not None
        self._token.run_sync_soon(_nothing)


class _IdleWait(trio.abc.Instrument):
    """The driver's ``before_io_wait``, guarded: trio drops an instrument that raises, and the
    proxy would stop serving every parked socket with it."""

    def __init__(self, driver: IODriver) -> None:
        self._driver = driver

    def before_io_wait(self, timeout: float) -> None:
        try:
            self._driver.before_io_wait(timeout)
        except Exception:
            log.exception("the I/O driver failed a pass; serving again at the next one")


def _trio_runner() -> Any:
    """trio's runner when its epoll and run queue are where trio 0.35 keeps them, else None."""
    try:
        from trio._core._run import GLOBAL_RUN_CONTEXT  # private

        runner = GLOBAL_RUN_CONTEXT.runner
        runner.io_manager._epoll.fileno()
        len(runner.runq)
        runner.clock.current_time()
    except Exception:
        return None
    return runner


def _nothing() -> None:
    pass
