"""Address rewriting and ApiVersions capping on real kio-encoded responses."""

import datetime

import pytest
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from proxy.protocol import rewrite, wire

ZERO = datetime.timedelta(0)
PROXY_HOST = "proxy.example"
BASE = 30000


def address_of(node_id: int) -> tuple[str, int]:
    return PROXY_HOST, BASE + node_id


def roundtrip(api_key: int, version: int, header, body):  # type: ignore[no-untyped-def]
    """Encode a response as a broker would, decode it as the proxy does, rewrite, re-encode."""
    frame = wire.encode_frame(header, body)
    decoded = wire.decode_response(frame, api_key, version)
    found = rewrite.brokers_in(decoded.body, api_key, version)
    new_body = rewrite.rewrite_addresses(decoded.body, api_key, version, address_of)
    out = wire.decode_response(wire.encode_frame(decoded.header, new_body), api_key, version)
    return found, out.body


def header_for(schema):  # type: ignore[no-untyped-def]
    return schema.__header_schema__(correlation_id=7)


def metadata_module(version: int):  # type: ignore[no-untyped-def]
    return __import__(f"kio.schema.metadata.v{version}.response", fromlist=["x"])


@pytest.mark.parametrize("version", [0, 1, 5, 9, 12, 13])
def test_metadata_brokers_are_rewritten_to_proxy_node_ports(version: int) -> None:
    m = metadata_module(version)
    brokers = tuple(m.MetadataResponseBroker(node_id=n, host=f"broker{n}.internal", port=9092) for n in (1, 2, 3))
    kwargs = {"brokers": brokers, "topics": ()}
    if version >= 3:
        kwargs["throttle_time"] = ZERO
    if version >= 13:
        kwargs["error_code"] = ErrorCode.none
    body = m.MetadataResponse(**kwargs)
    found, out = roundtrip(3, version, header_for(m.MetadataResponse), body)
    assert [(b.node_id, b.host, b.port) for b in found] == [(n, f"broker{n}.internal", 9092) for n in (1, 2, 3)]
    assert [(b.node_id, b.host, b.port) for b in out.brokers] == [(n, PROXY_HOST, BASE + n) for n in (1, 2, 3)]


def test_find_coordinator_v3_top_level_node_is_rewritten() -> None:
    schema = load_response_schema(10, 3)
    body = schema(
        throttle_time=ZERO,
        error_code=ErrorCode.none,
        error_message=None,
        node_id=2,
        host="broker2.internal",
        port=9092,
    )
    _, out = roundtrip(10, 3, header_for(schema), body)
    assert (out.node_id, out.host, out.port) == (2, PROXY_HOST, BASE + 2)


def test_find_coordinator_error_answer_is_left_alone() -> None:
    schema = load_response_schema(10, 3)
    body = schema(
        throttle_time=ZERO,
        error_code=ErrorCode.coordinator_not_available,
        error_message=None,
        node_id=-1,
        host="",
        port=-1,
    )
    found, out = roundtrip(10, 3, header_for(schema), body)
    assert found == []
    assert (out.node_id, out.host, out.port) == (-1, "", -1)


@pytest.mark.parametrize("version", [4, 6])
def test_find_coordinator_v4_plus_coordinators_are_rewritten(version: int) -> None:
    m = __import__(f"kio.schema.find_coordinator.v{version}.response", fromlist=["x"])
    coordinators = tuple(
        m.Coordinator(
            key=f"g{n}", node_id=n, host="b.internal", port=9093, error_code=ErrorCode.none, error_message=None
        )
        for n in (1, 3)
    )
    body = m.FindCoordinatorResponse(throttle_time=ZERO, coordinators=coordinators)
    _, out = roundtrip(10, version, header_for(m.FindCoordinatorResponse), body)
    assert [(c.key, c.host, c.port) for c in out.coordinators] == [
        ("g1", PROXY_HOST, BASE + 1),
        ("g3", PROXY_HOST, BASE + 3),
    ]


