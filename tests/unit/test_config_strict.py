"""The config loader is strict and complete: duplicated keys, loose types and
misplaced keys are errors naming the key and the rule, every problem of a file
is reported in one pass, one line each."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy.config.model import ConfigError, parse_config_text

HEAD = """\
upstream:
  bootstrap_servers: ["127.0.0.1:9092"]
listeners:
  - name: external
    bind: "127.0.0.1:29092"
"""


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config_text(text, "proxy.yaml")
    return str(info.value).splitlines()


def test_a_top_level_key_written_twice_is_named_with_both_lines() -> None:
    text = HEAD + "policies:\n  group.max.size: 3\npolicies:\n  group.max.size: 5\n"
    assert errors_of(text) == [
        "policies: duplicate key (lines 6 and 8); YAML would keep only the last, so write it once"
    ]


def test_duplicates_at_every_level_are_all_named() -> None:
    text = (
        "upstream:\n  bootstrap_servers: ['127.0.0.1:9092']\n"
        "listeners:\n  - name: a\n    bind: '127.0.0.1:1'\n    name: b\n"
        "policies:\n  group.max.size: 3\n  group.max.size: 5\n"
    )
    assert errors_of(text) == [
        "listeners[0].name: duplicate key (lines 4 and 6); YAML would keep only the last, so write it once",
        "policies.group.max.size: duplicate key (lines 8 and 9); YAML would keep only the last, so write it once",
    ]


def test_a_key_set_once_and_merged_from_an_anchor_is_not_a_duplicate() -> None:
    text = (
        "upstream:\n  bootstrap_servers: ['127.0.0.1:9092']\n"
        "defaults: &d {advertised_host: 10.0.0.1, node_port_base: 30000}\n"
    )
    # `defaults` is an unknown key, but the merge itself is fine: an explicit key overrides a merged one.
    text += "listeners:\n  - {<<: *d, name: a, bind: '127.0.0.1:1', node_port_base: 31000}\n"
    assert errors_of(text) == ["defaults: unknown key"]


@pytest.mark.parametrize("word", ["yes", "no", "on", "off", "y", "Yes", "ON"])
def test_yaml_1_1_booleans_are_not_booleans(word: str) -> None:
    text = HEAD + f"policies:\n  resource.identifier.limit.enable: {word}\n"
    assert errors_of(text) == [f"policies.resource.identifier.limit.enable: must be true or false, got {word!r}"]


@pytest.mark.parametrize("value", ["1", "0"])
def test_numbers_are_not_booleans(value: str) -> None:
    text = HEAD.replace('bind: "127.0.0.1:29092"', f'bind: "127.0.0.1:29092"\n    protected: {value}')
    assert errors_of(text) == [f"listeners[0].protected: must be true or false, got {value}"]


@pytest.mark.parametrize(
    ("written", "expected"), [("true", True), ("false", False), ('"true"', True), ("'FALSE'", False)]
)
def test_true_and_false_are_booleans_also_quoted_as_kafka_reads_them(written: str, expected: bool) -> None:
    config = parse_config_text(HEAD + f"policies:\n  resource.identifier.limit.enable: {written}\n")
    assert config.policies.resource_identifier_limit_enable is expected


@pytest.mark.parametrize("written", ['"100"', "'100'", "010", "0x64", "1_000", "1:40"])
def test_a_number_in_quotes_or_in_a_non_decimal_form_is_not_an_int(written: str) -> None:
    text = HEAD + f"policies:\n  group.max.size: {written}\n"
    shown = written.strip("\"'")
    assert errors_of(text) == [
        f"policies.group.max.size: must be an integer, got the string {shown!r} (write numbers without quotes)"
    ]


def test_a_fraction_is_not_an_int() -> None:
    assert errors_of(HEAD + "policies:\n  request.body.timeout.ms: 1.5\n") == [
        "policies.request.body.timeout.ms: must be an integer, got 1.5"
    ]


def test_plain_numbers_are_ints() -> None:
    config = parse_config_text(HEAD + "policies:\n  group.max.size: 100\n  connections.max.idle.ms: -1\n")
    assert (config.policies.group_max_size, config.policies.connections_max_idle_ms) == (100, -1)


def test_a_policy_key_at_the_top_level_says_where_it_belongs() -> None:
    assert errors_of(HEAD + "group.max.size: 5\npolicies: {}\n") == [
        "group.max.size: unknown key at the top level; it belongs under policies:"
    ]


def test_per_listener_policy_and_other_section_keys_at_the_top_level_say_where_they_belong() -> None:
    text = HEAD + "listener.name.external.max.connections: 5\nbootstrap_servers: []\nbind: '0.0.0.0:1'\n"
    assert errors_of(text) == [
        "listener.name.external.max.connections: unknown key at the top level; it belongs under policies:",
        "bootstrap_servers: unknown key at the top level; it belongs under upstream: or audit:",
        "bind: unknown key at the top level; it belongs under listeners: or admin:",
    ]


def test_field_and_cross_field_errors_are_reported_in_one_pass() -> None:
    text = (
        "upstream:\n  bootstrap_servers: ['127.0.0.1:9092']\n"
        "listeners:\n"
        "  - {name: a, bind: '127.0.0.1:1'}\n"
        "  - {name: a, bind: '127.0.0.1:1'}\n"
        "  - {name: 'b c', bind: nope}\n"
        "policies:\n"
        "  socket.request.max.bytes: 0\n"
        "  listener.name.typo.max.response.size: 5\n"
        "  max.connections.per.ip: 0\n"
    )
    assert errors_of(text) == [
        "listeners[2].name: String should match pattern '^[A-Za-z0-9_.-]+$'",
        "listeners[2].bind: bind must be 'host:port' with a port 0-65535, got 'nope'",
        "policies.socket.request.max.bytes: Input should be greater than or equal to 1",
        "policies: max.connections.per.ip can be set to zero only if max.connections.per.ip.overrides is set",
        "listener names must be unique: a more than once",
        "policies: listener.name.typo.* names no configured listener (have: ['a', 'b c'])",
        "listener bind addresses must be unique: 127.0.0.1:1 more than once",
    ]


def test_a_rule_over_keys_with_errors_of_their_own_stays_quiet() -> None:
    # The pool rule compares queued.max.request.bytes with socket.request.max.bytes;
    # with the latter invalid it has nothing to compare, so only the field error shows.
    text = HEAD + "policies:\n  socket.request.max.bytes: '100'\n  queued.max.request.bytes: 1000\n"
    assert errors_of(text) == [
        "policies.socket.request.max.bytes: must be an integer, got the string '100' (write numbers without quotes)"
    ]


def test_a_malformed_per_listener_key_is_named_with_its_form() -> None:
    assert errors_of(HEAD + "policies:\n  listener.name.external: 5\n  group.max.size: 0\n") == [
        "policies.group.max.size: Input should be greater than or equal to 1",
        "policies.listener.name.external: unknown key; write per-listener keys as listener.name.<listener>.<property>",
    ]


def test_a_password_in_the_yaml_is_refused_pointing_to_file_or_environment() -> None:
    text = HEAD.replace("bootstrap_servers", "tls: {key_password: hunter2}\n  bootstrap_servers")
    message = errors_of(text)
    assert message == [
        "upstream.tls.key_password: unknown key; passwords are never written in the config: "
        "use key_password_file or key_password_env"
    ]
    assert "hunter2" not in "\n".join(message)


def test_a_yaml_syntax_error_is_one_line_with_file_line_and_column() -> None:
    (line,) = errors_of(HEAD + "policies: [\n")
    assert line.startswith("proxy.yaml line 7, column 1: not valid YAML: "), line
    assert "node content" in line  # libyaml and PyYAML word it differently


def test_check_config_exits_2_with_every_problem_one_line_each(tmp_path: Path) -> None:
    path = tmp_path / "loose.yaml"
    path.write_text(HEAD + "group.max.size: 5\npolicies:\n  resource.identifier.limit.enable: yes\n")
    result = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", "--config", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"config error in {path}:",
        "policies.resource.identifier.limit.enable: must be true or false, got 'yes'",
        "group.max.size: unknown key at the top level; it belongs under policies:",
    ]


def test_python_field_names_are_not_keys_kafka_names_are() -> None:
    text = HEAD + "policies:\n  queued_max_request_bytes: 500\n  group_join_rate_per_minute: 0\n"
    assert errors_of(text) == [
        "policies.queued_max_request_bytes: unknown key (did you mean 'queued.max.request.bytes'?)",
        "policies.group_join_rate_per_minute: unknown key (did you mean 'group.join.rate.per.minute'?)",
    ]


@pytest.mark.parametrize(
    ("policies", "rule"),
    [
        ("queued.max.request.bytes: 500", "queued.max.request.bytes (500) must be <= 0 (off) or >= "),
        ("group.join.rate.per.minute: 0", "group.join.rate.per.minute must be -1 (off) or at least 1, got 0"),
        ("max.connections.per.ip: 0", "max.connections.per.ip can be set to zero only if"),
        ("listener.name.external.max.connections: 0", "listener.name.external.max.connections"),
    ],
)
def test_kafkas_rules_across_keys_are_applied_to_the_values_written(policies: str, rule: str) -> None:
    (line,) = errors_of(HEAD + f"policies:\n  {policies}\n")
    assert line.startswith("policies") and rule in line, line
