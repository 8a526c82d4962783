"""``${NAME}`` references in the config's string values: expanded once at load from the
environment, every unknown or malformed one named by key path, ``$${`` for a literal ``${``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.config.model import ConfigError, expand_environment, load_config, parse_config_text

HEAD = """\
upstream:
  bootstrap_servers: ["${BROKER}:9092"]
listeners:
  - name: external
    bind: "127.0.0.1:29092"
"""
RULE = "${NAME} is expanded from the environment at load; write $${ for a literal ${"


def errors_of(text: str, environ: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config_text(text, "proxy.yaml", environ)
    return str(info.value).splitlines()


def test_a_reference_is_replaced_by_the_variables_value() -> None:
    config = parse_config_text(HEAD, "proxy.yaml", {"BROKER": "kafka-0.kafka"})
    assert config.upstream.bootstrap_servers == ("kafka-0.kafka:9092",)


def test_references_expand_inside_a_string_and_several_in_one() -> None:
    raw = {"a": "/certs/${POD_NAME}.crt", "b": ["${X}-${Y}", "${X}${X}"], "c": 5, "d": None}
    assert expand_environment(raw, {"POD_NAME": "kafka-1", "X": "x", "Y": "y"}) == {
        "a": "/certs/kafka-1.crt",
        "b": ["x-y", "xx"],
        "c": 5,
        "d": None,
    }


def test_a_value_is_expanded_once_not_again() -> None:
    assert expand_environment({"a": "${A}"}, {"A": "${B}", "B": "no"}) == {"a": "${B}"}


def test_keys_stay_as_written() -> None:
    assert expand_environment({"${A}": "v"}, {"A": "x"}) == {"${A}": "v"}


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ("$${A}", "${A}"),
        ("price $5", "price $5"),
        ("^topic-.*$", "^topic-.*$"),
        ("$$", "$$"),
        ("$${A} and ${A}", "${A} and a"),
    ],
)
def test_a_literal_dollar_is_written_as_is_and_a_literal_reference_with_two(written: str, read: str) -> None:
    assert expand_environment({"k": written}, {"A": "a"}) == {"k": read}


def test_an_unset_variable_names_the_key_path_the_variable_and_the_rule() -> None:
    text = HEAD + "    tls:\n      cert_file: /certs/${POD_NAME}.crt\n      key_file: /certs/${POD_NAME}.key\n"
    assert errors_of(text, {"BROKER": "b"}) == [
        f"listeners[0].tls.cert_file: environment variable 'POD_NAME' is not set ({RULE})",
        f"listeners[0].tls.key_file: environment variable 'POD_NAME' is not set ({RULE})",
    ]


def test_every_unset_variable_is_named_in_one_pass() -> None:
    assert errors_of(HEAD, {}) == [
        f"upstream.bootstrap_servers[0]: environment variable 'BROKER' is not set ({RULE})",
    ]


@pytest.mark.parametrize("reference", ["${}", "${1A}", "${A B}", "${A", "${A:-default}"])
def test_a_malformed_reference_is_an_error(reference: str) -> None:
    (line,) = errors_of(HEAD.replace("${BROKER}:9092", reference), {"A": "a", "BROKER": "b"})
    assert line == f"upstream.bootstrap_servers[0]: malformed reference {reference!r} ({RULE})"


def test_an_empty_variable_is_its_empty_value() -> None:
    assert expand_environment({"a": "x${E}y"}, {"E": ""}) == {"a": "xy"}


def test_check_config_names_a_missing_variable_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(HEAD)
    env = {k: v for k, v in os.environ.items() if k != "BROKER"}
    result = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"config error in {path}:",
        f"upstream.bootstrap_servers[0]: environment variable 'BROKER' is not set ({RULE})",
    ]
    found = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        env={**env, "BROKER": "kafka-0"},
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    assert "kafka-0:9092" in found.stdout


def test_every_load_reads_the_environment_as_it_is_then(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reload (SIGHUP, the file watcher) is load_config again: it expands from os.environ anew."""
    path = tmp_path / "proxy.yaml"
    path.write_text(HEAD)
    monkeypatch.setenv("BROKER", "first")
    assert load_config(path).upstream.bootstrap_servers == ("first:9092",)
    monkeypatch.setenv("BROKER", "second")
    assert load_config(path).upstream.bootstrap_servers == ("second:9092",)
    monkeypatch.delenv("BROKER")
    with pytest.raises(ConfigError, match="'BROKER' is not set"):
        load_config(path)
