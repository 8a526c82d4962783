"""The per-connection session, driven directly (as h11's tests drive its state
machine): response order whoever answers, acks=0 Produce, and drain."""

from __future__ import annotations

import pytest

from proxy.protocol.session import Pending, Session, State, UnexpectedResponse


def forwarded(session: Session, correlation_id: int) -> Pending:
    request = Pending(correlation_id, 3, 12, size=10)
    session.forwarded(request)
    return request


def answered(session: Session, correlation_id: int) -> tuple[Pending, bool]:
    request = Pending(correlation_id, 11, 9, size=10, answer=b"answer-%d" % correlation_id)
    return request, session.answered_by_proxy(request)


def test_responses_are_matched_to_requests_in_the_order_they_were_sent() -> None:
    session = Session()
    first, second = forwarded(session, 1), forwarded(session, 2)
    assert session.on_response(1) is first
    assert session.delivered() is first
    assert session.on_response(2) is second
    assert session.delivered() is second
    assert session.in_flight == 0


def test_a_response_out_of_order_is_refused_naming_both_ids() -> None:
    session = Session()
    forwarded(session, 1)
    forwarded(session, 2)
    with pytest.raises(UnexpectedResponse, match="correlation id 2, expected 1"):
        session.on_response(2)


def test_an_answer_with_nothing_ahead_goes_out_at_once() -> None:
    session = Session()
    request, now = answered(session, 7)
    assert now and session.answers_ready()
    assert session.delivered() is request


def test_an_answer_behind_a_forwarded_request_waits_for_its_response() -> None:
    session = Session()
    first = forwarded(session, 1)
    request, now = answered(session, 2)
    assert not now and not session.answers_ready()
    assert session.on_response(1) is first
    session.delivered()
    assert session.answers_ready()
    assert session.delivered() is request


def test_a_broker_response_while_the_proxys_answer_is_at_the_head_is_unexpected() -> None:
    session = Session()
    answered(session, 1)
    forwarded(session, 2)
    with pytest.raises(UnexpectedResponse, match="expected none"):
        session.on_response(2)


def test_an_answer_to_acks_zero_produce_is_dropped_once() -> None:
    session = Session()
    session.forwarded_without_answer(5)
    first = forwarded(session, 6)
    assert session.on_response(5) is None  # e.g. Tansu answers acks=0 anyway
    assert session.on_response(6) is first
    session.delivered()
    with pytest.raises(UnexpectedResponse):
        session.on_response(5)


def test_only_the_latest_acks_zero_ids_are_remembered() -> None:
    session = Session()
    for correlation_id in range(100):
        session.forwarded_without_answer(correlation_id)
    with pytest.raises(UnexpectedResponse):
        session.on_response(0)
    assert session.on_response(99) is None


@pytest.mark.parametrize(
    ("pending_before", "state_after_stop", "deliveries_to_done"),
    [(0, State.DONE, 0), (1, State.DRAINING, 1), (3, State.DRAINING, 3)],
)
def test_drain_takes_no_more_requests_and_ends_once_everything_taken_is_answered(
    pending_before: int, state_after_stop: State, deliveries_to_done: int
) -> None:
    session = Session()
    for correlation_id in range(pending_before):
        forwarded(session, correlation_id)
    session.stop()
    assert session.state is state_after_stop
    assert not session.taking_requests
    for correlation_id in range(deliveries_to_done):
        assert session.state is State.DRAINING
        session.on_response(correlation_id)
        session.delivered()
    assert session.state is State.DONE


def test_stop_twice_is_stop_once() -> None:
    session = Session()
    forwarded(session, 1)
    session.stop()
    session.stop()
    assert session.state is State.DRAINING


def test_a_client_that_leaves_ends_the_session_with_requests_unanswered() -> None:
    session = Session()
    forwarded(session, 1)
    session.client_left()
    assert session.state is State.DONE and session.in_flight == 1
