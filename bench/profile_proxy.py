"""Where the proxy's CPU goes under load: a py-spy profile of the process in the middle of a
path (by default ``proxy-all``: every policy on, audit on), summarised as the functions
with the largest share of samples (issue 15's "before" and "after" profiles).

The path is started as ``bench/proxy_vs_direct.py`` starts it (its own Tansu
broker, the proxy's ``run`` CLI with bench/proxy-all.yaml). While this script
drives load through it, ``py-spy record --format raw --nonblocking`` samples
the middle process for ``--seconds``:

  latency     single-record acks=1 produce round trips, one after the other
  throughput  pipelined produce of 1 KB records (acks=all, linger.ms=5)
  mixed       both, alternating every 2,000 round trips / 50,000 records

Then it prints, as Markdown: the top functions by *self* share (the deepest
frame of a sample: where the CPU was), the top functions by *total* share (on
the stack at all), the top lines and files, and the py-spy command used. py-spy samples wall-clock time
and counts a thread blocked in ``epoll_wait`` as active: samples whose
deepest frame is the event loop's wait, and those inside trio's socket
system calls (where, on a loaded machine, the process mostly waits for a CPU
after its send woke the receiving process), are counted apart; the tables
give shares of the rest, the Python work. The raw profile is kept with
``--keep DIR`` (``py-spy`` folded stacks: input for flamegraph tools).

    .venv/bin/python bench/profile_proxy.py                           # proxy-all, mixed, 20 s
    .venv/bin/python bench/profile_proxy.py --load latency --path floor
    make profile                                                       # the same as the first line
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from harness import BenchError, load_average
from proxy_vs_direct import Endpoint, measure_latency, measure_throughput, middle_paths, started

FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
# py-spy counts a thread blocked in epoll_wait as active: samples whose deepest frame is the
# event loop's wait are counted apart, as waiting, and the tables give shares of the rest.
WAITING = ("EpollIOManager.get_events (trio/_core/_io_epoll.py)", "epoll.poll")
# The frame from which trio's sockets enter the kernel (send, recv): counted apart too. py-spy
# samples wall-clock time, so this share also holds the time the process waited for a CPU
# after a send woke the receiving process (on a loaded machine, most of it).
SOCKET_CALL = "_SocketType._nonblocking_helper (trio/_socket.py)"


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise BenchError("py-spy is not installed (make profile installs it; or .venv/bin/pip install py-spy)")
    return found


def short_file(path: str) -> str:
    """``.../site-packages/trio/_core/_run.py`` -> ``trio/_core/_run.py``; project files from the root."""
    for marker in ("site-packages/", "/lib/python3.11/"):
        if marker in path:
            return path.split(marker, 1)[1]
    for top in ("/proxy/", "/policies/", "/bench/"):
        if top in path:
            return top.lstrip("/") + path.split(top, 1)[1]
    return path


def parse_raw(text: str) -> tuple[Counter[str], Counter[str], Counter[str], Counter[str], Counter[str]]:
    """(self by function, total by function, self by line, self by file, samples by kind:
    waiting, socket calls, the rest) from py-spy's raw output; the first four count the rest."""
    by_file: Counter[str] = Counter()
    by_self: Counter[str] = Counter()
    by_total: Counter[str] = Counter()
    by_line: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = []
        for frame in stack.split(";"):
            match = FRAME.match(frame)
            if match:  # skips the process and thread entries
                frames.append((match["function"], short_file(match["file"]), match["line"]))
        if not frames:
            continue
        function, file, lineno = frames[-1]
        leaf = f"{function} ({file})"
        if leaf in WAITING or function in WAITING:
            kinds["waiting"] += count
            continue
        if leaf == SOCKET_CALL and lineno == _socket_call_line():
            kinds["socket calls"] += count
            continue
        kinds["rest"] += count
        by_file[file] += count
        by_self[f"{function} ({file})"] += count
        by_line[f"{file}:{lineno} ({function})"] += count
        for key in {f"{f} ({p})" for f, p, _ in frames}:
            by_total[key] += count
    return by_self, by_total, by_line, by_file, kinds


