"""A worker's side of the owner's group service (proxy/workers/owner_groups.py): the group hook
of a worker asks the owner for each join before forwarding it, and tells it every other fact
of the group traffic, so the one ``GroupSizePolicy`` counts the group's members through all
workers.

The ask happens in the hook's ``prepare`` (where an await is allowed), and ``on_request`` returns
the decision it brought, so the request path stays synchronous. A join the owner admitted is named
by this worker's join id (the request's ticket); the owner maps it to its policy's ticket.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable

from policies.api_keys import JOIN_GROUP
from policies.decision import Decision
from policies.group_size import GroupKind, GroupView
from proxy.evidence.observation_window import ObservationWindow
from proxy.hooks.api_hooks import ApiHook
from proxy.hooks.group_hook import GroupTraffic, duration_ms, protocols_fingerprint, state_to_trust
from proxy.hooks.group_reconcile import describe_group
from proxy.hooks.request import Request
from proxy.workers.link import Link, LinkClosed
from proxy.workers.owner_groups import ClassicJoin, ConsumerJoin, Describe

log = logging.getLogger("kafka_admission_proxy.groups")


class SharedGroups:
    """The owner's policy as a worker reaches it: the ``GroupFacts`` the hook reports are told
    (the owner stamps them with its clock: the ``now`` passed here is not sent), joins are asked."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self._join_ids = itertools.count(1)

    def hook(self, window: ObservationWindow | None) -> ApiHook:
        """The group hook of a config generation."""
        return RemoteGroupSizes(self, window)

    def next_join_id(self) -> int:
        return next(self._join_ids)

    async def join(self, join_id: int, join: ClassicJoin | ConsumerJoin, recounted: bool) -> Decision | Describe | None:
        answer: Decision | Describe | None = await self.link.ask("group.join", join_id, join, recounted)
        return answer

    def observed(
        self, group_id: str, members: list[tuple[str, str | None]], state: str | None, kind: GroupKind, sent_at: float
    ) -> None:
        self.link.tell("group.observed", group_id, members, state, kind, sent_at)

    async def view(self, group_id: str) -> GroupView | None:
        view: GroupView | None = await self.link.ask("group.view", group_id)
        return view

    # -- GroupFacts ----------------------------------------------------------------------------

    def on_sync_request(
        self, group_id: str, member_id: str, now: float, *, group_instance_id: str | None = None
    ) -> None:
        self.link.tell("group.sync", group_id, member_id, group_instance_id)

    def on_consumer_heartbeat_request(
        self, group_id: str, member_id: str, member_epoch: int, instance_id: str | None, now: float
    ) -> None:
        self.link.tell("group.heartbeat", group_id, member_id, member_epoch, instance_id)

    def on_join_response(
        self,
        group_id: str,
        request_member_id: str,
        group_instance_id: str | None,
        error_code: int,
        assigned_member_id: str | None,
        generation_id: int,
        now: float,
        *,
        leader_id: str | None = None,
        members: Iterable[tuple[str, str | None]] | None = None,
        ticket: int | None = None,
        session_timeout_ms: int | None = None,
    ) -> None:
        self.link.tell(
            "group.join_response",
            ticket,
            group_id,
            request_member_id,
            group_instance_id,
            error_code,
            assigned_member_id,
            generation_id,
            leader_id,
            None if members is None else list(members),
            session_timeout_ms,
        )

    def on_member_response(
        self,
        api_key: int,
        group_id: str,
        member_id: str,
        error_code: int,
        now: float,
        *,
        group_instance_id: str | None = None,
        generation_id: int | None = None,
    ) -> None:
        self.link.tell(
            "group.member_response", api_key, group_id, member_id, error_code, group_instance_id, generation_id
        )

    def on_leave_group(self, group_id: str, members: Iterable[tuple[str, str | None]], now: float) -> None:
        self.link.tell("group.leave", group_id, list(members))

    def on_consumer_heartbeat_response(
        self,
        group_id: str,
        member_id: str,
        error_code: int,
        assigned_member_id: str | None,
        member_epoch: int,
        now: float,
        *,
        instance_id: str | None = None,
        ticket: int | None = None,
    ) -> None:
        self.link.tell(
            "group.consumer_response",
            ticket,
            group_id,
            member_id,
            error_code,
            assigned_member_id,
            member_epoch,
            instance_id,
        )

    def on_join_unanswered(self, group_id: str, member_id: str, group_instance_id: str | None, ticket: int) -> None:
        self.link.tell("group.unanswered", ticket)


