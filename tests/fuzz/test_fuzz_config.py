"""Hostile config files: real configs (the shipped example, the demo's, and one
using every section) mutated as text — bytes flipped, lines dropped, doubled,
swapped and re-indented, values replaced by YAML's tricky scalars. The loader
never raises anything but ``ConfigError``, whose message is one line per
problem; and a config it accepts is printed by check-config in a form it
accepts again, unchanged."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import trustme
import yaml
from hypothesis import given
from hypothesis import strategies as st

from proxy.config.model import Config, ConfigError, parse_config_text
from tests.conftest import ROOT
from tests.fuzz.budget import CONFIG_FUZZ_SETTINGS, Counter
from tests.fuzz.mutations import mutated

_FILES = Path(tempfile.mkdtemp(prefix="fuzz-config-"))
# Real certificates: the loader inspects them (key matches, dates, chain order).
_CA = trustme.CA()
_SERVER = _CA.issue_cert("kafka.example.com")
_CA.cert_pem.write_to_path(str(_FILES / "ca.pem"))
_SERVER.cert_chain_pems[0].write_to_path(str(_FILES / "server.pem"))
_SERVER.private_key_pem.write_to_path(str(_FILES / "server.key"))

FULL = f"""\
mode: cluster
upstream:
  bootstrap_servers: ["127.0.0.1:9092", "127.0.0.2:9092"]
  tls: {{enabled: true, ca_file: {_FILES}/ca.pem, server_hostname: kafka.internal}}
listeners:
  - name: external
    bind: "0.0.0.0:29092"
    advertised_host: kafka.example.com
    node_port_base: 29100
    tls:
      cert_file: {_FILES}/server.pem
      key_file: {_FILES}/server.key
      ca_file: {_FILES}/ca.pem
      client_auth: required
  - name: internal
    bind: "127.0.0.1:29093"
    protected: true
admin:
  bind: "127.0.0.1:9464"
policies:
  mode: observe
  socket.request.max.bytes: 104857600
  max.response.size: 104857600
  listener.name.internal.max.response.size: 1048576
  max.connections: 1000
  listener.name.internal.max.connections: 100
  max.connections.per.ip: 50
  max.ssl.connections: 500
  connections.max.idle.ms: 600000
  group.max.size: 10
  group.consumer.max.size: 20
  queued.max.request.bytes: 209715200
  request.body.timeout.ms: 10000
  resource.identifier.limit.enable: true
  response.size.mode: enforce
audit:
  path: null
"""
BASES = [
    FULL,
    (ROOT / "deploy" / "config.example.yaml").read_text(),
    (ROOT / "demo" / "demo-config.yaml").read_text(),
]
TRICKY = [
    "yes",
    "no",
    "on",
    "off",
    "~",
    "null",
    "''",
    '"100"',
    "0x10",
    "010",
    "1_000",
    "1:30",
    "1e3",
    ".inf",
    "-1",
    "0",
    "2147483648",
    "9" * 30,
    "[]",
    "{}",
    "[a, b]",
    "{a: 1}",
    "&a x",
    "*a",
    "!!binary aGk=",
    "!!python/object:os.system",
    "|\n  text",
    ">-\n  folded",
    "'unterminated",
    "2026-11-23",
    "true",
    "\t",
    "- item",
    "key: value",
    "<<: {a: 1}",
]


def _edit_lines(text: str, edits: list[tuple[int, int, int, int]]) -> str:
    lines = text.splitlines()
    for op, i, j, k in edits:
        if not lines:
            break
        i, j = i % len(lines), j % len(lines)
        if op == 0:
            del lines[i]
        elif op == 1:
            lines.insert(j, lines[i])  # a key written twice
        elif op == 2:
            lines[i], lines[j] = lines[j], lines[i]
        elif op == 3:
            lines[i] = " " * (k % 7) + lines[i].lstrip()
        elif op == 4:
            head, sep, _ = lines[i].partition(": ")
            lines[i] = f"{head}{sep or ': '}{TRICKY[k % len(TRICKY)]}"
        elif op == 5:
            lines.insert(j, TRICKY[k % len(TRICKY)])
    return "\n".join(lines) + "\n"


line_edits = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 200), st.integers(0, 200), st.integers(0, 99)), min_size=1, max_size=4
)
texts = st.one_of(
    st.tuples(st.sampled_from(BASES), line_edits).map(lambda t: _edit_lines(*t)),
    st.sampled_from(BASES).flatmap(lambda base: mutated(base.encode())).map(lambda b: b.decode("utf-8", "replace")),
)

_counter = Counter("config loader, mutated YAML (hypothesis)")


def test_every_base_is_a_valid_config() -> None:
    for base in BASES:
        assert isinstance(parse_config_text(base), Config)


@CONFIG_FUZZ_SETTINGS
@given(text=texts)
def test_a_mutated_config_is_a_config_or_one_line_per_problem(text: str) -> None:
    _counter()
    try:
        config = parse_config_text(text, "fuzzed.yaml")
    except ConfigError as exc:
        lines = str(exc).split("\n")
        assert lines and all(line.strip() for line in lines), repr(str(exc))
        assert all(len(line) < 2000 for line in lines)
        assert "Traceback" not in str(exc)
        return
    # Accepted: what check-config prints reads back as the same config.
    printed = yaml.safe_dump(config.effective(), sort_keys=False)
    assert parse_config_text(printed, "effective.yaml") == config


@pytest.fixture(scope="module", autouse=True)
def _report_counts() -> object:
    yield
    _counter.done()
