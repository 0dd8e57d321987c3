"""The schema: the contract's ``users`` and ``activities``, and the tables this system owns."""

from __future__ import annotations

import enum
import uuid
from datetime import datetime
from typing import Annotated

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from reports.local_time import SendSchedule

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

PeriodKey = Annotated[str, mapped_column(String(7))]
Timestamp = Annotated[datetime, mapped_column(DateTime())]


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    email: Mapped[str] = mapped_column(Text)
    name: Mapped[str | None] = mapped_column(Text)
    active: Mapped[bool] = mapped_column(Boolean)
    #: IANA zone name, such as ``Asia/Tashkent``; optional.
    time_zone: Mapped[str | None] = mapped_column(Text)
    #: BCP 47 locale (``tr``, ``uz-Latn``); ``None`` or one no catalog writes is ``REPORT_LOCALE``.
    locale: Mapped[str | None] = mapped_column(Text)

    # The coordinator's keyset walk: `WHERE active AND id > :cursor ORDER BY id LIMIT :n` (no
    # `id >` on the first page).
    __table_args__ = (
        Index("ix_users_active_id", "id", postgresql_where=text("active"), sqlite_where=text("active")),
        # A provider's bounce or complaint names the address: found case-insensitively.
        Index("ix_users_email_lower", func.lower(email)),
    )


class Activity(Base):
    __tablename__ = "activities"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    occurred_at: Mapped[Timestamp]
    category: Mapped[str] = mapped_column(Text)
    amount_cents: Mapped[int] = mapped_column(Integer)

    # One user's two months of activity, read by range on the per-user path.
    __table_args__ = (Index("ix_activities_user_id_occurred_at", "user_id", "occurred_at"),)


class RunState(enum.StrEnum):
    ACTIVE = "active"
    #: Stopped by an operator: no new sends; ``trigger`` makes it active again.
    CANCELLED = "cancelled"


class PeriodRun(Base):
    """One monthly run: the coordinator's checkpoint and whether it has walked every user."""

    __tablename__ = "period_runs"

    period: Mapped[PeriodKey] = mapped_column(primary_key=True)
    state: Mapped[str] = mapped_column(String(16), default=RunState.ACTIVE)
    template_version: Mapped[str] = mapped_column(String(32))
    #: The last user id whose item is recorded and enqueued; the walk resumes after it. Unset until
    #: the first page is recorded: the walk then starts before any id, 0 and negative ones too.
    cursor: Mapped[int | None] = mapped_column(BigInteger)
    planned: Mapped[bool] = mapped_column(Boolean, default=False)
    triggered_at: Mapped[Timestamp]
    planned_at: Mapped[datetime | None] = mapped_column(DateTime())
    updated_at: Mapped[Timestamp]
    #: The coordinator chain allowed to walk: a chain carrying another token stops at its next slice.
    walker: Mapped[str | None] = mapped_column(String(36))
    #: When the walk last paused because the bulk queue held ``PLAN_HIGH_WATER`` messages.
    paused_at: Mapped[datetime | None] = mapped_column(DateTime())
    #: ``HH:MM``: each report is due then on its user's clock (``SEND_AT_LOCAL_TIME`` when the run
    #: was triggered); ``None``: every report is handed out as the walk records it.
    send_at: Mapped[str | None] = mapped_column(String(5))
    #: The zone of users with none or an unknown one (``DEFAULT_TIME_ZONE`` at the trigger).
    default_time_zone: Mapped[str | None] = mapped_column(Text)

    @property
    def schedule(self) -> SendSchedule | None:
        """When the run's reports are due; ``None``: as the walk records them."""
        return SendSchedule.parse(self.send_at, self.default_time_zone)

    def new_chain(self, now: datetime) -> str:
        """Name a new coordinator chain, the run touched ``now``: whichever chain was out there
        stops at its next slice. The token the new chain's first message carries."""
        self.walker, self.updated_at = str(uuid.uuid4()), now
        return self.walker


