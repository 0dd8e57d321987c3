"""Which failures are permanent, and which say the mail provider itself is down: one table, one place."""

from __future__ import annotations

import pytest

from reports.errors import (
    ClaimHeld,
    InvalidPayload,
    InvalidRecipient,
    MailDeferred,
    MailRejected,
    PermanentError,
    ProviderUnavailable,
    ReportsError,
    TransientError,
    UnknownTemplateVersion,
    is_provider_failure,
)
from reports.worker.retries import is_permanent

CASES = [
    # (exception, permanent, provider failure)
    (MailRejected(550, "5.1.1 No such user"), True, False),
    (MailRejected(553, "5.1.3 Bad recipient address syntax"), True, False),
    (MailRejected(554, "5.7.1 Message rejected"), True, False),
    (InvalidRecipient(), True, False),
    (InvalidPayload("Payload fields: missing ['user_id'], unexpected []."), True, False),
    (UnknownTemplateVersion(), True, False),
    (MailDeferred(421, "4.3.2 Service not available, closing channel"), False, True),
    (MailDeferred(450, "4.2.1 Mailbox busy"), False, False),
    (MailDeferred(451, "4.3.0 Local error in processing"), False, False),
    (MailDeferred(452, "4.3.1 Insufficient system storage"), False, False),
    (ProviderUnavailable(), False, True),
    (ClaimHeld(retry_after_seconds=3.0), False, False),
    (ConnectionRefusedError(111, "Connection refused"), False, False),
    (TimeoutError("timed out"), False, False),
    (RuntimeError("a bug"), False, False),
]


@pytest.mark.parametrize(
    ("exception", "permanent", "provider_failure"),
    CASES,
    ids=[f"{type(e).__name__}-{getattr(e, 'code', '')}" for e, _, _ in CASES],
)
def test_each_failure_is_classified_once_for_retries_and_for_the_breaker(
    exception: BaseException, permanent: bool, provider_failure: bool
) -> None:
    assert is_permanent(exception) is permanent
    assert is_provider_failure(exception) is provider_failure


def test_smtp_replies_keep_their_code_and_text() -> None:
    rejected, deferred = MailRejected(550, "5.1.1 No such user"), MailDeferred(451, "try later")

    assert (rejected.code, str(rejected)) == (550, "SMTP 550: 5.1.1 No such user")
    assert (deferred.code, str(deferred)) == (451, "SMTP 451: try later")


def test_permanent_and_transient_errors_are_distinct_branches_of_one_base() -> None:
    for permanent in (MailRejected, InvalidRecipient, InvalidPayload, UnknownTemplateVersion):
        assert issubclass(permanent, PermanentError) and not issubclass(permanent, TransientError)
    for transient in (MailDeferred, ProviderUnavailable):
        assert issubclass(transient, TransientError) and not issubclass(transient, PermanentError)
    # Not a failure: the pipeline turns it into a deferral, which spends no retry.
    assert not issubclass(ClaimHeld, (PermanentError, TransientError))
    for cls in (PermanentError, TransientError, ClaimHeld):
        assert issubclass(cls, ReportsError)


def test_an_error_without_a_message_says_its_docstring() -> None:
    assert str(InvalidRecipient()) == "The user's email address cannot be an address."
    assert str(ProviderUnavailable()) == "The mail provider could not be reached (refused, reset or timed out)."
    assert "3.0s" in str(ClaimHeld(retry_after_seconds=3.0))
    assert ClaimHeld(retry_after_seconds=3.0).retry_after_seconds == 3.0
