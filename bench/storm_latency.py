"""What a connection storm costs the clients already working: producers' acknowledgement
latency before and during a storm of connection attempts at the proxy.

One embedded Tansu broker, the proxy (the ``run`` CLI, default policies) in front of it,
and ``--producers`` idempotent confluent-kafka producers sending a record every 10 ms each
through the proxy (``tests/faults.py``'s ``ProducerTraffic``). Each round measures
``--baseline`` seconds of that traffic alone, then ``--seconds`` of a storm of ``--rate``
connection attempts a second from two separate processes, each connection reset as soon as
it connects (``tests/faults.py``'s ``ConnectionStorm``, what
``tests/integration/test_faults.py::test_a_storm_of_5000_connection_attempts_a_second_while_producers_keep_working``
runs: the test asserts that the producers keep being acknowledged and that nothing fails;
the latencies are measured here).

Reported per round: the acknowledgement latency (produce() to delivery report, which the
producer polls for once a tick: up to 10 ms of it is that wait) p50 and p99 over all
producers, before and during the storm; acknowledgements during it; the attempts
issued and their rate; how many completed a TCP handshake and how many the proxy accepted
(the rest overflowed the listen backlog); the load average. The storm, the producers, the
proxy and the broker share this machine's CPUs: read the p99s with the load beside them.

    .venv/bin/python bench/storm_latency.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.tansu import TansuBroker, free_port  # noqa: E402
from tests.clients import create_topic, unique  # noqa: E402
from tests.conftest import ProxyProcess, free_node_port_base, wait_until  # noqa: E402
from tests.faults import ConnectionStorm, ProducerTraffic  # noqa: E402


def quantile_ms(latencies: list[float], q: float) -> float:
    """The ``q`` quantile of latencies in seconds, in ms (nearest rank)."""
    if not latencies:
        return float("nan")
    ordered = sorted(latencies)
    return 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def one_round(proxy: ProxyProcess, traffic: list[ProducerTraffic], args: argparse.Namespace) -> str:
    before_start = [len(t.latencies) for t in traffic]
    time.sleep(args.baseline)  # the window measured: traffic alone
    at_storm = [len(t.latencies) for t in traffic]
    accepted_before = proxy.metric("kafka_admission_connections_accepted_total")
    storm = ConnectionStorm(proxy.bootstrap, rate=args.rate, seconds=args.seconds).start().result()
    after_storm = [len(t.latencies) for t in traffic]
    before = [x for t, b, s in zip(traffic, before_start, at_storm, strict=True) for x in t.latencies[b:s]]
    during = [x for t, s, e in zip(traffic, at_storm, after_storm, strict=True) for x in t.latencies[s:e]]
    failed = sum(len(t.failed) for t in traffic)
    accepted = proxy.metric("kafka_admission_connections_accepted_total") - accepted_before
    return (
        f"before p50 {quantile_ms(before, 0.5):6.1f} ms p99 {quantile_ms(before, 0.99):6.1f} ms | "
        f"during p50 {quantile_ms(during, 0.5):6.1f} ms p99 {quantile_ms(during, 0.99):6.1f} ms, "
        f"{len(during):,} acks | storm {storm.attempts:,} attempts at {storm.rate:,.0f}/s, "
        f"{storm.connected:,} connected, {accepted:,.0f} accepted | failed {failed} | "
        f"load {os.getloadavg()[0]:.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="baseline then storm, this many times")
    parser.add_argument("--rate", type=int, default=5000, help="connection attempts a second")
    parser.add_argument("--seconds", type=float, default=3.0, help="how long each storm lasts")
    parser.add_argument("--baseline", type=float, default=2.0, help="seconds of traffic alone before each storm")
    parser.add_argument("--producers", type=int, default=2)
    args = parser.parse_args(argv)

    with TansuBroker() as broker, tempfile.TemporaryDirectory(prefix="storm-bench-") as tmp:
        folder = Path(tmp)
        config = {
            "upstream": {"bootstrap_servers": [broker.bootstrap]},
            "listeners": [
                {
                    "name": "external",
                    "bind": f"127.0.0.1:{free_port()}",
                    "node_port_base": free_node_port_base([TansuBroker.NODE_ID]),
                }
            ],
            "admin": {"bind": f"127.0.0.1:{free_port()}"},
        }
        proxy = ProxyProcess(config, folder / "proxy.yaml", folder / "proxy.log").start()
        traffic: list[ProducerTraffic] = []
        try:
            topic = unique("storm")
            create_topic(proxy.bootstrap, topic)
            traffic = [ProducerTraffic(proxy.bootstrap, topic, name=f"p{i}").start() for i in range(args.producers)]
            wait_until(lambda: all(len(t.acked) >= 50 for t in traffic), timeout=20)
            for n in range(1, args.rounds + 1):
                print(f"round {n}/{args.rounds}  {one_round(proxy, traffic, args)}", flush=True)
        finally:
            for t in traffic:
                t.stop()
            proxy.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