class ItemState(enum.StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    SKIPPED = "skipped"
    DEAD = "dead"


#: States an item never leaves: a message finding its item in one of these does nothing.
FINAL_STATES = frozenset({ItemState.DELIVERED, ItemState.SKIPPED, ItemState.DEAD})


#: An item still to be sent (or settled), as the partial index on ``report_items`` selects it.
PENDING = "state = 'pending'"

#: An item waiting to be released, as the partial indexes on ``report_items`` select it; every query
#: that reads them says the same (:func:`reports.items.waiting`).
WAITING = f"{PENDING} AND due_at IS NOT NULL"


class ReportItem(Base):
    """One user's report for one period: the unit of progress and of idempotency."""

    __tablename__ = "report_items"

    period: Mapped[PeriodKey] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    state: Mapped[str] = mapped_column(String(16), default=ItemState.PENDING)
    #: How many times a per-user message started work on this item.
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    #: When the coordinator handed the item's message to the broker; NULL means not yet.
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime())
    #: When the item's message is due to be handed out, in its user's morning; NULL once it has
    #: been, or when the run sends at once. :data:`LOOK_AGAIN` when the user's zone changed.
    due_at: Mapped[datetime | None] = mapped_column(DateTime())
    created_at: Mapped[Timestamp]
    updated_at: Mapped[Timestamp]
    finished_at: Mapped[datetime | None] = mapped_column(DateTime())
    last_error: Mapped[str | None] = mapped_column(Text)

    # Reconcile walks a period's pending items by user; only pending items are in that index, so
    # an item that finishes writes no entry there (it changes state, so it writes a new row
    # version, and an entry in the key). The user id also makes a lookup of one user's pending
    # item exact here, should the planner prefer this index to the key.
    # The release hands out a period's items in due order, and only items still waiting (pending,
    # with a due time) are in the next two: a released or finished item leaves them, so a day of
    # releases never re-reads what it handed out, and counting what is scheduled reads the index
    # alone. A changed time zone finds its user's waiting item by the second.
    __table_args__ = (
        Index(
            "ix_report_items_pending_user_id",
            "period",
            "user_id",
            postgresql_where=text(PENDING),
            sqlite_where=text(PENDING),
        ),
        Index(
            "ix_report_items_period_due_at",
            "period",
            "due_at",
            postgresql_where=text(WAITING),
            sqlite_where=text(WAITING),
        ),
        Index(
            "ix_report_items_waiting_user_id",
            "user_id",
            postgresql_where=text(WAITING),
            sqlite_where=text(WAITING),
        ),
    )


#: The due time a trigger on ``users`` gives an item still waiting when its user's time zone
#: changes: due at once for the release, which then computes the new due time from the new zone.
LOOK_AGAIN = datetime(1970, 1, 1)


#: The counter an item adds to in ``item_counts`` when it is recorded, whatever its state.
RECORDED = "recorded"


class ItemCount(Base):
    """A period's items counted as they change, by triggers on ``report_items`` (migration 0004).

    Progress at a million items is a sum over a few dozen rows here rather than a count over a
    million index entries. ``counter`` is ``recorded`` (every item) or a final state; pending is
    recorded minus finished. Each count is split over ``shard`` (``user_id % 16``) so that the
    workers finishing items at once rarely wait on the same row. The triggers run in the
    transaction that changes the item, so the counts are exactly as durable as the items.
    """

    __tablename__ = "item_counts"

    period: Mapped[PeriodKey] = mapped_column(primary_key=True)
    shard: Mapped[int] = mapped_column(SmallInteger, primary_key=True, autoincrement=False)
    counter: Mapped[str] = mapped_column(String(16), primary_key=True)
    n: Mapped[int] = mapped_column(BigInteger)


class DueCount(Base):
    """A period's items waiting to be released, counted by due time, by triggers on ``report_items``
    (migration 0013) as items are recorded, released, rescheduled, finished or pruned.

    What is still scheduled is then a sum over a few dozen due times, not a count over a million
    items. A row whose items have all gone keeps ``n`` at 0.
    """

    __tablename__ = "due_counts"

    period: Mapped[PeriodKey] = mapped_column(primary_key=True)
    due_at: Mapped[datetime] = mapped_column(DateTime(), primary_key=True)
    n: Mapped[int] = mapped_column(BigInteger)


class Report(Base):
    """The rendered report as it was sent (or is about to be)."""

    __tablename__ = "reports"

    period: Mapped[PeriodKey] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    template_version: Mapped[str] = mapped_column(String(32))
    subject: Mapped[str] = mapped_column(Text)
    body_text: Mapped[str] = mapped_column(Text)
    body_html: Mapped[str] = mapped_column(Text)
    rendered_at: Mapped[Timestamp]


class DeliveryState(enum.StrEnum):
    #: A send-now request recorded when it was made, not yet taken by its message.
    REQUESTED = "requested"
    CLAIMED = "claimed"
    SENT = "sent"
    #: A send-now request whose message died; a replay makes it ``requested`` again.
    DEAD = "dead"