def _socket_call_line() -> str:
    """The line of trio's ``_nonblocking_helper`` that makes the system call."""
    import inspect

    from trio._socket import _SocketType

    lines, first = inspect.getsourcelines(_SocketType._nonblocking_helper)
    for offset, text in enumerate(lines):
        if "return fn(self._sock" in text:
            return str(first + offset)
    return ""


def top(counter: Counter[str], samples: int, n: int, title: str) -> str:
    rows = [f"| {title} | share of samples |", "|---|---:|"]
    rows += [f"| `{key}` | {count / samples:.1%} |" for key, count in counter.most_common(n)]
    return "\n".join(rows)


def drive(endpoint: Endpoint, load: str, until: float) -> tuple[int, int]:
    """Load through the path until ``until`` (monotonic); (round trips, records produced)."""
    payload = random.randbytes(1024)
    round_trips = records = 0
    while time.monotonic() < until:
        if load in ("latency", "mixed"):
            measure_latency(endpoint, payload, 2000 if load == "mixed" else 500, 0)
            round_trips += 2000 if load == "mixed" else 500
        if load in ("throughput", "mixed"):
            measure_throughput(endpoint, payload, 50_000, 0, "all")
            records += 50_000
    return round_trips, records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", default="proxy-all", help="the path whose middle process is profiled")
    parser.add_argument("--load", choices=("latency", "throughput", "mixed"), default="mixed")
    parser.add_argument("--seconds", type=int, default=20, help="how long py-spy samples")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--native", action="store_true", help="py-spy --native: C frames too")
    parser.add_argument("--top", type=int, default=25, help="rows per table")
    parser.add_argument("--keep", type=Path, help="directory to keep the raw profile in")
    args = parser.parse_args(argv)
    middle_paths(parser, args.path)
    try:
        binary = py_spy()
        with tempfile.TemporaryDirectory(prefix="profile-") as tmp, started([args.path]) as endpoints:
            endpoint = endpoints[args.path]
            assert endpoint.middle is not None
            drive(endpoint, args.load, time.monotonic() + 2)  # warm-up, not sampled
            raw = (args.keep or Path(tmp)) / f"py-spy-{args.path}-{args.load}.txt"
            raw.parent.mkdir(parents=True, exist_ok=True)
            command = [
                binary,
                "record",
                "--pid",
                str(endpoint.middle.pid),
                "--format",
                "raw",
                "--output",
                str(raw),
                "--rate",
                str(args.rate),
                "--duration",
                str(args.seconds),
                "--nonblocking",
            ] + (["--native"] if args.native else [])
            load_start = load_average()
            recorder = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            round_trips, records = drive(endpoint, args.load, time.monotonic() + args.seconds)
            _, errors = recorder.communicate(timeout=args.seconds + 60)
            if recorder.returncode != 0 or not raw.exists():
                raise BenchError(f"py-spy exited with {recorder.returncode}: {errors.strip()}")
            by_self, by_total, by_line, by_file, kinds = parse_raw(raw.read_text())
    except BenchError as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return 1
    samples = kinds["rest"]
    if not samples:
        print("py-spy recorded no samples outside epoll_wait and socket calls", file=sys.stderr)
        return 1
    shown = " ".join(command).replace(str(raw), "OUT.txt").replace(str(endpoint.middle.pid), "PID")
    print(
        f"py-spy profile of `{args.path}` ({endpoint.middle.name}) under {args.load} load for "
        f"{args.seconds} s: {sum(kinds.values()):,} samples: {kinds['waiting']:,} waiting in epoll_wait, "
        f"{kinds['socket calls']:,} in trio's socket system calls (`{SOCKET_CALL}` line "
        f"{_socket_call_line()}: send and recv, and the wait for a CPU after a send woke the receiver), "
        f"{samples:,} in the rest, whose shares the tables give. {round_trips:,} single-record round trips and "
        f"{records:,} records of 1 KB produced meanwhile; load average {load_start} at the start, "
        f"{load_average()} at the end.\n\n`{shown}`\n"
    )
    print(top(by_file, samples, args.top, "file (self)"))
    print()
    print(top(by_self, samples, args.top, "function (self: deepest frame)"))
    print()
    print(top(by_total, samples, args.top, "function (total: anywhere on the stack)"))
    print()
    print(top(by_line, samples, args.top, "line (self)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
