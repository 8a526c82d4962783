"""KIP-498 response guard (sans-I/O): the decision on a broker's response prefix
that is over max.response.size, a TLS record, or not a length at all."""

from __future__ import annotations

import pytest

from policies.decision import Action, Decision, Policy
from policies.frame_check import FrameVerdict, check_length_prefix
from policies.mode import Mode
from policies.properties import MAX_RESPONSE_SIZE
from policies.response_size import decide_response_prefix

LIMIT = 1024 * 1024
ABOUT = "response to Metadata v12 correlation id 7"


def verdict_of(size: int, limit: int = LIMIT) -> FrameVerdict:
    return check_length_prefix(size.to_bytes(4, "big", signed=True), limit)


@pytest.mark.parametrize("mode", [Mode.ENFORCE, Mode.OBSERVE])
def test_a_response_over_max_response_size_closes_the_connection_in_the_policys_mode(mode: Mode) -> None:
    decision = decide_response_prefix(verdict_of(LIMIT + 1), LIMIT, mode, ABOUT)
    assert decision == Decision(
        Policy.RESPONSE_SIZE,
        Action.CLOSE,
        mode,
        MAX_RESPONSE_SIZE,
        f"response to Metadata v12 correlation id 7 is {LIMIT + 1} bytes, over max.response.size={LIMIT}",
        limit=LIMIT,
        subject={"size": LIMIT + 1},
    )
    assert MAX_RESPONSE_SIZE == "max.response.size"
    assert decision.enforced is (mode is Mode.ENFORCE)


@pytest.mark.parametrize("mode", [Mode.ENFORCE, Mode.OBSERVE])
def test_a_tls_alert_from_the_broker_is_named_a_mismatch_and_always_closes(mode: Mode) -> None:
    # KIP-498's case: 15 03 03 00 read as a length is 352,518,912 bytes
    decision = decide_response_prefix(check_length_prefix(bytes.fromhex("15030300"), LIMIT), LIMIT, mode, ABOUT)
    assert decision == Decision(
        Policy.PROTOCOL,
        Action.CLOSE,
        Mode.ENFORCE,
        "upstream_tls_on_plaintext",
        "speaks TLS; set upstream.tls.enabled",
        subject={"direction": "upstream", "size": 352_518_912},
    )
    assert decision.enforced


@pytest.mark.parametrize("size", [0, -1])
def test_a_length_that_is_not_positive_always_closes(size: int) -> None:
    decision = decide_response_prefix(verdict_of(size), LIMIT, Mode.OBSERVE, ABOUT)
    assert decision == Decision(
        Policy.PROTOCOL,
        Action.CLOSE,
        Mode.ENFORCE,
        "invalid_size",
        f"response to Metadata v12 correlation id 7: invalid length prefix {size}",
        subject={"direction": "upstream", "size": size},
    )
