"""The one decision type: its defaults are empty and shared, it is frozen, and
``enforced`` is what the shell carries out."""

from __future__ import annotations

import dataclasses

import pytest

from policies.decision import Action, Decision, Policy
from policies.mode import Mode


def test_a_decision_defaults_to_no_victims_no_element_errors_and_no_subject() -> None:
    first = Decision(Policy.CONNECTIONS, Action.WAIT, Mode.ENFORCE, "max.connections", "full")
    second = Decision(Policy.MEMORY_POOL, Action.WAIT, Mode.OBSERVE, "queued.max.request.bytes", "full")
    assert (first.limit, first.error_code, first.throttle_ms, first.victims, first.close_after) == (
        None,
        None,
        0,
        (),
        False,
    )
    assert first.element_errors == {} and first.subject == {}
    with pytest.raises(TypeError):
        first.subject["size"] = 1  # type: ignore[index]
    assert second.subject == {}


def test_only_an_enforce_mode_decision_is_carried_out() -> None:
    enforced = Decision(Policy.GROUP_SIZE, Action.REFUSE, Mode.ENFORCE, "group.max.size", "full", limit=2)
    observed = dataclasses.replace(enforced, mode=Mode.OBSERVE)
    assert enforced.enforced and not observed.enforced
    with pytest.raises(dataclasses.FrozenInstanceError):
        enforced.mode = Mode.OBSERVE  # type: ignore[misc]
