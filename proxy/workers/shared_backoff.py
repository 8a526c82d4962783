"""Workers share their backoff from brokers that cannot be used (policies.upstream_backoff): a new
block in one worker (a broker unreachable, or speaking the other protocol) is told to the supervisor,
which tells every other worker, and each adopts it for the time it has left. One process tries a
broker that is down once per backoff period; N workers, each with its own backoff, tried it N times.
A block is only ever adopted to last longer: one that a worker makes meanwhile is not shortened."""

from __future__ import annotations

from collections.abc import Mapping

from policies.upstream_backoff import SharedBlock
from proxy.links.upstream import UpstreamConnector
from proxy.workers.link import Link

BACKOFF = "worker.backoff"


def share_backoff(connector: UpstreamConnector, link: Link) -> None:
    """A worker's side: its new blocks go to the supervisor; the others' are adopted."""
    connector.on_block = lambda block: link.tell(BACKOFF, block)
    link.handlers[BACKOFF] = connector.adopt


def pass_on_backoff(block: SharedBlock, others: Mapping[int, Link]) -> None:
    """The supervisor's side: a worker's new block, to every other serving worker."""
    for link in others.values():
        link.tell(BACKOFF, block)
