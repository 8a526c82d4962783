"""Back off from an upstream broker that cannot be used: one that speaks the
wrong protocol (KIP-498's "fail fast" case) or one that cannot be reached at
all (connection refused, connect timeout). While a broker is backed off, new
client connections to it fail at once instead of each trying it, as Kafka's own
clients back off per node (``ClusterConnectionStates``: ``reconnect.backoff.ms``
doubling up to ``reconnect.backoff.max.ms``). The wait doubles per repeated
failure up to a cap, separately for each cause, and both are forgotten after a
healthy exchange. With ``workers: N`` each worker keeps its own, and a new block in
one is adopted by the others (``share``, ``adopt``): a broker that is down is tried
by one worker per backoff period, not by each.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Cause(enum.Enum):
    MISMATCH = "mismatch"  # reached, but speaks the other protocol (TLS vs plaintext)
    UNREACHABLE = "unreachable"  # connection refused, connect timeout


@dataclass(frozen=True, slots=True)
class Blocked:
    """Connecting to ``upstream`` is refused until ``retry_at``."""

    upstream: str
    description: str  # e.g. "speaks TLS; set upstream.tls.enabled", "cannot connect: ConnectionRefusedError(...)"
    retry_at: float
    cause: Cause
    failures: int  # consecutive failures of this cause, 1 for the first


@dataclass(frozen=True, slots=True)
class SharedBlock:
    """A block as one process tells another: how long it has left, not until when (their clocks differ)."""

    upstream: str
    description: str
    cause: Cause
    failures: int
    delay: float  # the whole block's length: a failure after it doubles from this
    remaining: float  # seconds left when it was told


class UpstreamBackoff:
    """Per upstream ``host:port``: what blocks connecting to it, and until when."""

    def __init__(
        self,
        initial_seconds: float = 1.0,
        max_seconds: float = 30.0,
        *,
        unreachable_initial_seconds: float = 0.2,
        unreachable_max_seconds: float = 10.0,
    ) -> None:
        if not 0 < initial_seconds <= max_seconds:
            raise ValueError("backoff needs 0 < initial_seconds <= max_seconds")
        if not 0 < unreachable_initial_seconds <= unreachable_max_seconds:
            raise ValueError("backoff needs 0 < unreachable_initial_seconds <= unreachable_max_seconds")
        self._bounds = {
            Cause.MISMATCH: (initial_seconds, max_seconds),
            Cause.UNREACHABLE: (unreachable_initial_seconds, unreachable_max_seconds),
        }
        # per cause: upstream -> (the delay of its last block, that block)
        self._blocks: dict[Cause, dict[str, tuple[float, Blocked]]] = {cause: {} for cause in Cause}

    def on_mismatch(self, upstream: str, description: str, now: float) -> Blocked:
        """``upstream`` answered in the wrong protocol: block it, for twice as long as last time."""
        return self._back_off(Cause.MISMATCH, upstream, description, now)

    def on_unreachable(self, upstream: str, description: str, now: float) -> Blocked | None:
        """``upstream`` could not be connected to: the new block (log it), or None if it is blocked already.

        A failure while a block is in effect is an attempt that began before the
        block: it neither lengthens the block nor needs reporting again, so the
        shell logs one line per backoff period, not one per client connection.
        """
        current = self._blocks[Cause.UNREACHABLE].get(upstream)
        if current is not None and now < current[1].retry_at:
            return None
        return self._back_off(Cause.UNREACHABLE, upstream, description, now)

    def on_healthy(self, upstream: str) -> None:
        """A healthy exchange with ``upstream``: forget its mismatches and unreachability."""
        for blocks in self._blocks.values():
            blocks.pop(upstream, None)

    def blocked(self, upstream: str, now: float) -> Blocked | None:
        """What still blocks connecting to ``upstream`` at ``now`` (the longer block if both causes do), if any."""
        found: Blocked | None = None
        for blocks in self._blocks.values():
            entry = blocks.get(upstream)
            if entry is not None and now < entry[1].retry_at and (found is None or entry[1].retry_at > found.retry_at):
                found = entry[1]
        return found

    def share(self, block: Blocked, now: float) -> SharedBlock:
        """``block`` (just made here, by ``on_mismatch`` or ``on_unreachable``) for another process."""
        delay = self._blocks[block.cause][block.upstream][0]
        return SharedBlock(block.upstream, block.description, block.cause, block.failures, delay, block.retry_at - now)

    def adopt(self, shared: SharedBlock, now: float) -> Blocked | None:
        """Another process's block, as if made here: connecting waits ``shared.remaining`` from ``now``,
        and a failure after it doubles from its delay. None when this one blocks as long already."""
        current = self._blocks[shared.cause].get(shared.upstream)
        retry_at = now + shared.remaining
        if current is not None and current[1].retry_at >= retry_at:
            return None
        block = Blocked(shared.upstream, shared.description, retry_at, shared.cause, shared.failures)
        self._blocks[shared.cause][shared.upstream] = (shared.delay, block)
        return block

    def known_mismatches(self) -> list[Blocked]:
        """Every upstream whose last exchange was a mismatch (for /readyz)."""
        return [block for _, block in self._blocks[Cause.MISMATCH].values()]

    def _back_off(self, cause: Cause, upstream: str, description: str, now: float) -> Blocked:
        initial, maximum = self._bounds[cause]
        last = self._blocks[cause].get(upstream)
        delay = initial if last is None else min(last[0] * 2, maximum)
        block = Blocked(upstream, description, now + delay, cause, 1 if last is None else last[1].failures + 1)
        self._blocks[cause][upstream] = (delay, block)
        return block
