"""Backoff from an upstream that speaks the wrong protocol or cannot be reached (sans-I/O)."""

import pytest

from policies.upstream_backoff import Blocked, Cause, UpstreamBackoff

# -- wrong protocol


def test_a_mismatch_blocks_new_connections_until_the_backoff_ends() -> None:
    backoff = UpstreamBackoff(initial_seconds=1, max_seconds=30)
    backoff.on_mismatch("b:9093", "speaks TLS", now=100.0)
    assert backoff.blocked("b:9093", 100.5) is not None
    assert backoff.blocked("b:9093", 101.0) is None
    assert backoff.blocked("other:9092", 100.5) is None


def test_repeated_mismatches_double_the_wait_up_to_the_cap() -> None:
    backoff = UpstreamBackoff(initial_seconds=1, max_seconds=5)
    waits = [backoff.on_mismatch("b", "speaks TLS", now=0.0).retry_at for _ in range(5)]
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_a_healthy_exchange_resets_the_backoff_and_readiness() -> None:
    backoff = UpstreamBackoff(initial_seconds=1, max_seconds=30)
    backoff.on_mismatch("b", "speaks TLS", now=0.0)
    backoff.on_mismatch("b", "speaks TLS", now=0.0)
    assert [m.upstream for m in backoff.known_mismatches()] == ["b"]
    backoff.on_healthy("b")
    assert backoff.known_mismatches() == []
    assert backoff.on_mismatch("b", "speaks TLS", now=10.0).retry_at == 11.0


def test_backoff_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="initial_seconds"):
        UpstreamBackoff(initial_seconds=0)
    with pytest.raises(ValueError, match="unreachable_initial_seconds <= unreachable_max_seconds"):
        UpstreamBackoff(unreachable_initial_seconds=11.0)
    with pytest.raises(ValueError, match="0 < unreachable_initial_seconds"):
        UpstreamBackoff(unreachable_initial_seconds=0.0)


# -- cannot be reached


def test_an_unreachable_broker_blocks_for_a_fifth_of_a_second_first() -> None:
    backoff = UpstreamBackoff()
    block = backoff.on_unreachable("b:9092", "cannot connect: ConnectionRefusedError(111)", now=50.0)
    assert block == Blocked("b:9092", "cannot connect: ConnectionRefusedError(111)", 50.2, Cause.UNREACHABLE, 1)
    assert backoff.blocked("b:9092", 50.1) == block
    assert backoff.blocked("b:9092", 50.2) is None  # then one connection may try again
    assert backoff.blocked("other:9092", 50.1) is None
    assert backoff.known_mismatches() == []  # not a protocol mismatch


def test_repeated_unreachability_doubles_the_wait_up_to_ten_seconds() -> None:
    backoff = UpstreamBackoff()
    now, delays = 0.0, []
    for _ in range(9):
        block = backoff.on_unreachable("b", "connect timed out", now)
        assert block is not None
        delays.append(round(block.retry_at - now, 6))
        now = block.retry_at  # the next try, once the block ends, fails again
    assert delays == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0, 10.0]
    assert block.failures == 9


def test_failures_of_attempts_begun_before_the_block_neither_extend_nor_repeat_it() -> None:
    backoff = UpstreamBackoff()
    first = backoff.on_unreachable("b", "refused", now=0.0)
    # nine more client connections were already connecting when the first failed
    assert [backoff.on_unreachable("b", "refused", now=0.05) for _ in range(9)] == [None] * 9
    assert backoff.blocked("b", 0.1) == first
    assert backoff.blocked("b", 0.2) is None
    second = backoff.on_unreachable("b", "refused", now=0.2)
    assert second is not None and (second.retry_at, second.failures) == (pytest.approx(0.6), 2)


def test_while_a_broker_is_down_new_connections_fail_fast_and_few_try_it() -> None:
    """One producer reconnecting every 50 ms for 5 s: 98 connections, a handful of tries and report lines."""
    backoff = UpstreamBackoff()
    tries, reported, failed_fast = 0, 0, 0
    for i in range(98):
        now = i * 0.05
        if backoff.blocked("b", now) is not None:
            failed_fast += 1
            continue
        tries += 1  # connects, is refused
        if backoff.on_unreachable("b", "refused", now) is not None:
            reported += 1
    # tries at 0, 0.2, 0.6, 1.4, 3.0 (blocks of 0.2, 0.4, 0.8, 1.6, 3.2 s)
    assert (tries, reported, failed_fast) == (5, 5, 93)


def test_a_healthy_exchange_forgets_unreachability_and_mismatches() -> None:
    backoff = UpstreamBackoff()
    for now in (0.0, 1.0, 2.0):
        backoff.on_unreachable("b", "refused", now)
    backoff.on_mismatch("b", "speaks TLS", now=2.0)
    backoff.on_healthy("b")
    assert backoff.blocked("b", 2.1) is None and backoff.known_mismatches() == []
    block = backoff.on_unreachable("b", "refused", now=3.0)
    assert block is not None and (block.retry_at, block.failures) == (3.2, 1)


def test_blocked_names_the_longer_of_a_mismatch_and_unreachability() -> None:
    backoff = UpstreamBackoff(initial_seconds=1.0)
    unreachable = backoff.on_unreachable("b", "refused", now=0.0)
    mismatch = backoff.on_mismatch("b", "speaks TLS", now=0.0)
    assert unreachable is not None and unreachable.retry_at < mismatch.retry_at
    assert backoff.blocked("b", 0.1) == mismatch
    assert backoff.blocked("b", 0.5) == mismatch
    # the causes double separately: the mismatch's wait does not lengthen the next unreachable block
    later = backoff.on_unreachable("b", "refused", now=1.0)
    assert later is not None and later.retry_at == pytest.approx(1.4)
    assert backoff.blocked("b", 1.2) == later


# -- shared between the workers of workers: N


def test_a_block_told_to_another_process_blocks_there_for_what_it_has_left() -> None:
    here, there = UpstreamBackoff(), UpstreamBackoff()
    block = here.on_unreachable("b:9092", "cannot be reached", now=100.0)
    assert block is not None
    shared = here.share(block, now=100.05)
    assert shared.remaining == pytest.approx(0.15) and shared.delay == 0.2 and shared.failures == 1
    adopted = there.adopt(shared, now=7.0)  # another clock
    assert adopted == Blocked("b:9092", "cannot be reached", pytest.approx(7.15), Cause.UNREACHABLE, 1)
    assert there.blocked("b:9092", 7.1) == adopted
    assert there.blocked("b:9092", 7.16) is None
    # The next failure there doubles from the adopted block, as it would have here.
    again = there.on_unreachable("b:9092", "cannot be reached", now=7.2)
    assert again is not None and again.retry_at == pytest.approx(7.6) and again.failures == 2


def test_an_adopted_block_never_shortens_a_longer_one() -> None:
    backoff = UpstreamBackoff(initial_seconds=1, max_seconds=30)
    for _ in range(3):
        long = backoff.on_mismatch("b", "speaks TLS", now=0.0)  # 4 s
    other = UpstreamBackoff(initial_seconds=1, max_seconds=30)
    short = other.share(other.on_mismatch("b", "speaks TLS", now=0.0), now=0.0)  # 1 s
    assert backoff.adopt(short, now=0.0) is None
    assert backoff.blocked("b", 3.9) == long
    assert [m.upstream for m in backoff.known_mismatches()] == ["b"]
