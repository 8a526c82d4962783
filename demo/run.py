"""``kafka-admission-proxy demo``: an embedded Tansu broker, this proxy in front
of it with the sample policy file, and a short produce/consume workload through
the proxy. Runs until Ctrl-C, then stops everything it started.

The proxy runs as its own process (``kafka-admission-proxy run``), exactly as an
operator runs it, and the demo reads its numbers from its ``/metrics``: the demo
is a client of the proxy and imports none of it."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from prometheus_client.parser import text_string_to_metric_families

from demo.tansu import TansuBroker, stop_process

TOPIC = "demo-events"


@dataclass
class WorkloadResult:
    produced: int
    consumed: int
    seconds: float


# With an audit directory the demo's windows are short, so a run of seconds leaves
# several of them for the report.
DEMO_WINDOW_SECONDS = 2


def sample_config(bootstrap: str, audit_dir: Path | None = None) -> dict[str, Any]:
    """The sample policy file as a mapping, pointed at ``bootstrap``."""
    raw: dict[str, Any] = yaml.safe_load(resources.files("demo").joinpath("demo-config.yaml").read_text())
    raw["upstream"]["bootstrap_servers"] = [bootstrap]
    if audit_dir is not None:
        raw["audit"] = {"path": str(audit_dir), "instance_id": "demo", "window": {"seconds": DEMO_WINDOW_SECONDS}}
    return raw


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


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as response:
        return str(response.read().decode())


def _start_proxy(config_file: Path, admin: str) -> subprocess.Popen[bytes]:
    """``kafka-admission-proxy run`` on the demo's config, once its ``/readyz`` answers."""
    proxy = subprocess.Popen([sys.executable, "-m", "proxy.cli", "run", "--config", str(config_file)])
    deadline = time.monotonic() + 30
    while True:
        if proxy.poll() is not None:  # it said why, in one line (a port in use, say)
            raise SystemExit(proxy.returncode)
        try:
            _get(f"http://{admin}/readyz")
            return proxy
        except OSError:
            if time.monotonic() > deadline:
                stop_process(proxy)
                raise SystemExit(f"demo: the proxy's http://{admin}/readyz did not answer within 30 s") from None
            time.sleep(0.1)


def _requests_served(admin: str) -> int:
    families = text_string_to_metric_families(_get(f"http://{admin}/metrics"))
    return int(
        sum(
            sample.value
            for family in families
            if family.name == "kafka_admission_requests"
            for sample in family.samples
            if sample.name.endswith("_total")
        )
    )


def _summary(config: dict[str, Any], result: WorkloadResult, requests: int) -> str:
    listener, admin = config["listeners"][0], config["admin"]["bind"]
    return "\n".join(
        [
            "kafka-admission-proxy demo",
            f"  broker (Tansu, embedded):  {config['upstream']['bootstrap_servers'][0]}",
            f"  proxy listener:            {listener['bind']}  (brokers on {listener['advertised_host']}:"
            f"{listener['node_port_base']}+node id)",
            f"  metrics:                   http://{admin}/metrics",
            f"  health:                    http://{admin}/readyz",
            f"  workload: produced {result.produced}, consumed {result.consumed} records of "
            f"topic {TOPIC!r} through the proxy in {result.seconds:.1f}s ({requests} requests)",
        ]
    )


def run_demo(records: int = 1000, exit_after_workload: bool = False, audit_dir: Path | None = None) -> int:
    """The demo; with ``audit_dir`` the proxy writes its audit events there (the demo's
    files of earlier runs removed first)."""
    if audit_dir is not None:
        audit_dir.mkdir(parents=True, exist_ok=True)
        for old in audit_dir.glob("demo-*.jsonl*"):
            old.unlink()
    with TansuBroker() as broker, tempfile.TemporaryDirectory(prefix="kafka-admission-demo-") as workdir:
        config = sample_config(broker.bootstrap, audit_dir)
        config_file = Path(workdir) / "config.yaml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        admin = config["admin"]["bind"]
        proxy = _start_proxy(config_file, admin)
        # Ctrl-C (SIGINT, which the terminal sends the proxy too: it drains) or SIGTERM ends the demo
        # with the proxy stopped, not a traceback. Handlers, not a blocked signal mask: a mask
        # would outlive the demo in a process that goes on (the tests run it in theirs) and be
        # inherited by every process started after it.
        previous = signal.signal(signal.SIGTERM, _interrupt)
        result: WorkloadResult | None = None
        try:
            result = run_workload(config["listeners"][0]["bind"], records)
            print(_summary(config, result, _requests_served(admin)), flush=True)
            if not exit_after_workload:
                print("Running; press Ctrl-C to stop.", flush=True)
                while True:
                    signal.pause()
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            status = stop_process(proxy, timeout=15)
    ok = result is not None and result.produced == records and result.consumed == records
    return 0 if ok and status == 0 else 1


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt
