"""Shared fixtures: a real Tansu broker, the proxy as a real subprocess (the
console script), trustme certificates. Under ``REQUIRE_ALL=1`` (CI) a skipped
test fails: a missing tool must be installed, not hidden."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from prometheus_client.parser import text_string_to_metric_families

from demo.tansu import TansuBroker, stop_process, wait_for_port
from tests.kubelet import ConfigMapDir
from tests.processes import living, process_tree, rss_kib

ROOT = Path(__file__).resolve().parent.parent


def _fail_a_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Under REQUIRE_ALL=1, a skip becomes a failure (an expected failure, xfail, stays one)."""
    if os.environ.get("REQUIRE_ALL") == "1" and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"skipped under REQUIRE_ALL=1 (install what it needs): {reason}"


# A test's call report, kept for its fixtures' teardown (start_proxy shows the logs of a failed test's proxies)
CALL_REPORT = pytest.StashKey[pytest.TestReport]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test's own skip, and a ``skipif`` mark (evaluated at its setup)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    _fail_a_skip(report)
    if report.when == "call":
        item.stash[CALL_REPORT] = report


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """A skip while collecting: ``pytest.importorskip`` or ``pytest.skip(allow_module_level=True)``
    in a test module or a conftest.py, which would skip every test in it unseen."""
    outcome = yield
    _fail_a_skip(outcome.get_result())  # type: ignore[attr-defined]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--proxy-workers",
        type=int,
        default=1,
        metavar="N",
        help="run every proxy that start_proxy starts with `workers: N` (a config's own `workers` stays)",
    )


# Session fixtures that take a worker 10-45 s to build: the tests that use one run in one worker,
# so it is built once. The image's go with test_image.py's, which bind the demo's ports.
BUILT_ONCE = {"proxy_image": "spark", "runtime_venv": "runtime_venv", "busy_proxy": "busy_proxy"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist's ``--dist loadgroup`` (``make test``): the tests of one JVM-backed
    session fixture run in one worker, so Spark and the Apache Kafka brokers start once. The tests
    that run the demo, which binds fixed ports (29092, 9464), run in one worker too: the Spark
    tests' (``make demo``'s test is one of them). In two workers at once, one demo held 29092 while
    the test that holds it itself to see the demo refuse it found it taken, then free for the demo.
    The tests of each of ``BUILT_ONCE``'s fixtures run in one worker as well."""
    groups = {"spark": "spark", "apache_kafka": "apache_kafka", "demo_ports": "spark"}
    if config.getoption("--proxy-workers") > 1:
        items[:] = _with_generated_workers(config, items)
    for item in items:
        group = next((group for marker, group in groups.items() if item.get_closest_marker(marker)), None)
        group = group or next((BUILT_ONCE[name] for name in item.fixturenames if name in BUILT_ONCE), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def _with_generated_workers(config: pytest.Config, items: list[pytest.Item]) -> list[pytest.Item]:
    """``--proxy-workers=N`` runs again only the tests it changes: those that start a proxy
    through ``start_proxy`` with the config it generates. The others (no proxy of
    ``start_proxy``'s, or a test module of the workers' own, whose configs choose ``workers``)
    would run exactly as in the default run; they are deselected, and pytest says how many."""
    kept, dropped = [], []
    for item in items:
        own = item.path.name.startswith("test_worker")
        (dropped if own or "start_proxy" not in getattr(item, "fixturenames", ()) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    return kept


@pytest.fixture(scope="session", autouse=True)
def user_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The run's own ``XDG_CACHE_HOME`` (reports run as processes keep the archive of Spark's classes
    there), so the tests write nothing into the user's ~/.cache."""
    cache = tmp_path_factory.mktemp("xdg-cache")
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_CACHE_HOME", str(cache))
    yield cache
    patch.undo()


@pytest.fixture(scope="session")
def tansu() -> Iterator[TansuBroker]:
    with TansuBroker() as broker:
        yield broker


def _ephemeral_ports_start() -> int:
    """The first port of the kernel's ephemeral range: outgoing connections and ``bind(0)`` take theirs from it."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports this test process handed out: a port is free when checked, but a proxy binds its node
# ports seconds later, so none is handed out twice. Each pytest-xdist worker picks from its own
# slice of the range: a free check cannot see a port that another worker's proxy has not bound
# yet, and with workers both proxies would bind it (SO_REUSEPORT) and share its clients.
_HANDED_OUT: set[int] = set()


def _port_range() -> tuple[int, int]:
    """This test process's slice of [10000, the ephemeral range's start)."""
    top = _ephemeral_ports_start() - 1
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    size = (top - 10000) // max(count, 1)
    return 10000 + index * size, 10000 + (index + 1) * size - 1


def free_node_port_base(node_ids: list[int]) -> int:
    """A base such that base + every node id is a free port, below the ephemeral range. The proxy
    opens a broker's port when it learns of the broker, seconds after this check: a port in the
    ephemeral range could meanwhile be taken as the local port of any outgoing connection (it was,
    once, under two test workers: "cannot listen on 127.0.0.1:33992: Address already in use")."""
    lowest, highest = _port_range()
    highest -= max(node_ids, default=0)
    for _ in range(200):
        base = random.randint(lowest, highest)
        ports = [base + n for n in node_ids]
        if _HANDED_OUT.intersection(ports):
            continue
        try:
            socks = []
            for port in ports:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            _HANDED_OUT.update(ports)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free node port range")


def free_listen_port() -> int:
    """A free port for a proxy's listener or admin port, below the ephemeral range for the same reason
    (a bootstrap port from ``bind(0)`` was taken by an outgoing connection before the proxy bound it)."""
    return free_node_port_base([0])


@dataclass
class ProxyProcess:
    config: dict[str, Any]
    config_path: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    returncode: int | None = None
    extra_args: list[str] = field(default_factory=list)
    # The whole command line instead of this checkout's `run` (deploy tests run the exact
    # command lines of the Dockerfile, the systemd unit and the chart).
    command: list[str] | None = None
    # Set: config_path is the config.yaml of this kubelet-style ConfigMap volume, and every
    # write is an update as kubelet makes it (a ..data symlink swap), never an edit.
    volume: ConfigMapDir | None = None
    command_prefix: list[str] = field(default_factory=list)  # e.g. ["prlimit", "--as=N"]

    def pids(self) -> list[int]:
        """The proxy's running processes: itself, or its supervisor and workers."""
        assert self.process is not None
        return living(process_tree(self.process.pid))

    def rss_kib(self) -> int:
        """The proxy's resident memory: with workers, the supervisor's and every worker's summed
        (a bound on the supervisor's alone would hold whatever its workers grew)."""
        return sum(rss_kib(pid) for pid in self.pids())

    @property
    def bootstrap(self) -> str:
        return self.config["listeners"][0]["bind"]

    def listener_bind(self, name: str) -> str:
        return next(lst["bind"] for lst in self.config["listeners"] if lst["name"] == name)

    @property
    def admin_url(self) -> str:
        return f"http://{self.config['admin']['bind']}"

    def write_config(self, text: str | None = None) -> None:
        """Write ``text`` (default: ``self.config``) as the config file, or update the volume with it."""
        text = yaml.safe_dump(self.config) if text is None else text
        if self.volume is not None:
            self.volume.update({self.config_path.name: text.encode()})
        else:
            self.config_path.write_text(text)

    def start(self) -> ProxyProcess:
        self.write_config()
        self._log = self.log_path.open("ab")
        command = self.command or [
            sys.executable,
            "-m",
            "proxy.cli",
            "run",
            "--config",
            str(self.config_path),
            *self.extra_args,
        ]
        self.process = subprocess.Popen(
            [*self.command_prefix, *command], stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT
        )
        host, port = self.config["admin"]["bind"].rsplit(":", 1)
        try:
            # The admin port opens last, once every listener is bound; probing it
            # leaves the listeners' connection counters untouched.
            wait_for_port(host, int(port), timeout=20)
        except TimeoutError:
            self.stop()
            raise AssertionError(f"proxy did not start:\n{self.log()}") from None
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.admin_url + path, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """The samples of ``name`` in /metrics: (labels, value)."""
        _, text = self.get("/metrics")
        return [
            (sample.labels, sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        ]

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``."""
        return sum(
            (value for found, value in self.samples(name) if all(found.get(k) == v for k, v in labels.items())),
            0.0,
        )

    def audit_instances(self, instance_id: str) -> set[str]:
        """The audit instances of this proxy: ``instance_id`` itself, and with ``workers: N``
        each worker's ``<instance_id>-w<i>`` as well (docs/workers.md)."""
        workers = int(self.config.get("workers", 1))
        return {instance_id} | ({f"{instance_id}-w{w}" for w in range(workers)} if workers > 1 else set())

    def deciding_instances(self, instance_id: str) -> set[str]:
        """The audit instances whose events carry this proxy's decisions: with ``workers: N`` each
        worker's own (the supervisor writes windows and the connections' opens), else the proxy's."""
        return self.audit_instances(instance_id) - {instance_id} or {instance_id}

    def reloads(self) -> dict[str, float]:
        """``kafka_admission_config_reloads_total`` by outcome."""
        return {labels["outcome"]: value for labels, value in self.samples("kafka_admission_config_reloads_total")}

    def reload(self, text: str | None = None, *, expect: str = "success", **policies: Any) -> None:
        """Write the config file (``text``, or the config with these policy changes), send
        SIGHUP (none to a proxy whose config is a ConfigMap volume: its file watcher sees the
        update), wait until the proxy has reloaded it and check the outcome it counted."""
        before = self.reloads()
        if text is None:
            self.config.setdefault("policies", {}).update(policies)
        self.write_config(text)
        sighup = self.volume is None
        if sighup:
            self.signal(signal.SIGHUP)

        def counted() -> list[str]:
            return [outcome for outcome, value in self.reloads().items() if value > before[outcome]]

        # The watcher polls each second and waits one more for the files to settle.
        outcomes = wait_until(counted, timeout=5 if sighup else 8)
        assert outcomes == [expect], f"reload counted as {outcomes}, not {expect}:\n{self.log()[-3000:]}"

    def signal(self, signum: int = signal.SIGTERM) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def wait(self, timeout: float = 30) -> int:
        assert self.process is not None
        self.returncode = self.process.wait(timeout=timeout)
        return self.returncode

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, timeout=15)
            self.returncode = self.process.returncode
            self._log.close()


