"""Every error this project raises, and which of them are worth retrying.

Whether a failure is permanent is decided here and nowhere else, so the retry middleware,
the dead-letter handling and the tests agree.
"""

from __future__ import annotations


class ReportsError(Exception):
    """Something went wrong in the reports system."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigurationError(ReportsError):
    """The configuration is invalid."""


class DatabaseMissing(ReportsError):
    """There is no database at DATABASE_URL: create it with `reports db upgrade`."""


class BadInput(ReportsError):
    """Input from an operator was rejected; nothing was changed."""


class SendNowNotEnqueued(ReportsError):
    """A send-now request is recorded, but the broker did not take its message: reconcile sends it."""


class PeriodCancelled(ReportsError):
    """The period is cancelled: it completes only once `reports trigger` resumes it."""


class PermanentError(ReportsError):
    """Retrying cannot help: the message goes to the dead letters at once."""


class TransientError(ReportsError):
    """The failure may pass: the message is retried with backoff."""


class InvalidPayload(PermanentError):
    """The message's payload is not a valid report job."""


class UnknownTemplateVersion(PermanentError):
    """The message pins a template version that does not exist."""


class InvalidRecipient(PermanentError):
    """The user's email address cannot be an address."""


class UnsafeHeader(PermanentError):
    """A header of the report email would add a line we did not set; the message is not sent."""


class MailRejected(PermanentError):
    """The mail provider refused the message for good (an SMTP 5xx reply)."""

    def __init__(self, code: int, reply: str, *, recipient: bool = False, about_address: bool | None = None) -> None:
        self.code = code
        #: The refusal was the reply to RCPT TO and about the address itself (a hard bounce), which
        #: suppresses the user.
        self.recipient = recipient
        #: The refusal is about the address, at whatever stage; one that is not (content, size,
        #: policy) would refuse every user alike, and counts towards the brake.
        self.about_address = recipient if about_address is None else about_address
        super().__init__(f"SMTP {code}: {reply}")


class MailDeferred(TransientError):
    """The mail provider asked us to try again later (an SMTP 4xx reply)."""

    def __init__(self, code: int, reply: str) -> None:
        self.code = code
        super().__init__(f"SMTP {code}: {reply}")


class ProviderUnavailable(TransientError):
    """The mail provider could not be reached (refused, reset or timed out)."""


class SendUnconfirmed(ProviderUnavailable):
    """The message went out and no reply to it came (the connection dropped, or the deadline
    passed): the provider may have accepted it, so no copy may send it again before its claim's
    lease ends."""


class RateLimited(ReportsError):
    """The mail provider asked the fleet to send more slowly (a 4xx about the sending rate); the
    pipeline cuts the fleet's rate and defers the message, spending no retry."""

    def __init__(self, code: int, reply: str) -> None:
        self.code = code
        self.reply = reply
        self.retry_after_seconds = RATE_LIMITED_RETRY_SECONDS
        super().__init__(f"SMTP {code}: {reply}")


#: How soon a message the provider refused for the fleet's pace comes back, in seconds: by then the
#: fleet's rate is lower, and the rate, not this wait, spaces the sends.
RATE_LIMITED_RETRY_SECONDS = 2.0


class ClaimHeld(ReportsError):
    """Another copy of this message holds the delivery claim; the pipeline defers until its lease ends."""

    def __init__(self, retry_after_seconds: float) -> None:
        self.retry_after_seconds = retry_after_seconds
        super().__init__(f"Delivery claim held by another attempt for {retry_after_seconds:.1f}s more.")


#: SMTP reply meaning the whole service is unavailable, not just this message.
SERVICE_NOT_AVAILABLE = 421


def is_provider_failure(exception: BaseException) -> bool:
    """Whether ``exception`` says the mail provider itself is failing (what the circuit breaker counts).

    Per-message deferrals (450, 451, 452) and rejections (5xx) are answers from a working
    provider and do not count.
    """
    return isinstance(exception, ProviderUnavailable) or (
        isinstance(exception, MailDeferred) and exception.code == SERVICE_NOT_AVAILABLE
    )
