"""One config generation: everything the request path reads per frame, built once
from a config and swapped by one reference on reload, so every connection, old
or new, reads the current limits at its next frame.

It holds the limits the frame reader checks, and the per-API hooks of the
policies with the table derived from them: which requests and responses are
decoded (everything else, Produce and Fetch above all, travels as bytes), which
versions the codec must know, and which versions clients are offered. The state
that outlives a generation (connection counts, the memory pool, tracked groups)
lives in the policies themselves, which a reload reconfigures in place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from policies.api_keys import API_VERSIONS, INT_MAX
from policies.connections import send_stall_timeout
from policies.decision import Decision
from policies.group_size import GroupSizePolicy
from policies.mode import Mode
from proxy.config.model import Config, Listener
from proxy.evidence.decisions import DecisionRecorder
from proxy.evidence.observation_window import ObservationWindow
from proxy.hooks.api_hooks import EVERY_API, ApiHook, ApiVersionCaps, BrokerAddresses, IdentifierLengths
from proxy.hooks.group_hook import GroupHookSource, GroupSizes
from proxy.hooks.request import Request
from proxy.links.brokers import BrokerDirectory
from proxy.protocol import rewrite, wire
from proxy.protocol.error_responses import build_error_frame

UNKNOWN_API = -1  # the request counts' one key for every API key kio does not know (of 2^16)


@dataclass(frozen=True, slots=True)
class ApiPlan:
    request_hooks: tuple[ApiHook, ...]  # read the request (usually none: forward the bytes)
    prepare_hooks: tuple[ApiHook, ...]  # need I/O before deciding (rare)
    response_hooks: tuple[ApiHook, ...]  # read (and may rewrite) the response
    readable: bool  # the codec knows this version (or nothing needs decoding)
    counted_as: int  # the API key its requests are counted under: -1 for every key kio does not know
    api_name: str  # wire.api_name(api_key), named once here: the observation windows key by it per request


class _Plans(dict[tuple[int, int], ApiPlan]):
    """Plans by (API key, API version); a pair missing from it gets a plan made for the asking and
    not kept. The request path reads it by subscript: one lookup, where ``Generation.plan`` costs a call more."""

    def __init__(self, make: Callable[[int, int], ApiPlan]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, key: tuple[int, int]) -> ApiPlan:
        return self._make(*key)


def _address_of(listener: Listener) -> Callable[[int], tuple[str, int]]:
    host, base = listener.advertised_host, listener.node_port_base
    return lambda node_id: (host, base + node_id)


class Generation:
    def __init__(
        self,
        number: int,
        config: Config,
        *,
        groups: GroupSizePolicy | GroupHookSource,
        directory: BrokerDirectory,
        recorder: DecisionRecorder,
        window: ObservationWindow | None = None,
    ) -> None:
        self.number = number
        self.config = config
        policies = config.policies
        self._recorder = recorder
        self.socket_request_max_bytes = policies.socket_request_max_bytes
        self.sasl_server_max_receive_size = policies.sasl_server_max_receive_size
        # read at every send to a client, so a reload reaches open connections
        self.send_stall_s = send_stall_timeout(policies.connections_max_idle_ms)
        self.request_body_timeout_s = policies.request_body_timeout_ms / 1000
        self.response_size_mode = Mode(policies.mode_of(policies.response_size_mode))
        self.max_response_size = {lst.name: policies.max_response_size_for(lst.name) for lst in config.listeners}

        hooks: list[ApiHook] = []
        identifiers = policies.identifier_limits()
        if identifiers.enabled:
            mode = Mode(policies.mode_of(policies.resource_identifier_limit_mode))
            hooks.append(IdentifierLengths(identifiers, mode, window))
        group_config = policies.group_size_config()
        # Tracking costs decoding group traffic: only when a limit is set.
        if (
            group_config.group_max_size < INT_MAX
            or group_config.group_consumer_max_size < INT_MAX
            or group_config.join_rate_per_minute > 0
        ):
            # with workers, the hook of the owner's policy (proxy/workers/worker_groups.py)
            hooks.append(GroupSizes(groups, window) if isinstance(groups, GroupSizePolicy) else groups.hook(window))
        self.rewrites = config.mode == "cluster"
        if self.rewrites:
            hooks.append(BrokerAddresses(directory, {lst.name: _address_of(lst) for lst in config.listeners}))
        decoded = frozenset().union(*(hook.decoded_api_keys for hook in hooks))
        if self.rewrites:
            decoded |= rewrite.ADDRESS_APIS
        if decoded or self.rewrites:
            hooks.append(ApiVersionCaps(decoded, cluster_mode=self.rewrites))
        self.hooks = tuple(hooks)
        self.decoded_api_keys = decoded

        # The decode table: API key -> the hooks that read its requests.
        every = tuple(h for h in hooks if h.request_api_keys is EVERY_API)
        self._every_request = every
        self._request_hooks: dict[int, tuple[ApiHook, ...]] = {}
        for hook in hooks:
            if hook.request_api_keys is not EVERY_API:
                for api_key in hook.request_api_keys:
                    self._request_hooks[api_key] = (*self._request_hooks.get(api_key, every), hook)
        # One plan for every API version kio knows, made now: the table never grows. A pair
        # read from a header that kio does not know gets its plan made for that request and
        # not kept, or 2^32 pairs a client can name would each hold one until a reload.
        self.plans = _Plans(self._make_plan)
        self.plans.update((pair, self._make_plan(*pair)) for pair in wire.known_versions())

    def plan(self, api_key: int, api_version: int) -> ApiPlan:
        """What the request path does with this API version (decided once per version kio knows)."""
        return self.plans[(api_key, api_version)]

    def _make_plan(self, api_key: int, api_version: int) -> ApiPlan:
        requests = self._request_hooks.get(api_key, self._every_request)
        responses = tuple(h for h in self.hooks if h.reads_response(api_key, api_version))
        decoded = api_key in self.decoded_api_keys or bool(responses)
        # A version the codec does not know of an API the proxy must decode: the client ignored
        # the versions it was offered. It cannot be checked, so it is not forwarded: the
        # connection closes, as Kafka closes it for a version it does not support
        # (Processor.parseRequestHeader). ApiVersions is exempt: the broker answers an unknown
        # version itself (UNSUPPORTED_VERSION, as v0). Any other API kio does not know travels
        # as bytes, and the broker decides (Kafka closes; a newer broker may know it).
        readable = not decoded or api_key == API_VERSIONS or wire.codec_knows(api_key, api_version)
        prepares = tuple(h for h in requests if api_key in h.prepare_api_keys)
        counted_as = api_key if wire.max_known_version(api_key) is not None else UNKNOWN_API
        return ApiPlan(requests, prepares, responses, readable, counted_as, wire.api_name(api_key))

    async def prepare(self, request: Request, hooks: tuple[ApiHook, ...]) -> None:
        for hook in hooks:
            await hook.prepare(request)

    def check_request(self, request: Request, hooks: tuple[ApiHook, ...]) -> Decision | None:
        """Every hook's decision is recorded (observe mode too); the first enforced one is returned."""
        for hook in hooks:
            decision = hook.on_request(request)
            if decision is None:
                continue
            self._recorder.record(
                decision,
                request.where,
                client_id=request.client_id,
                api_key=request.api_key,
                api_version=request.api_version,
                correlation_id=request.correlation_id,
                size=request.end - request.start,
            )
            if decision.enforced:
                # Answered by the proxy, never forwarded: the other hooks let go of what they took
                # for it (a group join admitted before, or by the owner in prepare).
                for other in hooks:
                    if other is not hook:
                        other.on_unanswered(request)
                return decision
        return None

    def answer(self, request: Request, decision: Decision) -> bytes:
        """The error response the proxy writes instead of the broker's."""
        assert decision.error_code is not None
        return build_error_frame(
            request.header(),
            request.body,
            decision.error_code,
            decision.reason,
            element_errors=decision.element_errors,
            throttle_ms=decision.throttle_ms,
        )

    async def on_response(self, request: Request, hooks: tuple[ApiHook, ...], frame: bytes) -> bytes | None:
        """The response as the client must see it: None when no hook changed it."""
        try:
            response = wire.decode_response(frame, request.api_key, request.api_version)
        except wire.MalformedFrame:
            if request.api_key == API_VERSIONS:
                return None  # UNSUPPORTED_VERSION is answered as v0: the client retries lower
            raise
        body: Any = response.body
        for hook in hooks:
            body = await hook.on_response(request, body)
        if body is response.body:
            return None
        return wire.encode_frame(response.header, body)
