"""What a response naming a new broker waits for in cluster mode with workers (issue 29,
proxy/workers/shared_brokers.py): the worker that learns the broker asks the supervisor, which tells
every other worker and answers once each learned it; only then does the response go on.

Ways, each in fresh processes: ``w1``, one process learning the broker (``BrokerDirectory.learn``:
its bookkeeping only, as one process does); ``w2`` and ``w4``, a supervisor process (``SharedBrokers``
over real Links) and 2 or 4 worker processes, worker 0 learning each broker from "a response" and
the others told it, their links read by an I/O driver as in the proxy. No node port is bound (that
costs the same in both). Each learn is a new broker (a new node id), with a pause (``--pause-ms``)
so the processes are idle when it comes, as for a broker learned once. Reported: p50 / p99 of the
learn as the response's task sees it, and the p50 added over ``w1``. A broker is learned once per
proxy (and again when it moves), so this is paid once per broker, not per request.

    .venv/bin/python bench/broker_spread.py --rounds 3 --learns 500
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import trio
from harness import load_average, quantile_us

from proxy.evidence.metrics import Metrics
from proxy.links.brokers import BrokerDirectory
from proxy.protocol.rewrite import BrokerAddress
from proxy.serve.driver import IODriver
from proxy.workers.link import Link
from proxy.workers.shared_brokers import SharedBrokers, share_brokers


def _broker(n: int) -> BrokerAddress:
    return BrokerAddress(n, f"10.0.{n // 250}.{n % 250 + 1}", 9092)


async def _driven_link(nursery: trio.Nursery, fd: int) -> Link:
    link = Link(trio.SocketStream(trio.socket.from_stdlib_socket(socket.socket(fileno=fd))))
    driver = IODriver()
    await nursery.start(driver.run)
    nursery.start_soon(link.run, driver)
    return link


async def _worker(index: int, fd: int | None, learns: int, pause: float) -> list[float]:
    directory = BrokerDirectory(Metrics())
    took: list[float] = []
    async with trio.open_nursery() as nursery:
        if fd is not None:
            share_brokers(directory, await _driven_link(nursery, fd))
        if index == 0:
            for n in range(learns):
                await trio.sleep(pause)
                start = time.perf_counter()
                await directory.learn([_broker(n)])
                took.append(time.perf_counter() - start)
            nursery.cancel_scope.cancel()
        else:
            await trio.sleep_forever()
    return took


async def _supervisor(fds: list[int]) -> None:
    brokers = SharedBrokers()
    links: dict[int, Link] = {}
    async with trio.open_nursery() as nursery:
        for index, fd in enumerate(fds):
            link = Link(trio.SocketStream(trio.socket.from_stdlib_socket(socket.socket(fileno=fd))))
            link.handlers["worker.brokers"] = lambda learned, index=index: brokers.learned(
                {other: each for other, each in links.items() if other != index}, learned
            )
            links[index] = link
            nursery.start_soon(link.run)
        await trio.sleep_forever()


def _run_way(way: str, learns: int, pause_ms: float) -> list[float]:
    me = [sys.executable, __file__]
    common = ["--learns", str(learns), "--pause-ms", str(pause_ms)]
    if way == "w1":
        out = subprocess.run([*me, "--as-worker", "0", *common], check=True, capture_output=True, text=True)
        return [float(x) for x in json.loads(out.stdout)]
    pairs = [socket.socketpair() for _ in range(int(way[1:]))]
    ours = [a.fileno() for a, _ in pairs]
    supervisor = subprocess.Popen([*me, "--as-supervisor", ",".join(map(str, ours))], pass_fds=ours)
    workers = [
        subprocess.Popen(
            [*me, "--as-worker", str(i), "--fd", str(b.fileno()), *common],
            pass_fds=[b.fileno()],
            stdout=subprocess.PIPE if i == 0 else subprocess.DEVNULL,
            text=True,
        )
        for i, (_, b) in enumerate(pairs)
    ]
    for a, b in pairs:
        a.close()
        b.close()
    stdout, _ = workers[0].communicate()
    for process in (*workers[1:], supervisor):
        process.terminate()
        process.wait()
    return [float(x) for x in json.loads(stdout)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--learns", type=int, default=500)
    parser.add_argument("--pause-ms", type=float, default=2.0)
    parser.add_argument("--ways", default="w1,w2,w4", help="comma-separated, in order")
    parser.add_argument("--as-worker", type=int)
    parser.add_argument("--as-supervisor")
    parser.add_argument("--fd", type=int)
    args = parser.parse_args()
    if args.as_supervisor is not None:
        trio.run(_supervisor, [int(fd) for fd in args.as_supervisor.split(",")])
        return
    if args.as_worker is not None:
        took = trio.run(_worker, args.as_worker, args.fd, args.learns, args.pause_ms / 1000)
        print(json.dumps(took[len(took) // 20 :]))  # the first 5% warm up
        return
    print(f"learns {args.learns}, pause {args.pause_ms} ms, cpus {os.sched_getaffinity(0)}, load {load_average()}")
    print("round  way  p50_us  p99_us")
    p50s: dict[str, list[float]] = {way: [] for way in args.ways.split(",")}
    for round_ in range(args.rounds):
        for way in p50s:
            took = _run_way(way, args.learns, args.pause_ms)
            p50s[way].append(quantile_us(took, 0.5))
            print(f"{round_:5d}  {way:3s}  {quantile_us(took, 0.5):6.1f}  {quantile_us(took, 0.99):6.1f}", flush=True)
    for way, values in p50s.items():
        added = (
            f", added over w1 {statistics.median(values) - statistics.median(p50s['w1']):.1f} us"
            if "w1" in p50s
            else ""
        )
        print(f"{way:3s} p50 median over rounds {statistics.median(values):6.1f} us{added}")


if __name__ == "__main__":
    main()
