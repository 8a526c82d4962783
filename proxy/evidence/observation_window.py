"""Observation windows: O(1) bookkeeping per request of what the traffic looked
like (sizes per client id and API, group sizes, pool depth, connections,
identifier lengths), turned every ``audit.window.seconds`` into the ``window``
rows of ``schema/audit-event-v2.schema.json``. They let the report answer
"what would limit X have done?" for limits that were never configured.

Pure Python, no clock: the caller passes Unix time to ``roll``. Not thread-safe:
one event loop feeds it. Memory is bounded in keys and in bytes: each section
keeps at most ``max_keys`` distinct keys per window, and all sections' keys
together at most ``max_key_bytes`` (client and group ids come from the wire, up
to 32 KiB each: 10k of them would be ~320 MB a section). The rest are folded
into one row per section with ``overflow: true`` (counts summed, maxima kept,
its key fields null) and ``overflow_cap`` naming the cap that first folded a key
(``keys`` or ``key_bytes``).

Wiring, for the request path:

- ``on_request(listener, client_id, api, size)`` per request frame read;
  ``on_response(...)`` per response frame written to the client (same key).
- ``on_group_size(group_id, kind, members)`` when a group's member count is known
  (``kind``: ``classic`` or ``consumer``).
- ``on_identifier(kind, client_id, value)`` per identifier the KIP-1233 check
  looks at (``kind`` as in the decision events, e.g. ``group_id``).
- ``on_pool(in_flight_bytes, waited)`` whenever the bytes of requests read and not
  yet answered change (reserve and release), pool on or off; ``waited=True`` once
  per request that waited or would have waited. ``pool_capacity_bytes`` is
  ``queued.max.request.bytes`` (-1: off); set it again on reload.
- ``on_connection_open(listener, tls)`` / ``on_connection_close(listener, tls)``.
- ``sections``: the sections ``roll`` writes. With ``workers: N`` each worker writes all but
  ``connections``, and the supervisor only ``connections``, counted by the owner of the
  connection limits: the whole proxy's peak, which no sum of the workers' peaks gives.
- ``roll(now)`` every window: the finished window's rows (``type: window``,
  without ``ts``/``instance``/``schema_version``, which ``AuditSink.record``
  stamps), and a new window begins at ``now``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from policies.identifier_limits import IDENTIFIER_KEPT, java_length

SECTIONS = frozenset({"client_api", "group", "identifier", "pool", "connections"})
DEFAULT_MAX_KEYS = 10_000
# All sections' keys of one window: ample for 10k keys a section of ordinary ids (a key of
# three ~60-character strings is charged ~450 bytes, an identifier key ~1.7 KB).
DEFAULT_MAX_KEY_BYTES = 32 * 1024 * 1024
# What a key costs besides its strings: its dict entry, its tuple and its slot list.
_KEY_OVERHEAD = 256
# The identifier a slot keeps grows to IDENTIFIER_KEPT characters: charged at its widest up front.
_KEPT_BYTES = sys.getsizeof("\U00010000" * IDENTIFIER_KEPT)

_K = TypeVar("_K", bound=tuple[str | None, ...])

# Slot layouts (lists of ints: cheaper to update in place than objects with attributes).
_REQUESTS, _BYTES_IN, _BYTES_OUT, _MAX_REQUEST, _MAX_RESPONSE = range(5)
_OPEN, _MAX_OPEN, _OPENED, _CLOSED = range(4)


def window_edge(now: float, seconds: float) -> float:
    """The last edge of the window grid (multiples of ``seconds`` of Unix time) at or before ``now``.
    With ``workers: N`` every process of one proxy rolls its windows on this grid, so their rows of
    one window share its ``window_start`` and the report counts one window of one proxy."""
    return now - now % seconds


class _KeyBytes:
    """The bytes the keys of one window may still take, shared by its sections."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left


class _Section(dict[_K, list[Any]], Generic[_K]):
    """One section's slots for one window: key -> slot, at most ``max_keys`` of them, each
    charged its size to the window's ``budget``."""

    def __init__(self, max_keys: int, budget: _KeyBytes, blank: list[Any], no_key: _K, slot_bytes: int = 0) -> None:
        super().__init__()
        self.max_keys = max_keys
        self.budget = budget
        self.blank = blank
        self.no_key = no_key  # the overflow row's key fields: all null
        self.slot_bytes = slot_bytes  # what a slot holds besides numbers (a kept identifier)
        self.overflow: list[Any] | None = None
        self.overflow_cap = ""  # the cap that folded the first key: "keys" or "key_bytes"

    def new_slot(self, key: _K) -> list[Any]:
        """The slot for a key not seen yet in this window (the slow path)."""
        if len(self) >= self.max_keys:
            cap = "keys"
        else:
            cost = _KEY_OVERHEAD + self.slot_bytes + sum(sys.getsizeof(part) for part in key if part is not None)
            if cost <= self.budget.left:
                self.budget.left -= cost
                slot = self[key] = list(self.blank)
                return slot
            cap = "key_bytes"
        if self.overflow is None:
            self.overflow = list(self.blank)
            self.overflow_cap = cap
        return self.overflow

    def rows(self, row: Callable[[_K, list[Any]], dict[str, Any]]) -> list[dict[str, Any]]:
        out = [row(key, slot) for key, slot in self.items()]
        if self.overflow is not None:
            out.append(row(self.no_key, self.overflow))
            out[-1]["overflow"] = True
            out[-1]["overflow_cap"] = self.overflow_cap
        return out


