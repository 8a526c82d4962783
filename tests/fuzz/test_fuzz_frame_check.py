"""Hostile first bytes: the length-prefix check and the TLS/HTTP sniffing
(``policies.frame_check``) decide on any four bytes without raising, and the
verdict is consistent with the bytes and the limit."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.frame_check import FrameKind, check_length_prefix, looks_like_http, looks_like_tls
from tests.fuzz.budget import FUZZ_SETTINGS, Counter

# What a first read can start with: random bytes, TLS records, HTTP verbs, Kafka lengths.
prefixes = st.one_of(
    st.binary(min_size=4, max_size=4),
    st.tuples(st.sampled_from([0x14, 0x15, 0x16, 0x17]), st.integers(0, 255), st.binary(min_size=2, max_size=2)).map(
        lambda t: bytes([t[0], 3, t[1] % 6]) + t[2][:1]
    ),
    st.sampled_from([b"GET ", b"POST", b"PUT ", b"HEAD", b"PRI ", b"OPTI"]),
    st.integers(-(2**31), 2**31 - 1).map(lambda n: n.to_bytes(4, "big", signed=True)),
)
limits = st.one_of(st.integers(1, 2**31 - 1), st.sampled_from([1, 104857600, 2**31 - 1]))

_prefix_counter = Counter("check_length_prefix (hypothesis)")
_sniff_counter = Counter("looks_like_tls / looks_like_http (hypothesis)")


@FUZZ_SETTINGS
@given(prefix=prefixes, max_bytes=limits, plaintext=st.booleans())
def test_any_four_bytes_get_a_consistent_verdict(prefix: bytes, max_bytes: int, plaintext: bool) -> None:
    _prefix_counter()
    verdict = check_length_prefix(prefix, max_bytes, plaintext=plaintext)
    size = int.from_bytes(prefix, "big", signed=True)
    assert verdict.size == size
    if verdict.kind in (FrameKind.TLS_RECORD, FrameKind.HTTP):
        assert plaintext  # inside TLS, those bytes are just a length
        assert looks_like_tls(prefix) if verdict.kind is FrameKind.TLS_RECORD else looks_like_http(prefix)
    elif verdict.kind is FrameKind.INVALID_SIZE:
        assert size <= 0
    elif verdict.kind is FrameKind.TOO_LARGE:
        assert size > max_bytes
    else:
        assert verdict.admitted and 0 < size <= max_bytes
    if plaintext and looks_like_tls(prefix):
        assert verdict.kind is FrameKind.TLS_RECORD  # named, never read as a 352 MB length


@FUZZ_SETTINGS
@given(data=st.binary(max_size=16))
def test_sniffing_any_bytes_never_raises(data: bytes) -> None:
    _sniff_counter()
    assert isinstance(looks_like_tls(data), bool)
    assert isinstance(looks_like_http(data), bool)
    if len(data) != 4:
        with pytest.raises(ValueError, match="exactly 4 bytes"):
            check_length_prefix(data, 100)


@pytest.fixture(scope="module", autouse=True)
def _report_counts() -> object:
    yield
    _prefix_counter.done()
    _sniff_counter.done()
