"""Config loading: defaults, and errors that name the key and the rule."""

import subprocess
import sys
from pathlib import Path

import pytest
import trustme
import yaml
from cryptography.hazmat.primitives import serialization

from policies.identifier_limits import CONFIG_KEYS, IdentifierLimits
from proxy.config.model import ConfigError, load_config, parse_config

MINIMAL = {
    "upstream": {"bootstrap_servers": ["127.0.0.1:9092"]},
    "listeners": [{"name": "external", "bind": "127.0.0.1:29092"}],
}


def with_(**changes):  # type: ignore[no-untyped-def]
    raw = yaml.safe_load(yaml.safe_dump(MINIMAL))
    raw.update(changes)
    return raw


def error_of(raw) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    return str(info.value)


def test_only_bootstrap_servers_and_listeners_are_required() -> None:
    config = parse_config(MINIMAL)
    effective = config.effective()
    assert effective["mode"] == "cluster"
    assert effective["admin"] == {"bind": "127.0.0.1:9464"}
    defaults = {
        "mode": "enforce",
        "socket.request.max.bytes": 104857600,
        "max.response.size": 104857600,
        "resource.identifier.limit.enable": False,
        "resource.identifier.max.length": 249,
    }
    assert {k: effective["policies"][k] for k in defaults} == defaults
    assert effective["audit"] == {
        "path": None,
        "instance_id": None,
        "max_file_bytes": 67108864,
        "max_file_seconds": 3600,
        "max_total_bytes": 1073741824,
        "queue_events": 65536,
        "window": {"seconds": 60},
        "topic": None,
        "bootstrap_servers": [],
        "producer": {},
        "topic_config": {},
        "topic_partitions": -1,
        "topic_replication_factor": -1,
    }
    assert effective["upstream"]["tls"]["enabled"] is False
    listener = effective["listeners"][0]
    assert listener["advertised_host"] == "127.0.0.1"
    assert listener["node_port_base"] == 29100
    assert listener["tls"] is None and listener["protected"] is False and listener["sasl"] is False


def test_missing_upstream_is_named() -> None:
    assert "upstream: Field required" in error_of({"listeners": MINIMAL["listeners"]})


def test_unknown_key_suggests_the_known_one() -> None:
    raw = with_(listeners=[{"name": "x", "bind": "127.0.0.1:1", "advertized_host": "h"}])
    assert error_of(raw) == "listeners[0].advertized_host: unknown key (did you mean 'advertised_host'?)"


def test_unknown_policy_key_suggests_the_kafka_name() -> None:
    message = error_of(with_(policies={"socket.request.max.byte": 5}))
    assert "policies.socket.request.max.byte: unknown key (did you mean 'socket.request.max.bytes'?)" in message


def test_socket_request_max_bytes_must_be_positive() -> None:
    message = error_of(with_(policies={"socket.request.max.bytes": 0}))
    assert message.startswith("policies.socket.request.max.bytes:")
    assert "greater than or equal to 1" in message


def test_sasl_server_max_receive_size_is_kafkas_and_must_be_positive() -> None:
    assert parse_config(MINIMAL).policies.sasl_server_max_receive_size == 524288
    message = error_of(with_(policies={"sasl.server.max.receive.size": 0}))
    assert message.startswith("policies.sasl.server.max.receive.size:")
    assert "greater than or equal to 1" in message


@pytest.mark.parametrize(
    ("sasl", "tls", "protocol"),
    [(False, False, "PLAINTEXT"), (True, False, "SASL_PLAINTEXT"), (False, True, "SSL"), (True, True, "SASL_SSL")],
)
def test_a_listener_speaks_kafkas_security_protocol(sasl: bool, tls: bool, protocol: str, certs) -> None:  # type: ignore[no-untyped-def]
    listener = {"name": "x", "bind": "127.0.0.1:1", "sasl": "TRUE" if sasl else False}
    if tls:
        listener["tls"] = {"cert_file": certs.server_cert, "key_file": certs.server_key}
    assert parse_config(with_(listeners=[listener])).listeners[0].security_protocol == protocol


def test_listener_sasl_is_true_or_false() -> None:
    message = error_of(with_(listeners=[{"name": "x", "bind": "127.0.0.1:1", "sasl": "yes"}]))
    assert message == "listeners[0].sasl: must be true or false, got 'yes'"


