"""Length-prefix verdicts (sans-I/O): the size limit and the bytes that are not Kafka."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.decision import Action, Decision, Policy
from policies.frame_check import (
    FrameKind,
    RequestLimit,
    check_length_prefix,
    decide_request_prefix,
    request_limit,
)
from policies.mode import Mode

LIMIT = 104857600


def prefix(n: int) -> bytes:
    return n.to_bytes(4, "big", signed=True)


def test_a_frame_within_socket_request_max_bytes_is_admitted() -> None:
    verdict = check_length_prefix(prefix(LIMIT), LIMIT)
    assert verdict.admitted and verdict.size == LIMIT


def test_a_frame_one_byte_over_the_limit_is_refused_as_too_large() -> None:
    assert check_length_prefix(prefix(LIMIT + 1), LIMIT).kind is FrameKind.TOO_LARGE


def test_max_int_length_is_refused_before_allocation() -> None:
    verdict = check_length_prefix(prefix(2**31 - 1), LIMIT)
    assert verdict.kind is FrameKind.TOO_LARGE and verdict.size == 2**31 - 1


@pytest.mark.parametrize("size", [0, -1, -(2**31)])
def test_zero_or_negative_lengths_are_invalid(size: int) -> None:
    assert check_length_prefix(prefix(size), LIMIT).kind is FrameKind.INVALID_SIZE


def test_the_java_brokers_tls_alert_is_named_a_tls_record_not_a_352_mb_frame() -> None:
    verdict = check_length_prefix(bytes.fromhex("15030300"), 2**31 - 1)
    assert verdict.kind is FrameKind.TLS_RECORD
    assert verdict.size == 352_518_912


def test_a_tls_client_hello_on_a_plaintext_port_is_named() -> None:
    assert check_length_prefix(bytes.fromhex("16030100"), LIMIT).kind is FrameKind.TLS_RECORD


def test_inside_tls_the_same_bytes_are_just_a_length() -> None:
    verdict = check_length_prefix(bytes.fromhex("15030300"), 2**31 - 1, plaintext=False)
    assert verdict.admitted


@pytest.mark.parametrize("start", [b"GET ", b"POST", b"HEAD", b"PUT "])
def test_an_http_request_on_a_kafka_port_is_named(start: bytes) -> None:
    assert check_length_prefix(start, 2**31 - 1).kind is FrameKind.HTTP


def test_a_prefix_must_be_four_bytes() -> None:
    with pytest.raises(ValueError, match="4 bytes"):
        check_length_prefix(b"\0\0\0", LIMIT)


@given(st.binary(min_size=4, max_size=4), st.integers(min_value=1, max_value=2**31 - 1))
def test_an_admitted_frame_is_never_larger_than_the_limit(data: bytes, limit: int) -> None:
    verdict = check_length_prefix(data, limit)
    if verdict.admitted:
        assert 0 < verdict.size <= limit


# -- the decision on a prefix that is not admitted (always enforced: an unread frame cannot be forwarded)


@pytest.mark.parametrize("size", [LIMIT + 1, 2**31 - 1])
def test_a_request_over_socket_request_max_bytes_closes_the_connection(size: int) -> None:
    decision = decide_request_prefix(check_length_prefix(prefix(size), LIMIT), LIMIT)
    assert decision == Decision(
        Policy.REQUEST_SIZE,
        Action.CLOSE,
        Mode.ENFORCE,
        "socket.request.max.bytes",
        f"request length prefix {size} refused (too_large; socket.request.max.bytes={LIMIT})",
        limit=LIMIT,
        subject={"size": size},
    )


def test_a_negative_request_length_closes_the_connection_naming_it_invalid() -> None:
    decision = decide_request_prefix(check_length_prefix(prefix(-1), LIMIT), LIMIT)
    assert (decision.policy, decision.action, decision.mode) == (Policy.REQUEST_SIZE, Action.CLOSE, Mode.ENFORCE)
    assert decision.reason == f"request length prefix -1 refused (invalid_size; socket.request.max.bytes={LIMIT})"
    assert decision.subject == {"size": -1} and decision.limit == LIMIT


def test_tls_on_a_plaintext_port_is_a_protocol_decision_about_the_client() -> None:
    decision = decide_request_prefix(check_length_prefix(bytes.fromhex("16030100"), LIMIT), LIMIT)
    assert decision == Decision(
        Policy.PROTOCOL,
        Action.CLOSE,
        Mode.ENFORCE,
        "client_tls_on_plaintext",
        "client speaks TLS on a plaintext link; use TLS only on a TLS listener",
        subject={"direction": "client"},
    )
    assert decision.limit is None and decision.error_code is None


def test_http_on_a_kafka_port_is_a_protocol_decision_about_the_client() -> None:
    decision = decide_request_prefix(check_length_prefix(b"GET ", LIMIT), LIMIT)
    assert (decision.policy, decision.action, decision.limit_key) == (
        Policy.PROTOCOL,
        Action.CLOSE,
        "http_on_kafka_port",
    )
    assert decision.reason == "HTTP request on a Kafka port" and decision.subject == {"direction": "client"}


def test_an_admitted_prefix_has_no_decision_to_make() -> None:
    with pytest.raises(ValueError, match="admitted"):
        decide_request_prefix(check_length_prefix(b"\x00\x00\x00\x10", 100), 100)


# -- which limit applies: Kafka's SaslServerAuthenticator before SASL authentication

SASL_LIMIT = 524288


def test_before_sasl_authentication_frames_are_bounded_by_sasl_server_max_receive_size() -> None:
    assert request_limit(LIMIT, SASL_LIMIT, authenticated=False) == RequestLimit(
        "sasl.server.max.receive.size", SASL_LIMIT
    )


def test_once_authenticated_frames_are_bounded_by_socket_request_max_bytes() -> None:
    assert request_limit(LIMIT, SASL_LIMIT, authenticated=True) == RequestLimit("socket.request.max.bytes", LIMIT)


def test_before_authentication_the_smaller_limit_applies_so_the_pool_fits_every_frame() -> None:
    assert request_limit(1000, SASL_LIMIT, authenticated=False) == RequestLimit("socket.request.max.bytes", 1000)


@pytest.mark.parametrize("size", [SASL_LIMIT + 1, LIMIT])
def test_a_request_over_the_pre_authentication_limit_closes_the_connection_naming_it(size: int) -> None:
    decision = decide_request_prefix(
        check_length_prefix(prefix(size), SASL_LIMIT), SASL_LIMIT, "sasl.server.max.receive.size"
    )
    assert decision == Decision(
        Policy.REQUEST_SIZE,
        Action.CLOSE,
        Mode.ENFORCE,
        "sasl.server.max.receive.size",
        f"request length prefix {size} refused before SASL authentication "
        f"(too_large; sasl.server.max.receive.size={SASL_LIMIT})",
        limit=SASL_LIMIT,
        subject={"size": size},
    )


def test_a_frame_of_exactly_the_pre_authentication_limit_is_admitted() -> None:
    assert check_length_prefix(prefix(SASL_LIMIT), SASL_LIMIT).admitted
