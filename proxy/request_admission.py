"""What the policies read in a request, and their verdict on it: forward, answer
with an error response synthesized for that API and version (the broker never
sees the request), or close.

One table decides which API keys are decoded; every other request, Produce and
Fetch above all, travels as bytes (Produce's first fields are peeked, not decoded).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from policies.identifier_limits import (
    Breach,
    IdentifierKind,
    check_client_id,
    check_request,
    check_transactional_id,
    checked_api_keys,
)

from . import wire
from .audit import AuditSink
from .config import Policies
from .error_responses import build_error_frame
from .group_tracking import GroupRequest, GroupTracking
from .metrics import Metrics

log = logging.getLogger("kafka_admission_proxy.admission")


@dataclass(frozen=True, slots=True)
class Answer:
    """The proxy answers instead of the broker."""

    frame: bytes | None  # None: no response is expected (acks=0 Produce): just close
    close_after: bool
    cause: str
    message: str


class RequestAdmission:
    def __init__(self, policies: Policies, metrics: Metrics, audit: AuditSink, groups: GroupTracking) -> None:
        self._metrics = metrics
        self._audit = audit
        self.limits = policies.identifier_limits()
        self.mode = policies.mode_of(policies.resource_identifier_limit_mode)
        self.groups = groups
        self._identifier_keys = checked_api_keys() - {wire.PRODUCE} if self.limits.enabled else frozenset()
        # The one table: API keys whose request bodies a policy decodes.
        self.decoded_api_keys: frozenset[int] = self._identifier_keys | groups.decoded_api_keys

    def check(
        self, header: wire.RequestHeader, frame: bytes, listener: str, peer: str
    ) -> tuple[Answer | None, GroupRequest | None]:
        """(None to forward, or the proxy's Answer; what the response must be matched with)."""
        api_key = header.api_key
        if api_key not in self.decoded_api_keys:
            if self.limits.enabled:
                return self._check_identifiers(header, frame, None, listener, peer), None
            return None, None
        body = wire.decode_request(frame, api_key, header.api_version)
        if self.limits.enabled:
            answer = self._check_identifiers(header, frame, body, listener, peer)
            if answer is not None:
                return answer, None
        if api_key in self.groups.decoded_api_keys:
            refusal, request = self.groups.on_request(header, body, listener, peer)
            if refusal is not None:
                return Answer(refusal, False, "group_admission", "group join refused"), None
            return None, request
        return None, None

    def _check_identifiers(
        self, header: wire.RequestHeader, frame: bytes, body: object, listener: str, peer: str
    ) -> Answer | None:
        api_key, version = header.api_key, header.api_version
        if api_key == wire.PRODUCE:
            transactional_id, _ = wire.produce_head(frame, version)
            peeked = (
                check_client_id(header.client_id, self.limits),
                check_transactional_id(transactional_id, self.limits),
            )
            breaches = [b for b in peeked if b is not None]
        elif api_key in self._identifier_keys:
            breaches = check_request(api_key, version, body, header.client_id, self.limits)
        else:
            client = check_client_id(header.client_id, self.limits)
            breaches = [client] if client is not None else []
        if not breaches:
            return None
        return self._refuse(header, frame, body, breaches, listener, peer)

    def _refuse(
        self, header: wire.RequestHeader, frame: bytes, body: object, breaches: list[Breach], listener: str, peer: str
    ) -> Answer | None:
        api = wire.api_name(header.api_key)
        for breach in breaches:
            self._metrics.identifier_breaches.labels(api, breach.kind.name.lower(), self.mode).inc()
        first = breaches[0]
        self._audit.emit(
            "identifier_breach",
            listener=listener,
            peer=peer,
            mode=self.mode,
            api=api,
            api_version=header.api_version,
            client_id=header.client_id,
            breaches=[
                {"kind": b.kind.name.lower(), "path": b.path, "length": b.length, "limit": b.limit} for b in breaches
            ],
        )
        observe = self.mode == "observe"
        log.warning(
            "%s %s: %s%s",
            "would refuse" if observe else "refused",
            api,
            first.message,
            " (observe mode)" if observe else "",
            extra={"peer": peer, "listener": listener},
        )
        if observe:
            return None
        close_after = any(b.kind is IdentifierKind.CLIENT_ID for b in breaches)
        if header.api_key == wire.PRODUCE and wire.produce_acks(frame, header.api_version) == 0:
            return Answer(None, True, "identifier_too_long", first.message)
        if body is None:
            body = wire.decode_request(frame, header.api_key, header.api_version)
        element_errors = {b.element_path: (b.error_code, b.message) for b in breaches if b.element_path}
        answer = build_error_frame(header, body, first.error_code, first.message, element_errors=element_errors)
        return Answer(answer, close_after, "identifier_too_long", first.message)