class _ClaimColumns:
    """A send's claim: taken before an email goes to the provider, then marked sent.

    A claim carries a lease: a worker that dies after claiming does not block the email
    forever, because a later attempt takes the claim over once the lease has run out.
    """

    state: Mapped[str] = mapped_column(String(16))
    message_id: Mapped[str] = mapped_column(Text)
    #: Random per claim, so only the holder can complete it.
    claim_token: Mapped[str] = mapped_column(String(36))
    lease_expires_at: Mapped[Timestamp]
    #: How many times the claim was taken: the first take, then each take after it was released
    #: (a deferral, a refused or failed send, a replay) or after its lease ran out (a takeover).
    #: More than one is routine; only ``lease_expires_at`` passing while claimed tells a takeover.
    times_taken: Mapped[int] = mapped_column(Integer, default=1)
    claimed_at: Mapped[Timestamp]
    sent_at: Mapped[datetime | None] = mapped_column(DateTime())


class Delivery(_ClaimColumns, Base):
    """The claim on a period's one monthly email to a user."""

    __tablename__ = "deliveries"

    period: Mapped[PeriodKey] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)


class SendNowRequest(_ClaimColumns, Base):
    """The claim on one ``send-now`` request: at most one email per request, however often it runs."""

    # The table keeps its first name: renaming it would break the previous release's workers,
    # still running while a deploy's release phase migrates.
    __tablename__ = "resends"

    request_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    period: Mapped[PeriodKey]
    user_id: Mapped[int] = mapped_column(Integer)
    requested_at: Mapped[Timestamp]
    #: Pinned when the request is made, so a request re-sent by reconcile renders the same.
    template_version: Mapped[str | None] = mapped_column(String(32))
    #: Last time the request was made, taken or re-enqueued; reconcile re-sends one untouched too long.
    updated_at: Mapped[datetime | None] = mapped_column(DateTime())


class DeadLetterReason(enum.StrEnum):
    #: The error says retrying cannot help (a malformed payload, an address refused for good).
    PERMANENT = "permanent"
    RETRIES_EXHAUSTED = "retries_exhausted"
    #: Dead-lettered by Dramatiq itself (for example: no worker declares the actor).
    BROKER = "broker"
    #: The message's bytes did not decode: there is nothing to replay.
    UNDECODABLE = "undecodable"


#: A dead letter not yet replayed.
UNREPLAYED = "replayed_at IS NULL"


class DeadLetter(Base):
    """A message that failed for good: kept with its payload and error until an operator acts."""

    __tablename__ = "dead_letters"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: Dramatiq's message id, the same across retries: one dead letter per message.
    message_id: Mapped[str] = mapped_column(Text, unique=True)
    actor: Mapped[str] = mapped_column(Text)
    queue: Mapped[str] = mapped_column(Text)
    #: The message's ``{"args": …, "kwargs": …}`` as JSON, exactly as it was enqueued.
    payload: Mapped[str] = mapped_column(Text)
    #: From the payload when it parses, so dead letters can be listed and replayed by period.
    period: Mapped[str | None] = mapped_column(String(7))
    user_id: Mapped[int | None] = mapped_column(Integer)
    attempts: Mapped[int] = mapped_column(Integer)
    #: A :class:`DeadLetterReason`.
    reason: Mapped[str] = mapped_column(String(32))
    error_class: Mapped[str] = mapped_column(Text)
    error_message: Mapped[str] = mapped_column(Text)
    traceback: Mapped[str | None] = mapped_column(Text)
    first_failed_at: Mapped[Timestamp]
    died_at: Mapped[Timestamp]
    replayed_at: Mapped[datetime | None] = mapped_column(DateTime())
    replay_message_id: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        Index("ix_dead_letters_period", "period"),
        Index("ix_dead_letters_died_at", "died_at"),
        # The letters not yet replayed, which every list and count looks for, apart from the
        # replayed ones that pile up (migration 0019).
        Index("ix_dead_letters_unreplayed_id", "id", postgresql_where=text(UNREPLAYED), sqlite_where=text(UNREPLAYED)),
        Index(
            "ix_dead_letters_unreplayed_period_id",
            "period",
            "id",
            postgresql_where=text(UNREPLAYED),
            sqlite_where=text(UNREPLAYED),
        ),
    )


class SuppressionReason(enum.StrEnum):
    #: The user asked, by the one-click POST, the confirm page, or an operator on their behalf.
    UNSUBSCRIBED = "unsubscribed"
    #: The provider refused the address for good (a 5xx to RCPT TO).
    BOUNCED = "bounced"
    #: The user reported the mail as spam (a provider's feedback loop, entered by an operator).
    COMPLAINED = "complained"


