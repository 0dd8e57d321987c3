"""The one outcome type: what the pipeline returns and the actors act on."""

from __future__ import annotations

from reports.outcome import Kind, Outcome


def test_a_deferral_is_a_value_with_its_delay_and_its_reason() -> None:
    deferral = Outcome.deferred(2.5, "claim held by another copy")

    assert deferral.is_deferred and deferral.kind is Kind.DEFERRED
    assert (deferral.delay_seconds, deferral.reason) == (2.5, "claim held by another copy")
    assert str(deferral) == "deferred"


def test_the_final_outcomes_are_not_deferrals_and_read_as_their_metric_label() -> None:
    finals = [Outcome.DELIVERED, Outcome.SKIPPED, Outcome.CANCELLED, Outcome.ALREADY_DONE]

    assert not any(outcome.is_deferred for outcome in finals)
    assert [str(outcome) for outcome in finals] == ["delivered", "skipped", "cancelled", "already_done"]
    assert Outcome(Kind.DELIVERED) == Outcome.DELIVERED
