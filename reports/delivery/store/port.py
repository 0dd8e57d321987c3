"""The store port: the per-report statements every database adapter runs, and what they read.

"There is a report to mail" is :func:`mailable`, one SQL condition that every adapter runs.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sqlalchemy import column, text
from sqlalchemy.sql.selectable import TextualSelect

from reports.content.activity import Summary
from reports.content.render import RenderedReport
from reports.delivery import claims
from reports.models import FINAL_STATES, Report, RunState
from reports.periods import Period
from reports.sql import Executor, upsert

#: Opens one transaction of a monthly message and yields what its statements run on.
Transaction = Callable[[], AbstractContextManager[Executor]]


@dataclass(frozen=True)
class Inputs:
    """What one report is built from, read under the item's lock, and the claim taken with it."""

    #: ``None`` when the coordinator never recorded the item.
    item_state: str | None
    #: ``None`` when the period was never triggered.
    run_state: str | None
    planned: bool
    #: The last user id the walk recorded; ``None`` before its first page (ids go below 0).
    cursor: int | None
    #: ``None`` when the user does not exist.
    email: str | None
    name: str | None
    active: bool
    summary: Summary
    #: The user's own locale as stored (BCP 47), unchecked; ``None`` when they have none.
    locale: str | None = None
    #: Whether there is a report to mail (:func:`sendable`): the claim is taken only then.
    mailable: bool = False
    #: Why the user is on the suppression list; ``None`` when they are not.
    suppressed: str | None = None
    #: The monthly email's claim; ``None`` when the report is not mailable or already went out.
    claim: claims.Claim | None = None
    #: Seconds the read waited for the item's lock: the lease starts once it is granted.
    lock_wait_seconds: float = 0.0


@dataclass(frozen=True)
class StoredReport:
    """The report as it is mailed, kept in ``reports``."""

    template_version: str
    rendered: RenderedReport
    rendered_at: datetime


@dataclass(frozen=True)
class ReadAndClaim:
    """What one message asks of :meth:`Store.read_and_claim`."""

    period: Period
    user_id: int
    #: The monthly email's stable Message-ID, kept with the claim.
    message_id: str
    lease_seconds: float
    #: Stamps the item (the lease runs on the database server's clock).
    now: datetime
    #: ``REPORT_EMPTY_MONTH``: ``send`` or ``skip``.
    empty_month: str


class Store(Protocol):
    """The per-report statements on one database, chosen once when the process starts."""

    def transactions(self) -> AbstractContextManager[Transaction]:
        """The transactions of one monthly message (at most one open at a time)."""
        ...

    def read_and_claim(self, db: Executor, asked: ReadAndClaim) -> Inputs:
        """Lock the item (serializing copies of the message), read everything the report needs,
        and, when it is mailable, count the attempt and claim the monthly email.

        The claim is ``None`` when the email already went out; raises :class:`ClaimHeld` while
        another copy's lease runs. The lease runs on the database server's clock from when the
        lock was granted; ``now`` stamps the item.
        """
        ...

    def record_sent(self, db: Executor, claim: claims.Claim, report: StoredReport, *, now: datetime) -> bool:
        """Mark the item delivered and the claim sent, and store the report; ``False`` (and
        nothing stored) if the claim was taken over meanwhile."""
        ...


_FINAL = ", ".join(sorted(f"'{state.value}'" for state in FINAL_STATES))


def mailable(
    *, item_state: str, run_state: str, email: str, active: str, suppressed: str, active_in_period: str
) -> str:
    """Whether there is a report to mail, as one SQL condition over expressions of what it reads (and
    the parameter ``:send_empty``): the item is not final, the period not cancelled, the user has an
    address, is active and not suppressed, and had activity in the period or empty months are sent.
    A missing item or user reads as NULL, which is not mailable."""
    return f"""{item_state} NOT IN ({_FINAL}) AND ({run_state} IS NULL OR {run_state} <> '{RunState.CANCELLED.value}')
      AND {email} IS NOT NULL AND {active} AND NOT {suppressed}
      AND (:send_empty OR {active_in_period})"""


def sendable(time: Callable[[str], str] = str) -> str:
    """:func:`mailable` as the ``FROM … WHERE`` of a query over ``item`` (the item's ``state``,
    read first) and the parameters ``:period``, ``:user_id``, ``:send_empty``, ``:start`` and ``:end``.

    :param time: how a timestamp (a column or a parameter) is written to compare in order.
    """
    occurred_at, start, end = time("occurred_at"), time(":start"), time(":end")
    condition = mailable(
        item_state="item.state",
        run_state="r.state",
        email="u.email",
        active="u.active",
        suppressed="EXISTS (SELECT 1 FROM suppressions WHERE user_id = :user_id)",
        active_in_period=f"""EXISTS (
          SELECT 1 FROM activities WHERE user_id = :user_id AND {occurred_at} >= {start} AND {occurred_at} < {end}
      )""",
    )
    return f"""
    FROM item JOIN users u ON u.id = :user_id LEFT JOIN period_runs r ON r.period = :period
    WHERE {condition}"""


def sendable_parameters(asked: ReadAndClaim) -> dict[str, object]:
    """The parameters of :func:`sendable`."""
    return {
        "period": str(asked.period),
        "user_id": asked.user_id,
        "start": asked.period.start,
        "end": asked.period.end,
        "send_empty": asked.empty_month == "send",
    }


def with_columns(sql: str, *names: str) -> TextualSelect:
    """A statement whose result columns are fixed by position: SQLAlchemy then builds the result's
    metadata once per statement instead of once per execution from the cursor's description."""
    return text(sql).columns(*(column(name) for name in names))


def keep_report(db: Executor, period: Period, user_id: int, report: StoredReport) -> None:
    """Keep the report as it was (or was about to be) mailed."""
    db.execute(
        upsert(
            db,
            Report.__table__,
            {
                "period": str(period),
                "user_id": user_id,
                "template_version": report.template_version,
                "subject": report.rendered.subject,
                "body_text": report.rendered.text,
                "body_html": report.rendered.html,
                "rendered_at": report.rendered_at,
            },
            key=["period", "user_id"],
        )
    )
