"""``tls: passthrough`` in the config: what a passthrough listener needs, and which
policies are refused for it (one line each) or simply do not reach it."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config.model import ConfigError, parse_config

BASE: dict[str, Any] = {"upstream": {"bootstrap_servers": ["127.0.0.1:9092"]}}
PASSTHROUGH = {"name": "mtls", "bind": "127.0.0.1:9093", "tls": "passthrough", "passthrough_brokers": {0: "b0:9093"}}


def error_lines(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    return str(caught.value).splitlines()


def test_a_passthrough_listener_terminates_nothing_and_counts_as_ssl() -> None:
    config = parse_config({**BASE, "listeners": [PASSTHROUGH]})
    (listener,) = config.listeners
    assert listener.passthrough and listener.termination is None
    assert listener.security_protocol == "SSL"
    assert listener.passthrough_addresses() == {0: ("b0", 9093)}
    assert config.tls_files() == []  # nothing of ours to load or watch
    # check-config's output reads back as the same config (JSON keys are strings)
    assert parse_config(config.effective()) == config


def test_listeners_without_passthrough_read_as_before() -> None:
    config = parse_config({**BASE, "listeners": [{"name": "plain", "bind": "127.0.0.1:9092"}]})
    assert config.listeners[0].tls is None and not config.listeners[0].passthrough


def test_passthrough_needs_its_brokers_and_takes_no_sasl_flag() -> None:
    listener = {"name": "mtls", "bind": "127.0.0.1:9093", "tls": "passthrough", "sasl": True}
    assert error_lines({**BASE, "listeners": [listener]}) == [
        "listeners[0]: tls: passthrough needs passthrough_brokers (node id: host:port of a broker's TLS listener)",
        "listeners[0]: sasl: true cannot apply to tls: passthrough (its frames are encrypted end to end)",
    ]


def test_passthrough_brokers_without_passthrough_and_a_bad_tls_value_are_named() -> None:
    listeners = [
        {"name": "plain", "bind": "127.0.0.1:9092", "passthrough_brokers": {0: "b0:9093"}},
        {"name": "typo", "bind": "127.0.0.1:9094", "tls": "pasthrough"},
    ]
    assert error_lines({**BASE, "listeners": listeners}) == [
        "listeners[0]: passthrough_brokers is only for a listener with tls: passthrough",
        "listeners[1].tls: must be a mapping (cert_file, key_file, ...) or 'passthrough', got 'pasthrough'",
    ]


def test_a_sidecar_passthrough_listener_has_one_broker() -> None:
    listener = {**PASSTHROUGH, "passthrough_brokers": {0: "b0:9093", 1: "b1:9093"}}
    assert error_lines({**BASE, "mode": "sidecar", "listeners": [listener]}) == [
        "listeners[0].passthrough_brokers: mode: sidecar relays to its one broker, got 2"
    ]


def test_frame_level_keys_written_for_a_passthrough_listener_are_refused_one_line_each() -> None:
    policies = {
        "listener.name.mtls.max.response.size": 1048576,
        "listener.name.mtls.max.connections": 10,  # connection-level: applies
        "listener.name.plain.max.response.size": 1048576,  # another listener: applies there
    }
    listeners = [PASSTHROUGH, {"name": "plain", "bind": "127.0.0.1:9092"}]
    assert error_lines({**BASE, "listeners": listeners, "policies": policies}) == [
        "policies: listener.name.mtls.max.response.size: listener mtls is tls: passthrough (its bytes are not "
        "decrypted), so max.response.size cannot apply to it; only max.connections can"
    ]


def test_broker_wide_frame_level_keys_are_accepted_beside_a_passthrough_listener() -> None:
    # Like Kafka's broker-wide defaults: they apply to every listener that reads frames.
    policies = {"max.response.size": 1048576, "socket.request.max.bytes": 1048576, "group.max.size": 10}
    config = parse_config({**BASE, "listeners": [PASSTHROUGH], "policies": policies})
    assert config.policies.max_response_size == 1048576