def test_bootstrap_server_without_port_is_refused() -> None:
    message = error_of(with_(upstream={"bootstrap_servers": ["broker"]}))
    assert "upstream.bootstrap_servers" in message and "host:port" in message


def test_missing_tls_files_are_found_at_load_time(tmp_path: Path) -> None:
    key = tmp_path / "k.pem"
    key.write_text("x")
    raw = with_(
        listeners=[
            {"name": "x", "bind": "127.0.0.1:1", "tls": {"cert_file": str(tmp_path / "nope.pem"), "key_file": str(key)}}
        ]
    )
    assert "listeners[0].tls.cert_file: file not found" in error_of(raw)


def test_client_auth_required_needs_a_ca(tmp_path: Path) -> None:
    pem = tmp_path / "c.pem"
    pem.write_text("x")
    raw = with_(
        listeners=[
            {
                "name": "x",
                "bind": "127.0.0.1:1",
                "tls": {"cert_file": str(pem), "key_file": str(pem), "client_auth": "required"},
            }
        ]
    )
    assert "needs ca_file" in error_of(raw)


def test_mode_must_be_cluster_or_sidecar() -> None:
    assert "mode:" in error_of(with_(mode="mesh"))


def test_listener_names_must_be_unique() -> None:
    raw = with_(listeners=[{"name": "a", "bind": "127.0.0.1:1"}, {"name": "a", "bind": "127.0.0.1:2"}])
    assert "unique" in error_of(raw)


def test_a_missing_audit_directory_is_created(tmp_path: Path) -> None:
    parse_config(with_(audit={"path": str(tmp_path / "new" / "audit")}))
    assert (tmp_path / "new" / "audit").is_dir()


def test_audit_path_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_text("")
    message = error_of(with_(audit={"path": str(tmp_path / "events.jsonl")}))
    assert message.startswith("audit.path: must be a directory") and "\n" not in message


def test_audit_path_that_cannot_be_created_is_named() -> None:
    message = error_of(with_(audit={"path": "/proc/self/audit"}))
    assert message.startswith("audit.path: cannot create directory '/proc/self/audit'")


def test_audit_total_must_hold_one_file() -> None:
    message = error_of(with_(audit={"max_file_bytes": 10_000_000, "max_total_bytes": 5_000_000}))
    assert message == "audit.max_total_bytes: must be >= max_file_bytes (10000000), got 5000000"


def test_audit_instance_id_must_be_safe_in_a_file_name() -> None:
    assert error_of(with_(audit={"instance_id": "../etc"})).startswith("audit.instance_id:")


def test_audit_window_seconds_must_be_positive() -> None:
    assert error_of(with_(audit={"window": {"seconds": 0}})).startswith("audit.window.seconds:")


def test_audit_instance_defaults_to_the_hostname() -> None:
    import socket

    assert parse_config(MINIMAL).audit.instance == socket.gethostname()
    assert parse_config(with_(audit={"instance_id": "proxy-7"})).audit.instance == "proxy-7"


def test_the_audit_topic_producer_and_topic_defaults_and_overrides() -> None:
    config = parse_config(with_(audit={"topic": "audit", "producer": {"compression.type": "lz4"}}))
    producer = config.audit.producer_config(config.upstream)
    assert producer["bootstrap.servers"] == "127.0.0.1:9092"  # the upstream's by default
    assert producer["enable.idempotence"] is True and producer["compression.type"] == "lz4"
    assert producer["linger.ms"] == 200 and producer["queue.buffering.max.kbytes"] == 16384
    assert "security.protocol" not in producer  # a plaintext upstream: a plaintext topic
    assert config.audit.new_topic_config == {"retention.ms": "604800000", "cleanup.policy": "delete"}
    own_settings = {"topic": "audit", "bootstrap_servers": ["10.0.0.1:9094"], "topic_config": {"retention.ms": 3600000}}
    own = parse_config(with_(audit=own_settings))
    assert own.audit.producer_config(own.upstream)["bootstrap.servers"] == "10.0.0.1:9094"
    assert own.audit.new_topic_config == {"retention.ms": "3600000", "cleanup.policy": "delete"}


