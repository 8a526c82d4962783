"""What a connection open costs with shared connection limits (issue 29's target: at most 50 us
more at p50 than with one worker).

An open is what the proxy's accept loop awaits before it serves a connection:
``ConnectionGate.admit`` (workers: 1, the quotas in the process) or ``SharedConnectionGate.admit``
(workers: N, an ask to the ConnectionOwner in the supervisor process over the worker's Link, the
answer recorded as with one process). Each worker first opens 100 connections it keeps (a proxy
at work holds some); then every open is followed by its close (a tell with workers) and a pause
(``--pause-ms``), so the owner is idle when asked, as it is for opens that arrive one at a time.

Each way runs in fresh processes: ``w1``, one worker process with its own quotas; ``link``, one
worker asking the owner process a question whose answer is None, with the open's arguments: the
floor of any round trip to the owner on this machine at that moment (two process wake-ups);
``w1-owner``, one worker process asking an owner process (the supervisor's ConnectionOwner, built
from the same config) at every open (no slot lent), so ``w1-owner - link`` is what the connection
service adds to the link;
``w2``, two worker processes opening at once against one owner process: each admits from the slots
the owner lends it (docs/workers.md), asking only for its first open; ``w2-ask``, the same with no
slot lent (``LEASE_SLOTS`` 0 in the owner), so every open asks the owner: what an open costs near a
limit. With ``--audit DIR`` the audit keeps evidence (files in DIR, removed after each way) and the
open measured is the accept loop's admit and then the connection's ``open`` event
(``record_lifecycle``, the first thing a connection does): one process writes it itself; with
workers the owner writes it, as it counts the open. A worker's link is read by an I/O driver, as in the proxy;
``link-task`` and ``w2-task`` read it with a task of its own (the link before it was served by the
driver). Rounds alternate the ways
(``--rounds``), so each set is back to back. Reported: p50 / p99 of the open as the accept loop
sees it (the wall time of ``admit``), and the p50 difference with ``w1``.

    .venv/bin/python bench/workers_open.py --rounds 3 --opens 2000
    .venv/bin/python bench/workers_open.py --rounds 3 --opens 2000 --ways w1,w2 --audit /tmp/bench-audit
    .venv/bin/python bench/workers_open.py --rounds 3 --opens 2000 --ways w1,w2,w2-ask --broker 1  # a node port
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import trio
from harness import quantile_us

from policies.connections import BOOTSTRAP, BrokerKey, OpenCounts
from policies.mode import Mode
from proxy.config.model import Config, parse_config
from proxy.evidence.audit import AuditSink
from proxy.evidence.decisions import DecisionRecorder, Where
from proxy.evidence.lifecycle import record_lifecycle
from proxy.evidence.metrics import Metrics
from proxy.serve.connection_gate import ConnectionGate
from proxy.serve.driver import IODriver
from proxy.workers.link import Link

LISTENER = "external"
_STANDING = 100  # connections each worker holds open while it measures


def _config(audit: str | None = None) -> Config:
    return parse_config(
        {
            "upstream": {"bootstrap_servers": ["127.0.0.1:9092"]},
            "listeners": [{"name": LISTENER, "bind": "127.0.0.1:1"}],
            "policies": {"max.connections": 100000, "max.ssl.connections": 100000},
            "audit": {"path": audit, "instance_id": "bench"},
        }
    )


def _audit(config: Config, metrics: Metrics, worker: int | None) -> AuditSink:
    """The audit sink a process of the proxy builds (proxy/serve/server.py): with workers, each
    worker is the instance ``bench-w<i>`` naming its proxy; one process, and the owner, ``bench``."""
    if worker is None:
        return AuditSink(config.audit, metrics)
    settings = config.audit.model_copy(update={"instance_id": f"bench-w{worker}"})
    return AuditSink(settings, metrics, proxy=config.audit.instance)


@dataclass
class _Conn:
    conn_id: str
    tls: bool = False
    peer_ip: str = "10.0.0.1"
    listener: str = LISTENER
    open_counts: OpenCounts | None = None

    @property
    def where(self) -> Where:
        return Where(self.listener, self.peer_ip, self.conn_id, self.tls)

    def close_now(self, closing: object) -> None:
        raise AssertionError("nothing is closed in this bench")


async def _worker(
    index: int,
    fd: int | None,
    opens: int,
    pause: float,
    ping: bool,
    driven: bool,
    audit_dir: str | None,
    broker: BrokerKey,
) -> list[float]:
    from proxy.workers.worker_connections import SharedConnectionGate

    config = _config(audit_dir)
    p = config.policies
    metrics = Metrics()
    audit = _audit(config, metrics, None if fd is None else index)
    recorder = DecisionRecorder(metrics, audit)
    mode = Mode(p.mode_of(p.connections_mode))
    async with trio.open_nursery() as nursery:
        gate: ConnectionGate
        if fd is None:
            from policies.connections import BrokerQuotas

            quotas = BrokerQuotas(p.connection_limits(), mode=mode)
            gate = ConnectionGate(quotas, metrics, recorder, p.max_connections_wait_ms, p.max_ssl_handshakes_per_turn)
        else:
            link = Link(trio.SocketStream(trio.socket.from_stdlib_socket(socket.socket(fileno=fd))))
            if driven:  # read by an I/O driver, as a proxy worker's link is
                driver = IODriver()
                await nursery.start(driver.run)
                nursery.start_soon(link.run, driver)
            else:
                nursery.start_soon(link.run)
            gate = SharedConnectionGate(
                link,
                p.connection_limits(),
                mode,
                [],
                metrics,
                recorder,
                p.max_connections_wait_ms,
                p.max_ssl_handshakes_per_turn,
            )
        for n in range(_STANDING):  # a proxy at work holds connections: its pools are not made per open
            assert await gate.admit(_Conn(f"w{index}:{LISTENER}-standing-{n}"), broker)
        took: list[float] = []
        for n in range(opens):
            conn = _Conn(f"w{index}:{LISTENER}-{n}")
            if ping:
                start = time.perf_counter()
                await link.ask("bench.ping", conn.conn_id, LISTENER, conn.peer_ip, False, "bootstrap")
                took.append(time.perf_counter() - start)
                await trio.sleep(pause)
                continue
            start = time.perf_counter()
            admitted = await gate.admit(conn, broker)
            record_lifecycle(  # what the connection does first (proxy/serve/connection.py)
                audit,
                None,
                "open",
                conn_id=conn.conn_id,
                listener=LISTENER,
                peer=conn.peer_ip,
                tls=False,
                counts=conn.open_counts,
                closed={},
            )
            took.append(time.perf_counter() - start)
            assert admitted
            gate.on_closed(conn)  # type: ignore[arg-type]
            await trio.sleep(pause)
        nursery.cancel_scope.cancel()
    audit.close()
    return took


async def _owner(fds: list[int], lend: bool, audit_dir: str | None) -> None:
    from proxy.workers import owner_connections

    if not lend:
        owner_connections.LEASE_SLOTS = 0  # no slot lent: every open asks
    config = _config(audit_dir)
    owner = owner_connections.ConnectionOwner(config)
    if audit_dir is not None:  # as the supervisor gives it the proxy's sink (proxy/workers/supervisor.py)
        owner.audit = _audit(config, Metrics(), None)
    async with trio.open_nursery() as nursery:
        for index, fd in enumerate(fds):
            link = Link(trio.SocketStream(trio.socket.from_stdlib_socket(socket.socket(fileno=fd))))
            link.handlers.update(owner.handlers(index))
            link.handlers["bench.ping"] = lambda *args: None
            owner.attach(index, link)
            nursery.start_soon(link.run)
        await trio.sleep_forever()


def _run_way(way: str, opens: int, pause_ms: float, audit_dir: str | None, broker: str) -> list[float]:
    me = [sys.executable, __file__]
    common = ["--opens", str(opens), "--pause-ms", str(pause_ms), "--broker", broker]
    if audit_dir is not None:
        shutil.rmtree(audit_dir, ignore_errors=True)
        common += ["--audit", audit_dir]
    if way.endswith("-task"):  # the worker's link read by a task of its own, not by an I/O driver
        way = way.removesuffix("-task")
    else:
        common.append("--driver")
    if way == "w1":
        out = subprocess.run([*me, "--as-worker", "0", *common], check=True, capture_output=True, text=True)
        return [float(x) for x in json.loads(out.stdout)]
    if way == "link":
        common.append("--ping")
    pairs = [socket.socketpair() for _ in range(2 if way.startswith("w2") else 1)]
    owner_fds = [a.fileno() for a, _ in pairs]
    no_slots = ["--no-slots"] if way in ("w1-owner", "w2-ask") else []
    audit = ["--audit", audit_dir] if audit_dir is not None else []
    owner = subprocess.Popen([*me, "--as-owner", ",".join(map(str, owner_fds)), *no_slots, *audit], pass_fds=owner_fds)
    workers = [
        subprocess.Popen(
            [*me, "--as-worker", str(i), "--fd", str(b.fileno()), *common],
            pass_fds=[b.fileno()],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i, (_, b) in enumerate(pairs)
    ]
    for a, b in pairs:
        a.close()
        b.close()
    took: list[float] = []
    for worker in workers:
        stdout, _ = worker.communicate()
        took += [float(x) for x in json.loads(stdout)]
    owner.terminate()
    owner.wait()
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--opens", type=int, default=2000)
    parser.add_argument("--pause-ms", type=float, default=1.0)
    parser.add_argument("--as-worker", type=int)
    parser.add_argument("--as-owner")
    parser.add_argument("--fd", type=int)
    parser.add_argument("--ping", action="store_true")
    parser.add_argument("--driver", action="store_true")
    parser.add_argument("--no-slots", action="store_true")
    parser.add_argument("--audit", help="the audit keeps evidence: its files in this directory (emptied per way)")
    parser.add_argument(
        "--broker", default="bootstrap", help="the pool the opens count in: bootstrap, or a node id (a node port's)"
    )
    parser.add_argument(
        "--ways", default="w1,link-task,link,w1-owner,w2-task,w2,w2-ask", help="comma-separated, in order"
    )
    args = parser.parse_args()
    if args.as_owner is not None:
        trio.run(_owner, [int(fd) for fd in args.as_owner.split(",")], not args.no_slots, args.audit)
        return
    if args.as_worker is not None:
        took = trio.run(
            _worker,
            args.as_worker,
            args.fd,
            args.opens,
            args.pause_ms / 1000,
            args.ping,
            args.driver,
            args.audit,
            BOOTSTRAP if args.broker == "bootstrap" else int(args.broker),
        )
        print(json.dumps(took[len(took) // 20 :]))  # the first 5% warm up
        return
    audit = f", audit files in {args.audit}" if args.audit else ", no audit"
    pool = "the bootstrap port" if args.broker == "bootstrap" else f"node {args.broker}'s port"
    print(f"opens per worker {args.opens} on {pool}, pause {args.pause_ms} ms, cpus {os.sched_getaffinity(0)}{audit}")
    print("round  way       p50_us  p99_us")
    p50s: dict[str, list[float]] = {way: [] for way in args.ways.split(",")}
    for round_ in range(args.rounds):
        for way in p50s:
            took = _run_way(way, args.opens, args.pause_ms, args.audit, args.broker)
            p50s[way].append(quantile_us(took, 0.5))
            print(f"{round_:5d}  {way:8s}  {quantile_us(took, 0.5):6.1f}  {quantile_us(took, 0.99):6.1f}", flush=True)
        if "w1" in p50s and "w2" in p50s:
            print(f"       added p50 (w2 - w1): {p50s['w2'][-1] - p50s['w1'][-1]:.1f} us", flush=True)
        if "w1" in p50s and "w2-ask" in p50s:
            print(f"       added p50 asking (w2-ask - w1): {p50s['w2-ask'][-1] - p50s['w1'][-1]:.1f} us", flush=True)
    if "w1" in p50s and "w2" in p50s:
        added = [b - a for a, b in zip(p50s["w1"], p50s["w2"], strict=True)]
        rounds = ", ".join(f"{x:.1f}" for x in added)
        print(f"added p50 per round: {rounds} us; median {statistics.median(added):.1f} us")
    for way, values in p50s.items():
        print(f"{way:9s} p50 median over rounds {statistics.median(values):6.1f} us")


if __name__ == "__main__":
    main()
