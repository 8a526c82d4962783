"""Hostile input to the wire decoders the proxy uses: real kio-encoded requests
and responses of every API it decodes, at every version, mutated byte by byte
(flipped, overwritten with interesting values and Kafka lengths, truncated,
extended). Nothing may escape but ``MalformedFrame``, Python allocations stay
within a small multiple of the frame, and no case may kill the process.

The decoders run in forked children under an address-space limit (see
``isolated``), because kio's native parser aborts the whole process on some
inputs; those cases are collected, not fatal to the run. Header peeks, which
read fixed positions and never build arrays, are fuzzed in-process with
hypothesis.
"""

from __future__ import annotations

import collections
import random
import tracemalloc
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.index import load_request_schema

from policies.api_keys import PRODUCE
from proxy.protocol import wire
from tests.fuzz.budget import BUDGET, FUZZ_SETTINGS, Counter
from tests.fuzz.isolated import Outcome, run_isolated
from tests.fuzz.mutations import mutate, mutated, reframed
from tests.fuzz.wire_corpus import DECODED_APIS, wire_corpus

# Python memory a decode may use, beyond the frame itself: the decoded entities are
# Python objects (a valid 600-byte frame decodes into ~150 KiB of them).
ALLOWANCE_BYTES = 64 * 1024
ALLOWANCE_PER_FRAME_BYTE = 1024
MEASURE_EVERY = 4  # tracemalloc slows a decode threefold: measure one case in MEASURE_EVERY


def wire_case(i: int) -> tuple[Any, bytes]:
    """Case ``i``: a base frame and its mutation, a pure function of ``i``."""
    corpus = wire_corpus()
    base = corpus[i % len(corpus)]
    rng = random.Random(i)
    return base, reframed(lambda body: mutate(body, rng), base.frame)


def run_wire_case(i: int) -> str | None:
    base, frame = wire_case(i)
    measure = i % MEASURE_EVERY == 0
    if measure:
        tracemalloc.start()
    try:
        base.decode(frame)
    except wire.MalformedFrame:
        pass
    except BaseException as exc:  # anything else escaped the decoder
        return f"{base.name}: {type(exc).__name__}: {exc}"
    finally:
        if measure:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
    if measure and peak > ALLOWANCE_BYTES + ALLOWANCE_PER_FRAME_BYTE * len(frame):
        return f"{base.name}: decoding a {len(frame)}-byte frame allocated {peak} bytes"
    return None


@pytest.fixture(scope="module")
def wire_campaign() -> Outcome:
    wire_corpus()  # built once, before forking, so every child inherits it
    outcome = run_isolated(BUDGET.wire_cases, run_wire_case)
    killed_by = collections.Counter(wire_case(i)[0].api_key for i, _ in outcome.aborts)
    note = f"{len(outcome.escapes)} escapes, {len(outcome.aborts)} killed the process, in {len(killed_by)} APIs"
    Counter("wire decoders (forked, every API and version)").done(outcome.cases, outcome.seconds, note)
    return outcome


def test_the_corpus_has_every_decoded_api_at_every_version_both_ways() -> None:
    corpus = wire_corpus()
    assert {b.api_key for b in corpus} == set(DECODED_APIS)
    assert len(corpus) > 300  # ~160 API versions, request and response each
    assert all(b.response in (False, True) for b in corpus)


def test_wire_decoders_raise_only_malformed_frame_and_allocate_little(wire_campaign: Outcome) -> None:
    outcome = wire_campaign
    assert outcome.cases == BUDGET.wire_cases
    assert outcome.escapes == [], outcome.escapes[:10]
    assert outcome.max_rss_kib < 512 * 1024  # no child ever held half a gigabyte


def _describe_aborts(outcome: Outcome) -> str:
    by_base = collections.Counter(wire_case(i)[0].name for i, _ in outcome.aborts)
    first = outcome.aborts[0][0]
    base, frame = wire_case(first)
    return (
        f"{len(outcome.aborts)} of {outcome.cases} cases killed the process, e.g. case {first} "
        f"({base.name}, frame {frame.hex()}): {outcome.aborts[0][1]}; most hit: {by_base.most_common(5)}"
    )


def test_no_wire_input_kills_the_process(wire_campaign: Outcome) -> None:
    assert wire_campaign.aborts == [], _describe_aborts(wire_campaign)


# --- header peeks, in-process ----------------------------------------------------------

# Deferred: the corpus is built when a test first draws from it, not at collection.
request_frames = st.deferred(lambda: st.sampled_from([b.frame for b in wire_corpus() if not b.response]))
_peek_counter = Counter("peek_head + peek_client_id (hypothesis)")
_produce_counter = Counter("produce_head (hypothesis)")
_correlation_counter = Counter("response_correlation_id (hypothesis)")


def produce_frame(version: int) -> bytes:
    import datetime

    schema = load_request_schema(PRODUCE, version)
    fields: dict[str, Any] = {"acks": -1, "timeout": datetime.timedelta(seconds=1), "topic_data": ()}
    if version >= 3:
        fields["transactional_id"] = "txn-1"
    return wire.encode_frame(wire.request_header_for(PRODUCE, version, 3, "fuzz-producer"), schema(**fields))


PRODUCE_VERSIONS = list(range(3, (wire.max_known_version(PRODUCE) or 3) + 1))


@FUZZ_SETTINGS
@given(data=st.data())
def test_request_header_peeks_raise_only_malformed_frame(data: st.DataObject) -> None:
    _peek_counter()
    frame = data.draw(request_frames.flatmap(mutated))
    try:
        api_key, api_version, correlation_id = wire.peek_head(frame, 0)
        client_id = wire.peek_client_id(frame, 0)
    except wire.MalformedFrame:
        return
    assert -(2**15) <= api_key < 2**15 and -(2**15) <= api_version < 2**15
    assert -(2**31) <= correlation_id < 2**31
    assert client_id is None or isinstance(client_id, str)


@FUZZ_SETTINGS
@given(data=st.data(), version=st.sampled_from(PRODUCE_VERSIONS))
def test_produce_head_raises_only_malformed_frame(data: st.DataObject, version: int) -> None:
    _produce_counter()
    frame = data.draw(mutated(produce_frame(version)))
    try:
        transactional_id, acks = wire.produce_head(frame, 0, version)
    except wire.MalformedFrame:
        return
    assert -(2**15) <= acks < 2**15
    assert transactional_id is None or isinstance(transactional_id, str)


@FUZZ_SETTINGS
@given(frame=st.binary(max_size=64))
def test_response_correlation_id_raises_only_malformed_frame(frame: bytes) -> None:
    _correlation_counter()
    try:
        assert -(2**31) <= wire.response_correlation_id(frame, 0) < 2**31
    except wire.MalformedFrame:
        assert len(frame) < 8


@pytest.fixture(scope="module", autouse=True)
def _report_counts() -> Any:
    yield
    for counter in (_peek_counter, _produce_counter, _correlation_counter):
        counter.done()