def test_the_audit_topic_on_the_upstreams_brokers_reaches_them_with_the_upstreams_tls(tmp_path: Path) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("proxy.example")
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    leaf.cert_chain_pems[0].write_to_path(tmp_path / "proxy.pem")
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), None)
    encrypted = serialization.BestAvailableEncryption(b"s3cret")
    (tmp_path / "proxy.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encrypted)
    )
    (tmp_path / "key.pass").write_text("s3cret\n")
    tls = {
        "enabled": True,
        "ca_file": str(tmp_path / "ca.pem"),
        "cert_file": str(tmp_path / "proxy.pem"),
        "key_file": str(tmp_path / "proxy.key"),
        "key_password_file": str(tmp_path / "key.pass"),
    }
    raw = with_(audit={"topic": "audit"})
    raw["upstream"] = {**raw["upstream"], "tls": tls}
    config = parse_config(raw)
    producer = config.audit.producer_config(config.upstream)
    assert producer["security.protocol"] == "ssl" and producer["ssl.ca.location"] == str(tmp_path / "ca.pem")
    assert producer["ssl.certificate.location"] == str(tmp_path / "proxy.pem")
    assert producer["ssl.key.location"] == str(tmp_path / "proxy.key") and producer["ssl.key.password"] == "s3cret"
    # audit.producer has the last word; a topic on other brokers takes none of the upstream's TLS
    raw["audit"] = {"topic": "audit", "producer": {"ssl.ca.location": "/etc/audit/ca.pem"}}
    config = parse_config(raw)
    assert config.audit.producer_config(config.upstream)["ssl.ca.location"] == "/etc/audit/ca.pem"
    raw["audit"] = {"topic": "audit", "bootstrap_servers": ["10.0.0.1:9094"]}
    config = parse_config(raw)
    assert "security.protocol" not in config.audit.producer_config(config.upstream)


def test_an_audit_topic_cannot_take_an_upstream_server_hostname() -> None:
    raw = with_(audit={"topic": "audit"})
    raw["upstream"] = {**raw["upstream"], "tls": {"enabled": True, "server_hostname": "kafka.example"}}
    with pytest.raises(ConfigError, match=r"upstream\.tls\.server_hostname has no librdkafka equivalent"):
        parse_config(raw)
    raw["audit"]["bootstrap_servers"] = ["kafka.example:9093"]
    assert parse_config(raw).audit.bootstrap_servers == ("kafka.example:9093",)


@pytest.mark.parametrize(
    ("audit", "message"),
    [
        ({"producer": {"linger.ms": 5}}, "audit: audit.producer needs audit.topic (the audit topic's name)"),
        ({"topic": "a b"}, "audit.topic: String should match pattern '^[a-zA-Z0-9._-]{1,249}$'"),
        (
            {"topic": "t", "producer": {"lingerx.ms": 5}},
            'audit.producer: librdkafka refuses it: No such configuration property: "lingerx.ms"',
        ),
        (
            {"topic": "t", "producer": {"bootstrap.servers": "h:1"}},
            "audit.producer: 'bootstrap.servers' is set by audit.bootstrap_servers, not here",
        ),
        (
            {"topic": "t", "bootstrap_servers": ["nope"]},
            "audit.bootstrap_servers: each bootstrap server must be 'host:port' with a port 0-65535, got 'nope'",
        ),
        (
            {"topic": "t", "topic_partitions": 0},
            "audit.topic_partitions: must be -1 (the broker's default) or at least 1, got 0",
        ),
    ],
)
def test_a_bad_audit_topic_setting_is_one_line_naming_the_key(audit: dict[str, object], message: str) -> None:
    assert error_of(with_(audit=audit)) == message


def test_invalid_yaml_is_reported_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("upstream: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def _check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
    )


def test_check_config_prints_the_effective_config_and_exits_0(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(MINIMAL))
    result = _check_config(path)
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    assert printed["policies"]["socket.request.max.bytes"] == 104857600
    assert printed["listeners"][0]["node_port_base"] == 29100


def test_check_config_exits_2_naming_the_key_and_rule(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(with_(policies={"socket.request.max.bytes": -5})))
    result = _check_config(path)
    assert result.returncode == 2
    assert "policies.socket.request.max.bytes" in result.stderr
    assert "greater than or equal to 1" in result.stderr


def test_the_shipped_example_config_is_valid() -> None:
    root = Path(__file__).resolve().parents[2]
    config = load_config(root / "deploy" / "config.example.yaml")
    assert config.listeners[0].node_port_base == 29100


def test_the_demo_sample_config_is_valid() -> None:
    from demo.run import sample_config

    assert parse_config(sample_config("127.0.0.1:1")).upstream.bootstrap_servers == ("127.0.0.1:1",)


