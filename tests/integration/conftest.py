"""Fixtures for the integration tests: librdkafka's mock cluster and stunnel."""

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
