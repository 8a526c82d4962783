"""``kafka-admission-proxy demo``: an embedded Tansu broker, this proxy in front
of it with the sample policy file, and a short produce/consume workload through
the proxy. Runs until Ctrl-C, then stops everything it started."""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import trio
import yaml
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from demo.tansu import TansuBroker
from proxy.config.model import Config, parse_config
from proxy.serve.server import ProxyServer

log = logging.getLogger("kafka_admission_proxy.demo")

TOPIC = "demo-events"


@dataclass
class WorkloadResult:
    produced: int
    consumed: int
    seconds: float


# With an audit directory the demo's windows are short, so a run of seconds leaves
# several of them for the report.
DEMO_WINDOW_SECONDS = 2


def sample_config(bootstrap: str, audit_dir: Path | None = None) -> Config:
    raw = yaml.safe_load(resources.files("demo").joinpath("demo-config.yaml").read_text())
    raw["upstream"]["bootstrap_servers"] = [bootstrap]
    if audit_dir is not None:
        raw["audit"] = {"path": str(audit_dir), "instance_id": "demo", "window": {"seconds": DEMO_WINDOW_SECONDS}}
    return parse_config(raw)


def run_workload(bootstrap: str, records: int) -> WorkloadResult:
    """Create a topic, produce ``records`` idempotently, consume them in a group."""
    started = time.monotonic()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, num_partitions=3, replication_factor=1)]).values():
        try:
            future.result(timeout=15)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    delivered = 0

    def on_delivery(err: object, _msg: object) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(records):
        producer.produce(TOPIC, key=str(i % 10), value=f"event {i}".encode(), on_delivery=on_delivery)
        producer.poll(0)
    producer.flush(30)

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "demo-group",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
        }
    )
    consumer.subscribe([TOPIC])
    consumed = 0
    deadline = time.monotonic() + 60
    while consumed < delivered and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            consumed += 1
    consumer.close()
    return WorkloadResult(delivered, consumed, time.monotonic() - started)


def _summary(server: ProxyServer, result: WorkloadResult) -> str:
    registry = server.metrics.registry
    requests = sum(
        s.value
        for m in registry.collect()
        if m.name == "kafka_admission_requests"
        for s in m.samples
        if s.name.endswith("_total")
    )
    listener = server.config.listeners[0]
    host = server.config.admin.bind_address[0]
    return "\n".join(
        [
            "kafka-admission-proxy demo",
            f"  broker (Tansu, embedded):  {server.config.upstream.bootstrap_servers[0]}",
            f"  proxy listener:            {listener.bind}  (brokers on {listener.advertised_host}:"
            f"{listener.node_port_base}+node id)",
            f"  metrics:                   http://{host}:{server.admin_port}/metrics",
            f"  health:                    http://{host}:{server.admin_port}/readyz",
            f"  workload: produced {result.produced}, consumed {result.consumed} records of "
            f"topic {TOPIC!r} through the proxy in {result.seconds:.1f}s ({int(requests)} requests)",
        ]
    )


async def _demo(config: Config, records: int, exit_after_workload: bool) -> int:
    server = ProxyServer(config)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            result = await trio.to_thread.run_sync(run_workload, config.listeners[0].bind, records)
            print(_summary(server, result), flush=True)
            ok = result.produced == records and result.consumed == records
            if not exit_after_workload:
                print("Running; press Ctrl-C to stop.", flush=True)
                async for _ in signals:
                    break
            await server.shutdown(drain_timeout=5)
    return 0 if ok else 1


def run_demo(records: int = 1000, exit_after_workload: bool = False, audit_dir: Path | None = None) -> int:
    """The demo; with ``audit_dir`` the proxy writes its audit events there (the demo's
    files of earlier runs removed first)."""
    if audit_dir is not None:
        audit_dir.mkdir(parents=True, exist_ok=True)
        for old in audit_dir.glob("demo-*.jsonl*"):
            old.unlink()
    with TansuBroker() as broker:
        config = sample_config(broker.bootstrap, audit_dir)
        return trio.run(_demo, config, records, exit_after_workload)