def test_per_listener_max_response_size_is_written_as_kafka_does() -> None:
    config = parse_config(with_(policies={"listener.name.external.max.response.size": 1000}))
    assert config.policies.max_response_size_for("external") == 1000
    assert config.effective()["policies"]["listener.name.external.max.response.size"] == 1000


def test_a_per_listener_key_for_an_unknown_listener_is_refused() -> None:
    message = error_of(with_(policies={"listener.name.internal.max.response.size": 1000}))
    assert "listener.name.internal.* names no configured listener" in message


def test_a_misspelt_per_listener_property_suggests_the_right_one() -> None:
    message = error_of(with_(policies={"listener.name.external.max.respons.size": 1}))
    assert message == (
        "policies.listener.name.external.max.respons.size: unknown key (did you mean 'max.response.size'?)"
    )


def test_policy_modes_are_enforce_or_observe() -> None:
    message = error_of(with_(policies={"response.size.mode": "dry-run"}))
    assert message == "policies.response.size.mode: Input should be 'enforce' or 'observe'"
    config = parse_config(with_(policies={"mode": "observe"}))
    assert config.policies.mode_of(config.policies.response_size_mode) == "observe"


def test_identifier_limits_from_kafka_style_properties() -> None:
    """The one parser of the KIP-1233 keys (IdentifierLimits has no parser of its own)."""
    properties = {
        "resource.identifier.limit.enable": "true",  # Kafka's properties spell booleans so
        "resource.identifier.max.length": 100,
        "member.id.max.length": 40,
        "classic.member.id.max.length": 36,
        "topic.name.max.length": 200,
        "offset.metadata.max.bytes": 1024,
        "resource.identifier.limit.error.code": 42,
    }
    assert parse_config(with_(policies=properties)).policies.identifier_limits() == IdentifierLimits(
        True, 100, 40, 36, 200, 1024, 42
    )
    assert parse_config(MINIMAL).policies.identifier_limits() == IdentifierLimits()


def test_every_identifier_limit_property_reaches_its_attribute() -> None:
    values = {key: True if attr == "enabled" else 100 + i for i, (key, attr) in enumerate(CONFIG_KEYS.items())}
    limits = parse_config(with_(policies=values)).policies.identifier_limits()
    assert {key: getattr(limits, attr) for key, attr in CONFIG_KEYS.items()} == values


@pytest.mark.parametrize(
    ("properties", "key"),
    [
        ({"resource.identifier.max.length": -1}, "resource.identifier.max.length"),
        ({"member.id.max.length": "36.5"}, "member.id.max.length"),
        ({"resource.identifier.limit.error.code": 0}, "resource.identifier.limit.error.code"),
        ({"resource.identifier.max.lenght": 1}, "resource.identifier.max.lenght"),
    ],
)
def test_bad_identifier_limit_properties_name_the_key(properties: dict[str, object], key: str) -> None:
    assert error_of(with_(policies=properties)).startswith(f"policies.{key}:")


def test_group_session_timeout_bounds_are_kafkas_keys_and_defaults() -> None:
    config = parse_config(MINIMAL).policies.group_size_config()
    assert (config.min_session_timeout_seconds, config.max_session_timeout_seconds) == (6.0, 1800.0)
    bounds = {"group.min.session.timeout.ms": 1000, "group.max.session.timeout.ms": 60000}
    config = parse_config(with_(policies=bounds)).policies.group_size_config()
    assert (config.min_session_timeout_seconds, config.max_session_timeout_seconds) == (1.0, 60.0)


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        (
            {"group.min.session.timeout.ms": 9000, "group.max.session.timeout.ms": 8000},
            "policies: group.min.session.timeout.ms must be at most group.max.session.timeout.ms, got 9000 > 8000",
        ),
        ({"group.max.session.timeout.ms": 0}, "policies.group.max.session.timeout.ms: Input should be greater"),
        ({"group.min.session.timeout.ms": -1}, "policies.group.min.session.timeout.ms: Input should be greater"),
        ({"group.min.session.timeout.ms": "6000"}, "policies.group.min.session.timeout.ms: must be an integer"),
    ],
)
def test_bad_group_session_timeout_bounds_name_the_key_and_the_rule(
    properties: dict[str, object], message: str
) -> None:
    assert error_of(with_(policies=properties)).startswith(message)
