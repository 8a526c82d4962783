"""Fixtures for the integration tests: librdkafka's mock cluster, stunnel, and how a
reload reaches the proxy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kafka_helpers import MockCluster, stunnel_binary


@pytest.fixture
def mock_cluster() -> Iterator[MockCluster]:
    """Three real mock brokers (node ids 1, 2, 3) on 127.0.0.1, for one test."""
    cluster = MockCluster(brokers=3)
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def stunnel_bin() -> str:
    binary = stunnel_binary()
    if binary is None:
        pytest.skip("stunnel4 not installed")
    return binary


@pytest.fixture(params=[False, True], ids=["sighup", "configmap"])
def configmap(request: pytest.FixtureRequest) -> bool:
    """How a test's reloads reach the proxy: an edit and SIGHUP, or (True: pass it as
    ``start_proxy(configmap=...)``) a ConfigMap update as kubelet makes it, no signal."""
    return bool(request.param)
