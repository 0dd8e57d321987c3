"""What a message came to: one value the pipeline returns and the actors act on."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar


class Kind(enum.StrEnum):
    """What a message came to: the ``outcome`` of ``reports_actor_outcomes_total``, a delivery
    counted as ``success``."""

    DELIVERED = "delivered"
    SKIPPED = "skipped"
    #: The period was cancelled: nothing sent, the item left pending.
    CANCELLED = "cancelled"
    #: Another copy of the message had already finished the item.
    ALREADY_DONE = "already_done"
    #: Put back for later without spending a retry (see :meth:`Outcome.deferred`).
    DEFERRED = "deferred"
    #: An actor that finished with nothing more to say (the coordinator's slice).
    SUCCESS = "success"
    #: Failed, and enqueued again after a backoff (the retry middleware's verdict).
    RETRY = "retry"
    #: Failed for good: a dead letter (the retry middleware's verdict).
    DEAD = "dead"


@dataclass(frozen=True)
class Outcome:
    """What one delivery came to; a deferral carries how long to wait and why."""

    kind: Kind
    #: For a deferral: seconds until the message should run again.
    delay_seconds: float = 0.0
    #: For a deferral: why (another copy holds the claim, the breaker is open…), for logs.
    reason: str = ""

    DELIVERED: ClassVar[Outcome]
    SKIPPED: ClassVar[Outcome]
    CANCELLED: ClassVar[Outcome]
    ALREADY_DONE: ClassVar[Outcome]

    @classmethod
    def deferred(cls, delay_seconds: float, reason: str) -> Outcome:
        """Run the message again after ``delay_seconds``, without spending a retry."""
        return cls(Kind.DEFERRED, delay_seconds, reason)

    @property
    def is_deferred(self) -> bool:
        return self.kind is Kind.DEFERRED

    def __str__(self) -> str:
        return self.kind.value


Outcome.DELIVERED = Outcome(Kind.DELIVERED)
Outcome.SKIPPED = Outcome(Kind.SKIPPED)
Outcome.CANCELLED = Outcome(Kind.CANCELLED)
Outcome.ALREADY_DONE = Outcome(Kind.ALREADY_DONE)