@pytest.mark.parametrize("version", [0, 1])
def test_describe_cluster_brokers_are_rewritten(version: int) -> None:
    m = __import__(f"kio.schema.describe_cluster.v{version}.response", fromlist=["x"])
    kwargs = dict(
        throttle_time=ZERO,
        error_code=ErrorCode.none,
        error_message=None,
        cluster_id="c",
        controller_id=1,
        brokers=(m.DescribeClusterBroker(broker_id=1, host="b1", port=9092, rack=None),),
        cluster_authorized_operations=0,
    )
    if version >= 1:
        kwargs["endpoint_type"] = 1
    body = m.DescribeClusterResponse(**kwargs)
    frame = wire.encode_frame(header_for(m.DescribeClusterResponse), body)
    decoded = wire.decode_response(frame, 60, version)
    assert [(b.node_id, b.host) for b in rewrite.brokers_in(decoded.body, 60, version)] == [(1, "b1")]
    out = rewrite.rewrite_addresses(decoded.body, 60, version, address_of)
    assert [(b.host, b.port) for b in out.brokers] == [(PROXY_HOST, BASE + 1)]


def _node_endpoints_response(api_key: int, version: int):  # type: ignore[no-untyped-def]
    name = {0: "produce", 1: "fetch"}[api_key]
    m = __import__(f"kio.schema.{name}.v{version}.response", fromlist=["x"])
    schema = load_response_schema(api_key, version)
    endpoint = m.NodeEndpoint(node_id=2, host="new-leader.internal", port=9092, rack=None)
    if api_key == 0:
        body = schema(responses=(), throttle_time=ZERO, node_endpoints=(endpoint,))
    else:
        body = schema(
            throttle_time=ZERO,
            error_code=ErrorCode.none,
            session_id=0,
            responses=(),
            node_endpoints=(endpoint,),
        )
    return schema, body


@pytest.mark.parametrize(("api_key", "version"), [(0, 10), (0, 11), (1, 16), (1, 17)])
def test_node_endpoints_of_produce_and_fetch_are_rewritten(api_key: int, version: int) -> None:
    schema, body = _node_endpoints_response(api_key, version)
    found, out = roundtrip(api_key, version, header_for(schema), body)
    assert [(b.node_id, b.host) for b in found] == [(2, "new-leader.internal")]
    assert [(e.host, e.port) for e in out.node_endpoints] == [(PROXY_HOST, BASE + 2)]


@pytest.mark.parametrize(
    ("api_key", "version", "carries"),
    [
        (0, 9, False),
        (0, 10, True),
        (1, 15, False),
        (1, 16, True),
        (3, 0, True),
        (10, 4, True),
        (60, 0, True),
        (19, 7, False),
    ],
)
def test_only_address_carrying_versions_are_rewritten(api_key: int, version: int, carries: bool) -> None:
    assert rewrite.carries_addresses(api_key, version) is carries


def test_a_metadata_version_newer_than_the_codec_is_unknown() -> None:
    newest = wire.max_known_version(3)
    assert newest is not None
    assert wire.codec_knows(3, newest)
    assert not wire.codec_knows(3, newest + 1)


def test_api_versions_caps_produce_fetch_and_rewritten_apis() -> None:
    m = __import__("kio.schema.api_versions.v3.response", fromlist=["x"])
    advertised = {0: 11, 1: 17, 3: 99, 10: 6, 19: 7, 60: 2}
    body = m.ApiVersionsResponse(
        error_code=ErrorCode.none,
        throttle_time=ZERO,
        api_keys=tuple(m.ApiVersion(api_key=k, min_version=0, max_version=v) for k, v in advertised.items()),
    )
    frame = wire.encode_frame(header_for(m.ApiVersionsResponse), body)
    decoded = wire.decode_response(frame, 18, 3)
    capped = rewrite.cap_api_versions(decoded.body, cluster_mode=True, decoded=rewrite.ADDRESS_APIS)
    assert {a.api_key: a.max_version for a in capped.api_keys} == {
        0: 9,
        1: 15,
        3: wire.max_known_version(3),
        10: 6,
        19: 7,
        60: 2,
    }
    # Sidecar mode: no address rewriting, Produce/Fetch untouched; policy-decoded APIs capped.
    sidecar = rewrite.cap_api_versions(decoded.body, cluster_mode=False, decoded=frozenset({19}))
    assert {a.api_key: a.max_version for a in sidecar.api_keys} == {0: 11, 1: 17, 3: 99, 10: 6, 19: 7, 60: 2}