class RemoteGroupSizes(GroupTraffic):
    """A worker's group hook: joins decided by the owner, asked in ``prepare``."""

    def __init__(self, shared: SharedGroups, window: ObservationWindow | None = None) -> None:
        super().__init__(shared, window)
        self.shared = shared
        # join id -> the owner's decision, from prepare to on_request (or on_unanswered, when an
        # earlier hook answered the request itself)
        self._decided: dict[int, Decision | None] = {}

    async def prepare(self, request: Request) -> None:
        """Ask the owner for the join's decision (after a recount at the coordinator, when the
        owner asks for one). Only joins: JoinGroup, and ConsumerGroupHeartbeat with epoch 0."""
        body, shared = request.body, self.shared
        join: ClassicJoin | ConsumerJoin
        if request.api_key == JOIN_GROUP:
            kind = GroupKind.CLASSIC
            join = ClassicJoin(
                body.group_id,
                body.member_id,
                getattr(body, "group_instance_id", None),
                duration_ms(body.session_timeout),
                duration_ms(getattr(body, "rebalance_timeout", None)),
                request.api_version >= 4,
                protocols_fingerprint(body.protocols),
            )
        elif body.member_epoch == 0:
            kind = GroupKind.CONSUMER
            join = ConsumerJoin(body.group_id, body.member_id, body.instance_id)
        else:
            return
        join_id = shared.next_join_id()
        try:
            answer = await shared.join(join_id, join, False)
            if isinstance(answer, Describe):
                described = await describe_group(request.connect_coordinator, request.api_key, join.group_id)
                if described is not None:
                    state = state_to_trust(described.state, kind)
                    shared.observed(join.group_id, described.members, state, kind, answer.sent_at)
                    log.info("reconciled group size with the coordinator", extra={"members": len(described.members)})
                answer = await shared.join(join_id, join, True)
        except BaseException as exc:
            if not isinstance(exc, LinkClosed):  # cancelled (its connection ended): the owner may have admitted it
                shared.on_join_unanswered(join.group_id, join.member_id, None, join_id)
            raise
        assert not isinstance(answer, Describe)
        # Which worker carried which member's join (the log line names the worker): how a spread is seen.
        log.debug(
            "group join decided by the owner",
            extra={
                "group": join.group_id,
                "client_id": request.client_id,
                "conn_id": request.where.conn_id,
                "decision": "admit" if answer is None else f"{answer.action.value}-{answer.mode.value}",
            },
        )
        self._decided[join_id] = answer
        request.ticket = join_id

    def on_join(self, request: Request) -> Decision | None:
        join_id = request.ticket
        if join_id is None:  # not prepared: cannot happen (every join is), so never forward one undecided
            raise RuntimeError("a group join reached on_request without the owner's decision")
        decision = self._decided.pop(join_id)
        if decision is not None and decision.enforced:
            request.ticket = None  # refused or throttled: the owner holds nothing for it
        return decision

    def on_unanswered(self, request: Request) -> None:
        if request.ticket is not None:
            self._decided.pop(request.ticket, None)
        super().on_unanswered(request)

    async def group_view(self, group_id: str) -> GroupView | None:
        try:
            return await self.shared.view(group_id)
        except LinkClosed:
            return None
