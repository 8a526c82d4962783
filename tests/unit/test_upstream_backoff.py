"""Backoff from an upstream that speaks the wrong protocol (sans-I/O)."""

import pytest

from policies.upstream_backoff import UpstreamBackoff


def test_a_mismatch_blocks_new_connections_until_the_backoff_ends() -> None:
    backoff = UpstreamBackoff(initial_seconds=1, max_seconds=30)
    backoff.on_mismatch("b:9093", "speaks TLS", now=100.0)
    assert backoff.blocked("b:9093", 100.5) is not None
    assert backoff.blocked("b:9093", 101.0) is None
    assert backoff.blocked("other:9092", 100.5) is None


def test_repeated_mismatches_double_the_wait_up_to_the_cap() -> None:
    backoff = UpstreamBackoff(initial_seconds=1, max_seconds=5)
    waits = [backoff.on_mismatch("b", "speaks TLS", now=0.0).retry_at for _ in range(5)]
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_a_healthy_exchange_resets_the_backoff_and_readiness() -> None:
    backoff = UpstreamBackoff(initial_seconds=1, max_seconds=30)
    backoff.on_mismatch("b", "speaks TLS", now=0.0)
    backoff.on_mismatch("b", "speaks TLS", now=0.0)
    assert [m.upstream for m in backoff.known_mismatches()] == ["b"]
    backoff.on_healthy("b")
    assert backoff.known_mismatches() == []
    assert backoff.on_mismatch("b", "speaks TLS", now=10.0).retry_at == 11.0


def test_backoff_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="initial_seconds"):
        UpstreamBackoff(initial_seconds=0)
