"""KIP-498: the largest response a client is handed, and the broker that answers
in the wrong protocol.

Kafka's clients allocate whatever a response's 4-byte length prefix says; KIP-498
proposes ``max.response.size`` so that a client refuses a response over it instead
of allocating (the classic case: a TLS alert read by a plaintext client as a
352,518,912-byte length). The proxy applies the same rule to every response a
broker sends before anything is read or allocated for it: over the limit, the
client's connection is closed (fail fast, no retry loop). A prefix that is a TLS
record on a plaintext link is named as the mismatch it is.
"""

from __future__ import annotations

from policies.decision import Action, Decision, Policy
from policies.frame_check import FrameKind, FrameVerdict
from policies.mode import Mode
from policies.properties import MAX_RESPONSE_SIZE


def decide_response_prefix(verdict: FrameVerdict, limit: int, mode: Mode, about: str) -> Decision:
    """The decision on a response prefix that ``check_length_prefix`` did not admit.

    ``about`` names the response ("response to Metadata v12 correlation id 7").
    A size over ``limit`` is a RESPONSE_SIZE decision in the policy's ``mode``; a TLS
    record or a length that is not positive cannot be forwarded in any mode.
    """
    if verdict.kind is FrameKind.TLS_RECORD:
        return Decision(
            Policy.PROTOCOL,
            Action.CLOSE,
            Mode.ENFORCE,
            "upstream_tls_on_plaintext",
            "speaks TLS; set upstream.tls.enabled",
            subject={"direction": "upstream", "size": verdict.size},
        )
    if verdict.kind is FrameKind.TOO_LARGE:
        return Decision(
            Policy.RESPONSE_SIZE,
            Action.CLOSE,
            mode,
            MAX_RESPONSE_SIZE,
            f"{about} is {verdict.size} bytes, over {MAX_RESPONSE_SIZE}={limit}",
            limit=limit,
            subject={"size": verdict.size},
        )
    return Decision(
        Policy.PROTOCOL,
        Action.CLOSE,
        Mode.ENFORCE,
        "invalid_size",
        f"{about}: invalid length prefix {verdict.size}",
        subject={"direction": "upstream", "size": verdict.size},
    )


def decide_upstream_mismatch(address: str, kind: str, description: str) -> Decision:
    """A broker that speaks the other protocol (``kind``: "upstream_tls_on_plaintext" or
    "upstream_plaintext_on_tls"): no connection to it can carry Kafka."""
    return Decision(Policy.PROTOCOL, Action.CLOSE, Mode.ENFORCE, kind, f"upstream {address} {description}")