class ObservationWindow:
    def __init__(
        self,
        start: float,
        *,
        pool_capacity_bytes: int = -1,
        max_keys: int = DEFAULT_MAX_KEYS,
        max_key_bytes: int = DEFAULT_MAX_KEY_BYTES,
        sections: frozenset[str] = SECTIONS,
    ) -> None:
        self.pool_capacity_bytes = pool_capacity_bytes
        self.sections = sections
        self._max_keys = max_keys
        self._max_key_bytes = max_key_bytes
        self._pool_in_flight = 0
        # Connections are few keys (listener x TLS) and their open count spans windows: no cap.
        self._connections: dict[tuple[str, bool], list[int]] = {}
        self._begin(start)

    def _begin(self, start: float) -> None:
        self._start = start
        cap, budget = self._max_keys, _KeyBytes(self._max_key_bytes)
        self._client_api: _Section[tuple[str | None, str | None, str | None]] = _Section(
            cap, budget, [0, 0, 0, 0, 0], (None, None, None)
        )
        self._groups: _Section[tuple[str | None, str | None]] = _Section(cap, budget, [0], (None, None))
        self._identifiers: _Section[tuple[str | None, str | None]] = _Section(
            cap, budget, [-1, None], (None, None), slot_bytes=_KEPT_BYTES
        )
        self._pool_high_water_mark = self._pool_in_flight
        self._pool_waits = 0
        self._connections = {key: [s[_OPEN], s[_OPEN], 0, 0] for key, s in self._connections.items() if s[_OPEN]}

    # --- hot path: one dict lookup and a few integer updates each ---

    def on_request(self, listener: str, client_id: str | None, api: str, size: int) -> None:
        key = (listener, client_id, api)
        slot = self._client_api.get(key) or self._client_api.new_slot(key)
        slot[_REQUESTS] += 1
        slot[_BYTES_IN] += size
        if size > slot[_MAX_REQUEST]:
            slot[_MAX_REQUEST] = size

    def on_response(self, listener: str, client_id: str | None, api: str, size: int) -> None:
        key = (listener, client_id, api)
        slot = self._client_api.get(key) or self._client_api.new_slot(key)
        slot[_BYTES_OUT] += size
        if size > slot[_MAX_RESPONSE]:
            slot[_MAX_RESPONSE] = size

    def on_group_size(self, group_id: str, kind: str, members: int) -> None:
        key = (group_id, kind)
        slot = self._groups.get(key) or self._groups.new_slot(key)
        if members > slot[0]:
            slot[0] = members

    def on_identifier(self, kind: str, client_id: str | None, value: str) -> None:
        key = (kind, client_id)
        slot = self._identifiers.get(key) or self._identifiers.new_slot(key)
        length = len(value) if value.isascii() else java_length(value)  # the common case without a call
        if length > slot[0]:
            slot[0] = length
            slot[1] = value[:IDENTIFIER_KEPT]

    def on_pool(self, in_flight_bytes: int, waited: bool = False) -> None:
        self._pool_in_flight = in_flight_bytes
        if in_flight_bytes > self._pool_high_water_mark:
            self._pool_high_water_mark = in_flight_bytes
        if waited:
            self._pool_waits += 1

    def on_connection_open(self, listener: str, tls: bool) -> None:
        slot = self._connections.get((listener, tls))
        if slot is None:
            slot = self._connections[(listener, tls)] = [0, 0, 0, 0]
        slot[_OPEN] += 1
        slot[_OPENED] += 1
        if slot[_OPEN] > slot[_MAX_OPEN]:
            slot[_MAX_OPEN] = slot[_OPEN]

    def on_connection_close(self, listener: str, tls: bool) -> None:
        slot = self._connections.get((listener, tls))
        if slot is None:  # opened before this object existed
            slot = self._connections[(listener, tls)] = [0, 0, 0, 0]
        if slot[_OPEN]:
            slot[_OPEN] -= 1
        slot[_CLOSED] += 1

    # --- once per window ---

    def roll(self, now: float) -> list[dict[str, Any]]:
        """The rows of the window that ends at ``now``; a new window starts at ``now``."""
        start, seconds = self._start, max(now - self._start, 0.0)

        def head(section: str) -> dict[str, Any]:
            return {"type": "window", "section": section, "window_start": start, "window_seconds": seconds}

        rows: list[dict[str, Any]] = []
        wanted = self.sections
        if "client_api" in wanted:
            rows += self._client_api.rows(
                lambda key, slot: {
                    **head("client_api"),
                    "listener": key[0],
                    "client_id": key[1],
                    "api": key[2],
                    "requests": slot[_REQUESTS],
                    "bytes_in": slot[_BYTES_IN],
                    "bytes_out": slot[_BYTES_OUT],
                    "max_request_bytes": slot[_MAX_REQUEST],
                    "max_response_bytes": slot[_MAX_RESPONSE],
                }
            )
        if "group" in wanted:
            rows += self._groups.rows(
                lambda key, slot: {
                    **head("group"),
                    "group_id": key[0],
                    "group_kind": key[1],
                    "max_members": slot[0],
                }
            )
        if "identifier" in wanted:
            rows += self._identifiers.rows(
                lambda key, slot: {
                    **head("identifier"),
                    "identifier_kind": key[0],
                    "client_id": key[1],
                    "max_length": slot[0],
                    "identifier": slot[1],
                }
            )
        if "pool" in wanted:
            rows.append(
                {
                    **head("pool"),
                    "capacity_bytes": self.pool_capacity_bytes,
                    "high_water_mark_bytes": self._pool_high_water_mark,
                    "waits": self._pool_waits,
                }
            )
        if "connections" in wanted:
            rows += [
                {
                    **head("connections"),
                    "listener": listener,
                    "tls": tls,
                    "max_open": slot[_MAX_OPEN],
                    "opened": slot[_OPENED],
                    "closed": slot[_CLOSED],
                }
                for (listener, tls), slot in self._connections.items()
            ]
        self._begin(now)
        return rows
