"""Floods one client can send that once cost the proxy memory or its event loop
(issue 33, attacks 2 and 4), each against the running proxy in front of Tansu."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest

from proxy.tansu import TansuBroker
from tests.integration.test_bad_input import assert_still_serving, rss_kib

# A request header alone: length 10, api key, version, correlation id, null client id.
_HEADER = struct.Struct(">ihhih")
FLOOD_CONNECTIONS = 64
FLOOD_HEADERS_PER_CONNECTION = 4_681  # 64 KiB of 14-byte frames: one receive of the proxy's


@pytest.fixture
def own_tansu() -> Iterator[TansuBroker]:
    """A broker of its own: the flood's unknown APIs make it close connections by the thousand."""
    with TansuBroker() as broker:
        yield broker


def headers(pairs: list[tuple[int, int]]) -> bytes:
    return b"".join(_HEADER.pack(10, api_key, version, i, -1) for i, (api_key, version) in enumerate(pairs))


def send_and_wait_for_close(address: str, data: bytes) -> None:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        try:
            sock.sendall(data)
            while sock.recv(65536):
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass


def flood(address: str, pairs: list[tuple[int, int]]) -> None:
    n = FLOOD_HEADERS_PER_CONNECTION
    for i in range(0, len(pairs), n):
        send_and_wait_for_close(address, headers(pairs[i : i + n]))


def distinct_pairs(count: int) -> list[tuple[int, int]]:
    """API keys no Kafka has (1000 up), and known keys at versions none has (100 up)."""
    pairs = []
    for api_key in (*range(2, 8), *range(1000, 1100)):
        pairs.extend((api_key, version) for version in range(100, 3100))
    return pairs[:count]


def requests_read(proxy) -> float:  # type: ignore[no-untyped-def]
    return sum(value for _, value in proxy.samples("kafka_admission_requests_total"))


def test_a_flood_of_distinct_api_versions_costs_no_memory(own_tansu, start_proxy) -> None:  # type: ignore[no-untyped-def]
    """300k request headers naming distinct (API key, version) pairs kio does not know,
    64 KiB of them per connection (the broker closes each at the first). On main each pair
    kept a plan until a reload: RSS +62 MiB (~218 bytes a pair); now +0-1 MiB. The bound,
    8 MiB, is the memory of ~38k pairs: the flood must have reached the proxy's request
    path (counted), and cost it next to nothing."""
    proxy = start_proxy(own_tansu.bootstrap)
    total = FLOOD_CONNECTIONS * FLOOD_HEADERS_PER_CONNECTION
    flood(proxy.bootstrap, [(1000, 0)] * total)  # the same pair: buffers and allocator warmed
    before, read_before = rss_kib(proxy.process.pid), requests_read(proxy)
    flood(proxy.bootstrap, distinct_pairs(total))
    growth_kib = rss_kib(proxy.process.pid) - before
    read = requests_read(proxy) - read_before
    assert read > total / 2, f"only {read} of {total} headers reached the proxy's request path"
    assert growth_kib < 8 * 1024, f"RSS grew {growth_kib} KiB after {read} distinct API versions"
    # Every key kio does not know is counted as one API: no series (and no entry) per key.
    unknown = [labels for labels, _ in proxy.samples("kafka_admission_requests_total") if labels["api"] == "unknown"]
    assert len(unknown) == 1
    assert_still_serving(proxy.bootstrap)