PROXY_LOG_TAIL = 30_000  # characters of a failed test's proxy log shown in its report


@pytest.fixture
def start_proxy(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """``start_proxy(bootstrap, **overrides)`` runs the proxy CLI on free ports; with
    ``configmap=True`` its config file is in a kubelet-style ConfigMap volume. Under
    ``--proxy-workers=N`` its config says ``workers: N`` unless the test sets ``workers``."""
    started: list[ProxyProcess] = []
    workers: int = request.config.getoption("--proxy-workers")

    def start(
        bootstrap: str | list[str],
        *,
        node_ids: tuple[int, ...] = (TansuBroker.NODE_ID,),
        listeners: list[dict[str, Any]] | None = None,
        extra_args: list[str] | None = None,
        configmap: bool = False,
        command_prefix: list[str] | None = None,
        **sections: Any,
    ) -> ProxyProcess:
        servers = [bootstrap] if isinstance(bootstrap, str) else bootstrap
        if listeners is None:
            listeners = [{"name": "external"}]
        for lst in listeners:
            lst.setdefault("bind", f"127.0.0.1:{free_listen_port()}")
            lst.setdefault("node_port_base", free_node_port_base(list(node_ids)))
        if workers > 1:
            sections.setdefault("workers", workers)
        config: dict[str, Any] = {
            "upstream": {"bootstrap_servers": servers},
            "listeners": listeners,
            "admin": {"bind": f"127.0.0.1:{free_listen_port()}"},
            **sections,
        }
        n = len(started)
        volume = ConfigMapDir(tmp_path / f"proxy{n}-configmap") if configmap else None
        proxy = ProxyProcess(
            config,
            Path(volume.path("config.yaml")) if volume else tmp_path / f"proxy{n}.yaml",
            tmp_path / f"proxy{n}.log",
            extra_args=extra_args or [],
            volume=volume,
            command_prefix=command_prefix or [],
        )
        started.append(proxy.start())
        return proxy

    yield start
    call = request.node.stash.get(CALL_REPORT, None)
    died = []
    for n, proxy in enumerate(started):
        proxy.stop()
        if call is not None and call.failed:
            # What the proxy said is often the only account of a failure seen once, in CI.
            request.node.add_report_section("teardown", f"proxy{n} log", proxy.log()[-PROXY_LOG_TAIL:])
        died += [f"proxy{n}: {line}" for line in _WORKER_DIED.findall(proxy.log())]
    # The supervisor restarts a worker that dies, so a test that checks that the proxy's process
    # still runs would not see a crash: only a test that kills or stops a worker itself expects one.
    if died and request.node.get_closest_marker("kills_workers") is None:
        pytest.fail("a worker died during the test and was restarted:\n" + "\n".join(died), pytrace=False)


_WORKER_DIED = re.compile(r"^.*worker \d+ exited with status .*; restarting it.*$", re.MULTILINE)


@dataclass(frozen=True)
class Certs:
    ca_file: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A test CA (trustme) with a server cert for 127.0.0.1/localhost and a client cert."""
    d = tmp_path_factory.mktemp("certs")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client@example.com")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    server.cert_chain_pems[0].write_to_path(str(d / "server.pem"))
    server.private_key_pem.write_to_path(str(d / "server.key"))
    client.cert_chain_pems[0].write_to_path(str(d / "client.pem"))
    client.private_key_pem.write_to_path(str(d / "client.key"))
    for key in ("server.key", "client.key"):
        (d / key).chmod(0o600)  # as an operator keeps them (the proxy warns about keys others can read)
    return Certs(
        str(d / "ca.pem"),
        str(d / "server.pem"),
        str(d / "server.key"),
        str(d / "client.pem"),
        str(d / "client.key"),
    )


def wait_until(predicate: Any, timeout: float = 10.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)
