"""Back off from an upstream broker that speaks the wrong protocol (KIP-498's
"fail fast" case): after a mismatch, new client connections to that broker are
refused at once for a while instead of hammering it, with the wait doubling
per repeated mismatch up to a cap, and forgotten after a healthy exchange."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Mismatch:
    upstream: str
    description: str  # e.g. "speaks TLS; set upstream.tls.enabled"
    retry_at: float


class UpstreamBackoff:
    def __init__(self, initial_seconds: float = 1.0, max_seconds: float = 30.0) -> None:
        if not 0 < initial_seconds <= max_seconds:
            raise ValueError("backoff needs 0 < initial_seconds <= max_seconds")
        self._initial = initial_seconds
        self._max = max_seconds
        self._delay: dict[str, float] = {}
        self._mismatches: dict[str, Mismatch] = {}

    def on_mismatch(self, upstream: str, description: str, now: float) -> Mismatch:
        delay = min(self._delay.get(upstream, self._initial / 2) * 2, self._max)
        self._delay[upstream] = delay
        mismatch = Mismatch(upstream, description, now + delay)
        self._mismatches[upstream] = mismatch
        return mismatch

    def on_healthy(self, upstream: str) -> None:
        self._delay.pop(upstream, None)
        self._mismatches.pop(upstream, None)

    def blocked(self, upstream: str, now: float) -> Mismatch | None:
        """The mismatch that still blocks connecting to ``upstream`` at ``now``, if any."""
        mismatch = self._mismatches.get(upstream)
        return mismatch if mismatch is not None and now < mismatch.retry_at else None

    def known_mismatches(self) -> list[Mismatch]:
        """Every upstream whose last exchange was a mismatch (for /readyz)."""
        return list(self._mismatches.values())
