"""Per-API hooks: what each policy reads in requests and responses (in the spirit
of Kroxylicious' per-API filters). A hook says which API keys (and versions) it
reads; the config generation derives from all hooks the one table of what is
decoded, so Produce and Fetch travel as bytes unless a hook asks otherwise.

A request hook answers with a ``Decision`` (None: admit), synchronously; a hook
that needs I/O first (the group size policy asking the coordinator) says for which
APIs and does it in ``prepare``. A response hook returns the response body to send
on (the same object when it changes nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from policies.api_keys import API_VERSIONS, PRODUCE
from policies.decision import Decision
from policies.identifier_limits import (
    Breach,
    IdentifierLimits,
    check_client_id,
    check_request,
    check_transactional_id,
    checked_api_keys,
    decide,
    identifiers,
)
from policies.mode import Mode
from proxy.evidence.observation_window import ObservationWindow
from proxy.hooks.request import Request
from proxy.links.brokers import BrokerDirectory
from proxy.protocol import rewrite


class ApiHook:
    """One policy's reading of the protocol. Subclasses override what they need."""

    # API keys whose requests this hook reads; EVERY_API: all of them (e.g. the header's client id).
    request_api_keys: frozenset[int] = frozenset()
    # API keys whose request bodies it decodes (a subset of request_api_keys): the codec must know the version.
    decoded_api_keys: frozenset[int] = frozenset()
    # API keys whose requests need I/O before the decision (``prepare``): rare, and awaited.
    prepare_api_keys: frozenset[int] = frozenset()

    async def prepare(self, request: Request) -> None:
        """I/O a decision needs first (e.g. asking the coordinator); only for ``prepare_api_keys``."""

    def on_request(self, request: Request) -> Decision | None:
        """The decision on a request (None: admit); synchronous, so it costs no trip through trio."""
        return None

    def reads_response(self, api_key: int, api_version: int) -> bool:
        return False

    async def on_response(self, request: Request, body: Any) -> Any:
        return body

    def on_unanswered(self, request: Request) -> None:
        """The connection ended before the response to this request (one it reads) came, or
        another hook's enforced decision answered it in the broker's place."""


EVERY_API = frozenset({-1})


class IdentifierLengths(ApiHook):
    """KIP-1233: identifier lengths, from the header's client id of every request and
    the identifier fields of the APIs that carry them (Produce's transactional id is
    read in place; its records are never decoded)."""

    request_api_keys = EVERY_API

    def __init__(self, limits: IdentifierLimits, mode: Mode, window: ObservationWindow | None = None) -> None:
        self.limits = limits
        self.mode = mode
        self.decoded_api_keys = checked_api_keys() - {PRODUCE}
        self._window = window
        # The last client id found within its limit. A connection's client id rarely changes, and
        # the check is a pure function of the id and the limits (fixed for this hook, as a reload
        # makes new hooks), so a repeat of that id is within them too: no check per request.
        self._client_id_within: str | None = None

    def on_request(self, request: Request) -> Decision | None:
        # The request's client id and Produce head are read once here: each read is a call.
        api_key, client_id, window = request.api_key, request.client_id, self._window
        if api_key == PRODUCE:
            transactional_id, acks = request.produce_head()
            if window is not None:  # the identifiers' lengths, for the audit's observation windows
                if client_id is not None:
                    window.on_identifier("client_id", client_id, client_id)
                if transactional_id is not None:
                    window.on_identifier("transactional_id", client_id, transactional_id)
            breach = (
                None if client_id is None or client_id == self._client_id_within else self._check_client_id(client_id)
            )
            if transactional_id is None:
                if breach is None:
                    return None  # the common case, decided without building anything
                found = [breach]
            else:
                found = [b for b in (breach, check_transactional_id(transactional_id, self.limits)) if b is not None]
            return decide(found, self.mode, expects_response=acks != 0)
        if window is not None:
            self._observe(window, request, client_id)
        if api_key in self.decoded_api_keys:
            return decide(
                check_request(api_key, request.api_version, request.body, client_id, self.limits),
                self.mode,
            )
        if client_id is None or client_id == self._client_id_within:  # no id, or the last one within
            return None
        breach = self._check_client_id(client_id)
        return None if breach is None else decide([breach], self.mode)

    def _check_client_id(self, client_id: str) -> Breach | None:
        """A client id other than the last one within the limits (None has nothing to check)."""
        breach = check_client_id(client_id, self.limits)
        if breach is None:
            self._client_id_within = client_id
        return breach

    def _observe(self, window: ObservationWindow, request: Request, client_id: str | None) -> None:
        """The identifiers' lengths of a request other than Produce, for the audit's observation
        windows (a limit never set can be weighed against them)."""
        if client_id is not None:
            window.on_identifier("client_id", client_id, client_id)
        if request.api_key in self.decoded_api_keys:
            for kind, value in identifiers(request.api_key, request.api_version, request.body):
                window.on_identifier(kind.name.lower(), client_id, value)


class BrokerAddresses(ApiHook):
    """Cluster mode: every broker address a response names is replaced by this proxy's
    address for that node on the client's listener, and the node's port is opened
    before the client hears of it."""

    def __init__(self, directory: BrokerDirectory, address_of: Mapping[str, Callable[[int], tuple[str, int]]]) -> None:
        self._directory = directory
        self._address_of = address_of

    def reads_response(self, api_key: int, api_version: int) -> bool:
        return rewrite.carries_addresses(api_key, api_version)

    async def on_response(self, request: Request, body: Any) -> Any:
        api_key, version = request.api_key, request.api_version
        await self._directory.learn(rewrite.brokers_in(body, api_key, version))
        listener = request.where.listener or ""
        return rewrite.rewrite_addresses(body, api_key, version, self._address_of[listener])


class ApiVersionCaps(ApiHook):
    """ApiVersions answers offer clients only versions the proxy can read: the newest
    the codec knows for every API a hook decodes, and (cluster mode) Produce and Fetch
    below the versions whose responses carry broker addresses, so their bodies never
    need decoding."""

    def __init__(self, decoded: frozenset[int], cluster_mode: bool) -> None:
        self._decoded = decoded
        self._cluster_mode = cluster_mode

    def reads_response(self, api_key: int, api_version: int) -> bool:
        return api_key == API_VERSIONS

    async def on_response(self, request: Request, body: Any) -> Any:
        if body.error_code != 0:
            return body
        capped = rewrite.cap_api_versions(body, cluster_mode=self._cluster_mode, decoded=self._decoded)
        return body if capped == body else capped
