"""Consumer groups through ``workers: N`` (issue 29): which worker carried each member's join,
read from the proxy's own log, and members placed so a group's joins span workers.

A worker logs each join the owner decided (at DEBUG, which ``start_workers`` turns on)::

    ... group join decided by the owner group=g client_id=m-1 conn_id=w1:external-4 decision=admit worker=1

``decision`` is ``admit``, or the decision's action and mode (``refuse-enforce``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from tests.clients import Member, refused, wait_for
from tests.conftest import ProxyProcess

_JOIN = re.compile(
    r"group join decided by the owner group=(\S+) client_id=(\S+) conn_id=w(\d+):\S+ decision=(\S+) worker=(\d+)"
)
# SO_REUSEPORT's hash spreads connections at random: a candidate's joins land where the first
# member's did with a chance of 1/N each time, so 12 candidates all do so with a chance of 2^-12 at worst.
MAX_CANDIDATES = 12
GROUP_MAX_SIZE_REACHED = 81
MEMBER_ID_REQUIRED = 79


def joins(proxy: ProxyProcess, group: str) -> list[tuple[str, int, str]]:
    """(client id, worker, decision) of each join of ``group`` the owner decided, in log order."""
    found = []
    for found_group, client_id, conn_worker, decision, worker in _JOIN.findall(proxy.log()):
        assert conn_worker == worker, f"connection id w{conn_worker}: logged by worker {worker}"
        if found_group == group:
            found.append((client_id, int(worker), decision))
    return found


def workers_of(proxy: ProxyProcess, group: str, client_id: str) -> set[int]:
    """The workers whose connections carried this member's joins."""
    return {worker for found, worker, _ in joins(proxy, group) if found == client_id}


def assigned(*members: Member) -> Callable[[], bool]:
    return lambda: all(member.has_assignment() for member in members)


def members_on_two_workers(
    proxy: ProxyProcess, group: str, start: Callable[[str], Member], timeout: float = 40
) -> tuple[Member, Member]:
    """Two members of ``group``, each assigned, whose joins went through different workers.
    A candidate whose joins went through the first member's worker leaves (its slot frees) and
    another one is started: the kernel chooses the worker, so the test finds a spread, not assumes it."""
    first = start("m-0")
    assert wait_for(first.has_assignment, timeout=timeout), first.errors
    used = workers_of(proxy, group, "m-0")
    assert len(used) == 1, used  # one coordinator connection
    for n in range(1, MAX_CANDIDATES + 1):
        candidate = start(f"m-{n}")
        assert wait_for(assigned(first, candidate), timeout=timeout), (
            candidate.errors,
            first.errors,
        )
        if workers_of(proxy, group, f"m-{n}") - used:
            return first, candidate
        candidate.stop()
    raise AssertionError(f"{MAX_CANDIDATES} candidates' joins all went through worker {used}")


def refused_join(
    proxy: ProxyProcess, group: str, member: Member, client_id: str, seen: Callable[[Member], bool] = refused
) -> int:
    """The worker that answered this member's join GROUP_MAX_SIZE_REACHED itself (the owner refused
    it), once the client has ``seen`` the refusal."""
    assert wait_for(lambda: seen(member)), member.errors
    refusals = [w for found, w, decision in joins(proxy, group) if found == client_id and decision == "refuse-enforce"]
    assert refusals, joins(proxy, group)
    return refusals[0]


def owner_group_members(proxy: ProxyProcess) -> tuple[float, float]:
    """(groups tracked, members) as the owner's policy counts them (the supervisor's /metrics)."""
    return (
        proxy.metric("kafka_admission_groups_tracked"),
        proxy.metric("kafka_admission_group_members_sum"),
    )


def group_members_metric_is(proxy: ProxyProcess, members: int) -> Callable[[], bool]:
    return lambda: owner_group_members(proxy) == (1.0, float(members))
