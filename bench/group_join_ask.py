"""What a group join costs a worker when the owner decides it (issue 29, docs/workers.md "Group
sizes"): a JoinGroup decided in one process (``GroupSizes``: the policy called in place) against
one decided by the owner in another process (``RemoteGroupSizes``: one ask over the worker link
in the hook's ``prepare``), each through a config generation as a connection drives it
(``prepare``, then ``check_request``), with real kio-encoded requests.

Each join is a new member of one of ``--groups`` groups (a cap high enough that none is refused),
answered MEMBER_ID_REQUIRED so the group's size stays put. Joins run back to back with a pause
(``--pause-ms``) so the owner is idle when asked, as it is for the occasional join. Reported:
p50 / p99 of the decision as the connection's task sees it, and the CPU per join of the worker and
of the owner process (``time.process_time`` in each, over the whole run).

    .venv/bin/python bench/group_join_ask.py --joins 2000
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import socket
import statistics
import time
from typing import Any

import trio
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode

from policies.api_keys import JOIN_GROUP
from policies.group_size import GroupSizePolicy
from proxy.config.model import Config, parse_config
from proxy.evidence.audit import AuditSink
from proxy.evidence.decisions import DecisionRecorder, Where
from proxy.evidence.metrics import Metrics
from proxy.hooks.generation import Generation
from proxy.hooks.request import Request
from proxy.links.brokers import BrokerDirectory
from proxy.links.upstream import UpstreamLink, UpstreamUnavailable
from proxy.protocol import wire
from proxy.workers.link import Link
from proxy.workers.owner_groups import GroupOwner
from proxy.workers.worker_groups import SharedGroups

VERSION = 5


def _config() -> Config:
    return parse_config(
        {
            "mode": "sidecar",
            "upstream": {"bootstrap_servers": ["127.0.0.1:9092"]},
            "listeners": [{"name": "l", "bind": "127.0.0.1:1"}],
            # a recount would need a broker: the interval is long, and the first one is skipped below
            "policies": {"group.max.size": 1_000_000, "group.reconcile.interval.ms": 3_600_000},
        }
    )


async def _no_coordinator() -> UpstreamLink:
    raise UpstreamUnavailable("no broker in this benchmark")


def _join_frame(group: str) -> bytes:
    schema: Any = load_request_schema(JOIN_GROUP, VERSION)
    module: Any = __import__(f"kio.schema.join_group.v{VERSION}.request", fromlist=["x"])
    body = schema(
        group_id=group,
        session_timeout=datetime.timedelta(seconds=10),
        rebalance_timeout=datetime.timedelta(seconds=30),
        member_id="",
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(module.JoinGroupRequestProtocol(name="range", metadata=b"\x00" * 40),),
    )
    return wire.encode_frame(wire.request_header_for(JOIN_GROUP, VERSION, 7, "bench"), body)


def _answer_frame(member_id: str) -> bytes:
    schema: Any = load_response_schema(JOIN_GROUP, VERSION)
    body = schema(
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.member_id_required,
        generation_id=-1,
        protocol_name="",
        leader="",
        member_id=member_id,
        members=(),
    )
    return wire.encode_frame(schema.__header_schema__(correlation_id=7), body)


async def _drive(generation: Generation, joins: int, groups: int, pause_s: float) -> list[float]:
    frames = [_join_frame(f"g{i}") for i in range(groups)]
    plan = generation.plan(JOIN_GROUP, VERSION)
    took = []
    # Untimed: each group's first join (first contact) and second (its first recount: no broker here).
    for n in range(-2 * groups, joins):
        frame = frames[n % groups]
        now = trio.current_time()
        request = Request(frame, 0, len(frame), JOIN_GROUP, VERSION, 7, Where("l"), _no_coordinator, now)
        started = time.perf_counter()
        await generation.prepare(request, plan.prepare_hooks)
        decision = generation.check_request(request, plan.request_hooks)
        if n >= 0:
            took.append(time.perf_counter() - started)
        assert decision is None, decision
        await generation.on_response(request, plan.response_hooks, _answer_frame(f"m{n + 2 * groups}"))
        await trio.sleep(pause_s)
    return took


def _generation(groups: GroupSizePolicy | SharedGroups) -> Generation:
    config = _config()
    metrics = Metrics()
    recorder = DecisionRecorder(metrics, AuditSink(config.audit, metrics))
    return Generation(1, config, groups=groups, directory=BrokerDirectory(metrics), recorder=recorder)


def _owner_process(sock: socket.socket, workers_end: socket.socket, cpu: Any) -> None:
    workers_end.close()  # the fork's copy: the link ends when the worker closes its own

    async def main() -> None:
        owner = GroupOwner(_config())
        link = Link(trio.SocketStream(trio.socket.from_stdlib_socket(sock)), owner.handlers(0))
        link.handlers["bench.noop"] = lambda: None
        owner.attach(0, link)
        await link.run()  # until the worker's end closes

    started = time.process_time()
    trio.run(main)
    cpu.value = time.process_time() - started


def run_local(joins: int, groups: int, pause_s: float) -> tuple[list[float], float]:
    generation = _generation(GroupSizePolicy(_config().policies.group_size_config()))
    started = time.process_time()
    took = trio.run(_drive, generation, joins, groups, pause_s)
    return took, time.process_time() - started


def run_remote(joins: int, groups: int, pause_s: float) -> tuple[list[float], float, float, list[float]]:
    """The joins' decisions, the worker's and the owner's CPU (joins and the no-op asks after
    them), and the no-op asks' round trips."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    cpu = multiprocessing.get_context("fork").Value("d", 0.0)
    owner = multiprocessing.get_context("fork").Process(target=_owner_process, args=(theirs, ours, cpu))
    owner.start()
    theirs.close()

    asks: list[float] = []

    async def main() -> list[float]:
        link = Link(trio.SocketStream(trio.socket.from_stdlib_socket(ours)))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(link.run)
            shared = SharedGroups(link)
            generation = _generation(shared)
            took = await _drive(generation, joins, groups, pause_s)
            for _ in range(joins):  # the link alone: an ask whose handler does nothing
                started = time.perf_counter()
                await link.ask("bench.noop")
                asks.append(time.perf_counter() - started)
                await trio.sleep(pause_s)
            nursery.cancel_scope.cancel()
        return took

    started = time.process_time()
    took = trio.run(main)
    worker_cpu = time.process_time() - started
    ours.close()
    owner.join(10)
    assert owner.exitcode == 0, owner.exitcode
    return took, worker_cpu, cpu.value, asks


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--joins", type=int, default=2000)
    parser.add_argument("--groups", type=int, default=50)
    parser.add_argument("--pause-ms", type=float, default=1.0)
    args = parser.parse_args()
    pause = args.pause_ms / 1000
    print(f"cpus {os.cpu_count()}, {args.joins} joins over {args.groups} groups, {args.pause_ms} ms apart")
    print("| where the join is decided | p50 us | p99 us | worker CPU us/join | owner CPU us/join |")
    print("|---|---|---|---|---|")
    took, cpu = run_local(args.joins, args.groups, pause)
    q = statistics.quantiles(took, n=100)
    print(f"| one process (GroupSizes) | {_us(q[49])} | {_us(q[98])} | {_us(cpu / args.joins)} | - |")
    took, worker_cpu, owner_cpu, asks = run_remote(args.joins, args.groups, pause)
    q = statistics.quantiles(took, n=100)
    print(f"| the owner, another process (RemoteGroupSizes) | {_us(q[49])} | {_us(q[98])} | - | - |")
    q = statistics.quantiles(asks, n=100)
    print(f"| (the link alone: a no-op ask) | {_us(q[49])} | {_us(q[98])} | - | - |")
    print(
        f"worker CPU {_us(worker_cpu / args.joins)} us and owner CPU {_us(owner_cpu / args.joins)} us"
        " per join and no-op ask together"
    )


if __name__ == "__main__":
    main()
