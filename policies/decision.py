"""The one result type of every policy: a :class:`Decision` that is not a plain admit.

A policy answers ``None`` to admit, or a ``Decision`` naming what it decided
(refuse, wait, evict, close, throttle), the Kafka property behind it, and the mode
it was decided in. Observe mode is applied in one place, by the shell, through
:attr:`Decision.enforced`: an observe-mode decision is recorded exactly like an
enforced one and then the traffic goes through.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from policies.mode import Mode


class Policy(enum.Enum):
    """Which policy decided (the audit schema's ``policy``)."""

    CONNECTIONS = "connections"
    MEMORY_POOL = "memory_pool"
    REQUEST_SIZE = "request_size"
    RESPONSE_SIZE = "response_size"
    GROUP_SIZE = "group_size"
    IDENTIFIER_LIMITS = "identifier_limits"
    PROTOCOL = "protocol"


class Action(enum.Enum):
    """What was decided (the audit schema's ``action``).

    REFUSE: a request is answered with ``error_code`` by the proxy (the broker never
    sees it), or a connection is not admitted. THROTTLE: answered with a retriable
    error and ``throttle_ms``. WAIT: held until a slot or memory frees. EVICT: idle
    connections are closed to admit another. CLOSE: the connection is closed.
    """

    REFUSE = "refuse"
    THROTTLE = "throttle"
    WAIT = "wait"
    EVICT = "evict"
    CLOSE = "close"


_NO_ELEMENT_ERRORS: Mapping[str, tuple[int, str | None]] = MappingProxyType({})
_NO_SUBJECT: Mapping[str, object] = MappingProxyType({})
# Shared through default_factory: dataclasses refuse an unhashable default (a mappingproxy) on 3.11.


@dataclass(frozen=True, slots=True)
class Decision:
    policy: Policy
    action: Action
    mode: Mode
    limit_key: str  # the Kafka property behind it, e.g. "group.max.size"
    reason: str  # one human sentence, used in the log, the audit event and error messages
    limit: int | None = None
    error_code: int | None = None  # REFUSE/THROTTLE of a request: the Kafka error code answered
    throttle_ms: int = 0
    victims: tuple[str, ...] = ()  # EVICT/CLOSE of connections: the ids of those to close
    close_after: bool = False  # REFUSE of a request: close the connection once the answer is written
    # REFUSE of a request: single request elements with their own error, by request path ("groups[1]").
    element_errors: Mapping[str, tuple[int, str | None]] = field(default_factory=lambda: _NO_ELEMENT_ERRORS)
    # What the decision was about, for the audit event (schema fields such as group_id,
    # member_id, identifier_kind, identifier_length, breaches, size).
    subject: Mapping[str, object] = field(default_factory=lambda: _NO_SUBJECT)

    @property
    def enforced(self) -> bool:
        """Carry it out (enforce), or only record it and let the traffic through (observe)."""
        return self.mode is Mode.ENFORCE


class Admission(NamedTuple):
    """What a policy that hands out tickets answers (the memory pool, group joins): its decision
    (None: a plain admit) and the ticket to give back later (None when nothing was taken)."""

    decision: Decision | None
    ticket: int | None

    @property
    def waits(self) -> bool:
        """The request must wait for its ticket to be granted (an enforced WAIT)."""
        decision = self.decision
        return decision is not None and decision.action is Action.WAIT and decision.mode is Mode.ENFORCE