class Suppression(Base):
    """A user who gets no monthly report, and why: read by the coordinator and the per-user job.

    Kept per user, not per address: an unsubscribe is the user's, and the per-user
    read finds it by primary key in the statement it runs anyway. A user whose address bounced
    stays suppressed after changing it, until an operator removes the entry.
    """

    __tablename__ = "suppressions"

    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    reason: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[Timestamp]
    #: Where it came from: ``web``, ``cli``, the provider's reply code (``smtp 550``), or the
    #: provider's classification of a webhook event (``ses Permanent/General 5.1.1``).
    source: Mapped[str | None] = mapped_column(Text)
    #: The provider and its event id, when a webhook event suppressed the user.
    provider: Mapped[str | None] = mapped_column(String(16))
    event_id: Mapped[str | None] = mapped_column(Text)


class FeedbackEvent(Base):
    """A bounce, complaint or unsubscribe a mail provider reported through its webhook, as received.

    Stored before the webhook is answered, once per provider event id, so a provider's retry
    changes nothing. The address is kept because an event that matches no user has nothing else
    to be found by; the summary is the provider's classification, never the remote server's text.
    """

    __tablename__ = "feedback_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: ``ses``, ``sendgrid``, ``postmark``, ``mailgun``.
    provider: Mapped[str] = mapped_column(String(16))
    event_id: Mapped[str] = mapped_column(Text)
    #: ``hard_bounce``, ``soft_bounce``, ``complaint``, ``unsubscribe``.
    kind: Mapped[str] = mapped_column(String(16))
    address: Mapped[str] = mapped_column(Text)
    summary: Mapped[str] = mapped_column(Text)
    occurred_at: Mapped[Timestamp]
    received_at: Mapped[Timestamp]

    __table_args__ = (
        UniqueConstraint("provider", "event_id"),
        Index("ix_feedback_events_received_at", "received_at"),
    )


class FeedbackMatch(Base):
    """A user a feedback event is about, and the period of the email it was about.

    An event matches the user its email's headers name, else every user with its address (two
    users who share a mailbox share its bounces and complaints). An event with no match is kept
    and counted as unmatched.
    """

    __tablename__ = "feedback_matches"

    event: Mapped[int] = mapped_column(
        ForeignKey("feedback_events.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    #: The period the email belonged to: from its headers, else the user's latest email sent before it.
    period: Mapped[str | None] = mapped_column(String(7))
    #: Set when an operator lifted the suppression it caused: it no longer counts or suppresses.
    dismissed_at: Mapped[datetime | None] = mapped_column(DateTime())

    __table_args__ = (
        Index("ix_feedback_matches_user_id", "user_id"),
        Index("ix_feedback_matches_period", "period"),
    )


class FeedbackPruned(Base):
    """Feedback events a prune deleted, counted by provider and kind.

    The exporter's event counters are the events stored plus these: without them a prune would
    make a counter go down, which Prometheus reads as a restart followed by every event at once.
    """

    __tablename__ = "feedback_pruned"

    provider: Mapped[str] = mapped_column(String(16), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    events: Mapped[int] = mapped_column(BigInteger)
    #: Of those, the events that had matched no user.
    unmatched: Mapped[int] = mapped_column(BigInteger)


class WebhookToken(Base):
    """What made one webhook request one of a kind (Mailgun's token, SendGrid's signature, an SNS
    notification's id): seen again, the request is a replay.

    Kept for as long as a signature with it could still be fresh, then pruned.
    """

    __tablename__ = "webhook_tokens"

    provider: Mapped[str] = mapped_column(String(16), primary_key=True)
    token: Mapped[str] = mapped_column(String(200), primary_key=True)
    seen_at: Mapped[Timestamp]

    __table_args__ = (Index("ix_webhook_tokens_seen_at", "seen_at"),)


class ConsoleAudit(Base):
    """One thing a console user did (a login, a trigger, a replay …), newest last: who, what, to
    what, and what came of it. Kept, never updated; the console shows it newest first."""

    __tablename__ = "console_audit"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[Timestamp]
    #: The console user's name, as CONSOLE_USERS has it.
    actor: Mapped[str] = mapped_column(String(64))
    #: ``login``, ``trigger``, ``cancel``, ``replay``, ``send-now``, ``suppress``, ``unsuppress``, and
    #: ``post`` for a POST refused before its action (a viewer's, or a stale form's).
    action: Mapped[str] = mapped_column(String(32))
    #: What it acted on: ``period 2026-10``, ``dead letters period=2026-10 reason=permanent``, ``user 42``.
    target: Mapped[str] = mapped_column(Text)
    #: What came of it, as the command would have printed it.
    outcome: Mapped[str] = mapped_column(Text)
