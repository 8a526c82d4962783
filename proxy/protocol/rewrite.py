"""Broker address rewriting (cluster mode): every broker address a client can
learn is replaced by this proxy's address for that node, so no client ever
connects to a broker directly.

The table below is the one place that says which responses are decoded for
it. Produce and Fetch carry addresses only in versions with ``NodeEndpoints``
(KIP-951: Produce v10+, Fetch v16+); ApiVersions is capped below those so their
hot path stays opaque bytes, and a client that uses them anyway still gets
rewritten addresses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from policies.api_keys import DESCRIBE_CLUSTER, FETCH, FIND_COORDINATOR, METADATA, PRODUCE
from proxy.protocol import wire

# In cluster mode, the newest Produce/Fetch versions the proxy advertises: their responses carry
# no NodeEndpoints (broker addresses to rewrite), so their bodies never need decoding.
NO_NODE_ENDPOINTS_MAX_VERSION = {PRODUCE: 9, FETCH: 15}
# Responses that carry broker addresses: api key -> (first version with addresses,
# the body attributes holding lists of nodes; "" = the body itself is the node).
_ADDRESS_FIELDS: dict[int, tuple[int, Callable[[int], tuple[str, ...]]]] = {
    METADATA: (0, lambda v: ("brokers",)),
    DESCRIBE_CLUSTER: (0, lambda v: ("brokers",)),
    FIND_COORDINATOR: (0, lambda v: ("coordinators",) if v >= 4 else ("",)),
    PRODUCE: (10, lambda v: ("node_endpoints",)),
    FETCH: (16, lambda v: ("node_endpoints",)),
}


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    node_id: int
    host: str
    port: int


AddressOf = Callable[[int], tuple[str, int]]


def carries_addresses(api_key: int, api_version: int) -> bool:
    entry = _ADDRESS_FIELDS.get(api_key)
    return entry is not None and api_version >= entry[0]


def _nodes(body: Any, attribute: str) -> Iterable[Any]:
    return (body,) if attribute == "" else getattr(body, attribute)


def _node_id(node: Any) -> int:
    # DescribeCluster names it broker_id; every other response node_id.
    return int(node.broker_id if hasattr(node, "broker_id") else node.node_id)


def brokers_in(body: Any, api_key: int, api_version: int) -> list[BrokerAddress]:
    """Broker addresses a response tells the client about (errors excluded)."""
    if not carries_addresses(api_key, api_version):
        return []
    found = []
    for attribute in _ADDRESS_FIELDS[api_key][1](api_version):
        for node in _nodes(body, attribute):
            if _node_id(node) >= 0 and node.port >= 0 and node.host:
                found.append(BrokerAddress(_node_id(node), node.host, int(node.port)))
    return found


def rewrite_addresses(body: Any, api_key: int, api_version: int, address_of: AddressOf) -> Any:
    """The same response with every node's host and port replaced by ``address_of``."""

    def moved(node: Any) -> Any:
        if _node_id(node) < 0 or not node.host:
            return node  # an error answer (e.g. no coordinator yet): nothing to point at
        host, port = address_of(_node_id(node))
        return dataclasses.replace(node, host=host, port=type(node.port)(port))

    for attribute in _ADDRESS_FIELDS[api_key][1](api_version):
        if attribute == "":
            body = moved(body)
        else:
            nodes = tuple(moved(node) for node in getattr(body, attribute))
            body = dataclasses.replace(body, **{attribute: nodes})
    return body


def cap_api_versions(body: Any, *, cluster_mode: bool, decoded: frozenset[int]) -> Any:
    """Cap advertised versions so clients use only what the proxy can read.

    ``cluster_mode`` (broker addresses rewritten): Produce and Fetch below their NodeEndpoints
    versions, so their bodies never need decoding. ``decoded``: the APIs the
    proxy decodes (address-carrying ones, and those a policy reads) at the
    codec's newest version.
    """
    capped = []
    for entry in body.api_keys:
        limit = NO_NODE_ENDPOINTS_MAX_VERSION.get(entry.api_key) if cluster_mode else None
        if limit is None and entry.api_key in decoded:
            limit = wire.max_known_version(entry.api_key)
        if limit is not None and entry.max_version > limit:
            entry = dataclasses.replace(entry, max_version=type(entry.max_version)(max(limit, entry.min_version)))
        capped.append(entry)
    return dataclasses.replace(body, api_keys=tuple(capped))


ADDRESS_APIS = frozenset(_ADDRESS_FIELDS) - set(NO_NODE_ENDPOINTS_MAX_VERSION)
