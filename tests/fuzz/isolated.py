"""Runs fuzz cases in forked children, so a case that kills the process (a
native decoder aborting when an allocation fails) is caught and named, and the
run goes on with the next case.

Each child runs cases ``start..count`` under an address-space limit (the
parent's size plus ``headroom``): a decoder that tries to allocate far beyond
the frame it was given fails the same way on every machine, instead of only
where the allocation exceeds RAM. Before each case the child writes its index
to shared memory; when a child dies, that index is the case that killed it.
"""

from __future__ import annotations

import faulthandler
import mmap
import os
import resource
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Outcome:
    cases: int = 0
    seconds: float = 0.0
    escapes: list[tuple[int, str]] = field(default_factory=list)  # (case, what escaped)
    aborts: list[tuple[int, str]] = field(default_factory=list)  # (case, how the child died)
    max_rss_kib: int = 0


def _vm_size_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def _child(
    start: int,
    count: int,
    run_case: Callable[[int], str | None],
    progress: mmap.mmap,
    out: int,
    limit: int,
    stderr_path: str,
) -> None:
    faulthandler.disable()  # pytest's handler would dump a traceback per abort into the test output
    fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)  # a native abort's message goes to a file, not the test output
    os.environ["RUST_BACKTRACE"] = "0"  # a symbolized backtrace per abort would cost a second each
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    with os.fdopen(out, "w") as report:
        for i in range(start, count):
            progress[:8] = i.to_bytes(8, "little")
            problem = run_case(i)
            if problem is not None:
                report.write(f"{i}\t{problem.replace(chr(10), ' ')}\n")
        report.write(f"rss\t{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\n")


def run_isolated(count: int, run_case: Callable[[int], str | None], *, headroom: int = 1 << 30) -> Outcome:
    """Run ``run_case(i)`` for i in 0..count-1; it returns None, or what went wrong."""
    outcome = Outcome(cases=count)
    started = time.monotonic()
    progress = mmap.mmap(-1, 8)
    limit = _vm_size_bytes() + headroom
    start = 0
    with tempfile.TemporaryDirectory() as tmp:
        stderr_path = os.path.join(tmp, "child.stderr")
        while start < count:
            progress[:8] = start.to_bytes(8, "little")
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                os.close(read_end)
                try:
                    _child(start, count, run_case, progress, write_end, limit, stderr_path)
                finally:
                    os._exit(0)
            os.close(write_end)
            with os.fdopen(read_end) as report:
                lines = report.read().splitlines()
            _, status = os.waitpid(pid, 0)
            for line in lines:
                what, _, detail = line.partition("\t")
                if what == "rss":
                    outcome.max_rss_kib = max(outcome.max_rss_kib, int(detail))
                else:
                    outcome.escapes.append((int(what), detail))
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and lines and lines[-1].startswith("rss"):
                break
            dead_at = int.from_bytes(progress[:8], "little")
            first_line = Path(stderr_path).read_text(errors="replace").strip().splitlines()[:1]
            how = signal.Signals(os.WTERMSIG(status)).name if os.WIFSIGNALED(status) else f"exit {status}"
            outcome.aborts.append((dead_at, f"{how}: {first_line[0] if first_line else 'no message'}"))
            start = dead_at + 1
    outcome.seconds = time.monotonic() - started
    return outcome
