"""The replay-policy decision (pure): execute, re-execute, confirm or interrupt."""

from __future__ import annotations

import itertools

import pytest

from baton.hands.replay import ReplayDecision, decide

POLICIES = ("safe", "confirm", "unsafe")


def _decide(saved: str, current: str, *, has_confirm: bool = True, recovering: bool = True,
            delivery: int = 2, max_deliver: int = 5) -> ReplayDecision:
    return decide(recovering=recovering, saved=saved, current=current,  # type: ignore[arg-type]
                  has_confirm=has_confirm, delivery=delivery, max_deliver=max_deliver)


@pytest.mark.parametrize(("saved", "current"), list(itertools.product(POLICIES, POLICIES)))
def test_a_first_attempt_always_executes(saved: str, current: str) -> None:
    # Even on the last delivery: nothing has acted yet, so there is nothing to replay.
    decision = _decide(saved, current, recovering=False, delivery=5)
    assert decision == ReplayDecision("execute") and decision.acts


def test_safe_reexecutes_only_when_saved_and_current_are_both_safe() -> None:
    assert _decide("safe", "safe").action == "reexecute"
    assert _decide("safe", "confirm").action == "interrupt"
    assert _decide("safe", "unsafe").action == "interrupt"
    assert _decide("unsafe", "safe").action == "interrupt"  # saved unsafe: never replayed


def test_confirm_needs_a_saved_confirm_policy_and_a_confirm_function() -> None:
    assert _decide("confirm", "confirm").action == "confirm"
    assert _decide("confirm", "safe").action == "confirm"  # got stronger: confirm still works
    no_fn = _decide("confirm", "confirm", has_confirm=False)
    assert no_fn.action == "interrupt" and "no confirm function" in no_fn.reason
    weaker = _decide("confirm", "unsafe")
    assert weaker.action == "interrupt" and "changed from 'confirm' to 'unsafe'" in weaker.reason


def test_unsafe_is_interrupted_with_a_reason_the_model_can_read() -> None:
    decision = _decide("unsafe", "unsafe")
    assert decision.action == "interrupt" and not decision.acts
    assert "ended without a result" in decision.reason
    assert "not safe to replay" in decision.reason


@pytest.mark.parametrize(("saved", "current"), [("safe", "safe"), ("confirm", "confirm")])
def test_a_replay_on_the_last_delivery_fails_instead(saved: str, current: str) -> None:
    assert _decide(saved, current, delivery=4, max_deliver=5).acts
    last = _decide(saved, current, delivery=5, max_deliver=5)
    assert last.action == "fail" and not last.acts
    assert "5 deliveries without a result" in last.reason
    assert _decide(saved, current, delivery=7, max_deliver=5).action == "fail"


def test_interrupting_on_the_last_delivery_stays_an_interrupt() -> None:
    # Interrupting acts on nothing, so it cannot be what kills workers: keep the precise fate.
    assert _decide("unsafe", "unsafe", delivery=5, max_deliver=5).action == "interrupt"
