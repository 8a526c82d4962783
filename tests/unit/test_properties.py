"""policies/properties.py is the one home of the Kafka property names, defaults and bounds: the
proxy's config parses them as it says, and its value check refuses what the config refuses."""

from __future__ import annotations

import ast
import re
from typing import Any

import pytest

from policies.api_keys import INT_MAX
from policies.properties import (
    GROUP_MAX_SIZE,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_IP_OVERRIDES,
    PROPERTIES,
    QUEUED_MAX_REQUEST_BYTES,
    RESOURCE_IDENTIFIER_LIMIT_ENABLE,
    check_values,
    int_default,
    per_listener,
)
from proxy.config.model import ConfigError, Policies, parse_config
from tests.conftest import ROOT


def _config(policies: dict[str, Any]) -> dict[str, Any]:
    return {
        "upstream": {"bootstrap_servers": ["127.0.0.1:9092"]},
        "listeners": [{"name": "external", "bind": "127.0.0.1:29092"}],
        "policies": policies,
    }


def test_the_config_takes_every_property_with_its_default() -> None:
    assert {name: Policies().flat()[name] for name in PROPERTIES} == {
        name: prop.default for name, prop in PROPERTIES.items()
    }


def test_kafka_defaults_as_kafka_has_them() -> None:
    assert int_default(MAX_CONNECTIONS) == INT_MAX
    assert int_default(GROUP_MAX_SIZE) == INT_MAX
    assert int_default(QUEUED_MAX_REQUEST_BYTES) == -1
    assert PROPERTIES[RESOURCE_IDENTIFIER_LIMIT_ENABLE].default is False
    assert all(prop.meaning for prop in PROPERTIES.values())
    with pytest.raises(TypeError, match=MAX_CONNECTIONS_PER_IP_OVERRIDES):
        int_default(MAX_CONNECTIONS_PER_IP_OVERRIDES)


def test_a_listener_key_is_kafkas() -> None:
    assert per_listener("external", MAX_CONNECTIONS) == "listener.name.external.max.connections"


@pytest.mark.parametrize("name", [name for name, prop in PROPERTIES.items() if prop.at_least is not None])
def test_a_value_below_its_bound_is_refused_by_the_check_and_the_config_alike(name: str) -> None:
    low = PROPERTIES[name].at_least
    assert low is not None
    check_values({name: low})
    with pytest.raises(ValueError, match=re.escape(f"{name} must be >= {low}")):
        check_values({name: low - 1})
    with pytest.raises(ConfigError, match=re.escape(f"policies.{name}: ")):
        parse_config(_config({name: low - 1}))


@pytest.mark.parametrize("name", [name for name, prop in PROPERTIES.items() if prop.at_most is not None])
def test_a_value_above_its_bound_is_refused_by_the_check_and_the_config_alike(name: str) -> None:
    high = PROPERTIES[name].at_most
    assert high is not None
    with pytest.raises(ValueError, match=re.escape(f"{name} must be <= {high}")):
        check_values({name: high + 1})
    with pytest.raises(ConfigError, match=re.escape(f"policies.{name}: ")):
        parse_config(_config({name: high + 1}))


def test_the_check_refuses_a_wrong_type_and_an_unknown_name() -> None:
    with pytest.raises(ValueError, match=re.escape("group.max.size must be of type int, got True")):
        check_values({GROUP_MAX_SIZE: True})
    with pytest.raises(ValueError, match=re.escape("resource.identifier.limit.enable must be of type bool, got 1")):
        check_values({RESOURCE_IDENTIFIER_LIMIT_ENABLE: 1})
    with pytest.raises(ValueError, match=re.escape("group.max.sizes is not a property the proxy takes")):
        check_values({"group.max.sizes": 5})


def test_the_pipeline_imports_nothing_of_the_proxy() -> None:
    """The report reads the properties from policies/, not the proxy's config (one home for them)."""
    imported = set()
    for path in (ROOT / "pipeline").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {(path.name, alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add((path.name, node.module))
    assert [(name, module) for name, module in sorted(imported) if module.split(".")[0] == "proxy"] == []
    assert ("limits.py", "policies.properties") in imported
