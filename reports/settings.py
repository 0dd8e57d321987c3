"""The one place configuration enters: a frozen settings object read from the environment."""

from __future__ import annotations

import ipaddress
import math
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import timedelta
from pathlib import Path

from reports.console_settings import check_console
from reports.endpoints import check_endpoints, default_helo_name, redact_url, redact_webhook_url
from reports.errors import ConfigurationError
from reports.feedback_settings import check_feedback
from reports.jobs import is_version_name
from reports.local_time import SendSchedule, check_zone, parse_clock_time
from reports.sender import parse_sender

#: Longest duration any setting accepts: ten years, in seconds.
MAX_SECONDS = 10 * 366 * 86_400

#: URL schemes of a Redis server (the broker, or the fleet's shared state).
REDIS_SCHEMES = ("redis", "rediss", "unix")
#: URL schemes of a RabbitMQ broker.
RABBITMQ_SCHEMES = ("amqp", "amqps")
#: URL scheme of an Amazon SQS broker.
SQS_SCHEMES = ("sqs",)
#: Broker URL schemes: Redis, RabbitMQ or Amazon SQS.
BROKER_SCHEMES = REDIS_SCHEMES + RABBITMQ_SCHEMES + SQS_SCHEMES

#: What a delivery claim's lease must last beyond the whole send's deadline (SMTP_TIMEOUT_SECONDS):
#: time to record the send, in seconds.
CLAIM_LEASE_MARGIN_SECONDS = 2.0

#: Longest look-back the scheduler accepts, in months.
MAX_LOOKBACK_MONTHS = 120

#: Largest keyset page the coordinator reads: a page is one statement and one transaction.
MAX_PLAN_PAGE_SIZE = 100_000

#: Shortest heartbeat timeout, in milliseconds: below it an ordinary stall of a live worker (a
#: loaded machine, a long GC pause) outlasts the timeout, and its messages run a second time.
MIN_HEARTBEAT_TIMEOUT_MS = 1_000

#: Largest retry budget: beyond it a failing message lives for years, not minutes.
MAX_RETRIES_ALLOWED = 1_000

#: ``MAINTENANCE_CHANCE`` is in millionths: one million is every broker call.
MAINTENANCE_SCALE = 1_000_000

#: Largest count any other numeric setting accepts (messages, failures).
MAX_COUNT = 1_000_000_000

#: Fastest send rate accepted, in emails per second: far beyond any provider's account limit.
MAX_SEND_RATE = 100_000

#: Longest retention accepted, in months: a century.
MAX_RETENTION_MONTHS = 1_200

#: Settings that are unset by default and a number when set: read as this type.
_OPTIONAL_NUMBERS: dict[str, type[int | float]] = {"send_rate_per_second": float, "retention_months": int}

#: Settings holding a URL that may carry a secret; :meth:`Settings.__repr__` shows them redacted.
SECRET_URLS = ("database_url", "broker_url", "redis_url", "smtp_url", "alert_webhook_url")

#: Settings that are a secret as a whole; :meth:`Settings.__repr__` shows only whether they are set.
SECRETS = (
    "unsubscribe_secret",
    "postmark_webhook_auth",
    "mailgun_webhook_signing_key",
    "console_users",
    "console_secret",
)


def _default_templates_dir() -> Path:
    """The project's ``templates/``: beside the code in a checkout (an editable install too), else
    in the folder the process starts in, the app's root where the build installed the code into
    site-packages (``pip install .``) and the Procfile's processes run."""
    beside_the_code = Path(__file__).resolve().parent.parent / "templates"
    return beside_the_code if beside_the_code.is_dir() else Path.cwd() / "templates"


#: The project's own ``templates/`` folder, used unless ``TEMPLATES_DIR`` says otherwise.
DEFAULT_TEMPLATES_DIR = _default_templates_dir()


@dataclass(frozen=True, kw_only=True, repr=False)
class Settings:
    """Everything the library, the workers and the CLI may be configured with.

    Build it with :meth:`from_env` at an entry point and pass it down; nothing else reads
    ``os.environ``.
    """

    #: Working folder for the embedded default: SQLite file, embedded Redis, Maildir outbox.
    var_dir: Path = Path("var")
    #: SQLAlchemy URL. Defaults to a SQLite file under ``var_dir``.
    database_url: str = ""
    #: The broker: Redis (``redis://``, ``rediss://``, ``unix://``), RabbitMQ (``amqp://``, ``amqps://``;
    #: a cluster's nodes separated by ``;``, each process connecting to the first that answers) or
    #: Amazon SQS (``sqs://REGION[/PREFIX][?endpoint_url=…]``).
    broker_url: str = "redis://localhost:6379/0"
    #: The Redis that holds what the fleet shares (breaker, send rate, alert gate, metrics).
    #: Defaults to ``broker_url`` when that is Redis; required when the broker is RabbitMQ or SQS.
    redis_url: str = ""
    #: Prefix of every Redis key the broker and the shared state write, so several deployments
    #: can share one Redis.
    broker_namespace: str = "dramatiq"
    #: The type of every queue declared on RabbitMQ (each work queue, its ``.DQ`` and its ``.XQ``):
    #: ``quorum`` (replicated across the cluster, kept through the loss of a minority of its nodes) or
    #: ``classic``. A queue's type is fixed when it is first declared: a process that finds one of
    #: the other type refuses to start.
    rabbitmq_queue_type: str = "classic"
    #: ``smtp://`` or ``smtps://`` URL; ``None`` writes mail to a Maildir under ``var_dir``.
    smtp_url: str | None = None
    #: The sender of every report: one address, ASCII before the ``@``; an internationalised domain
    #: is sent in its IDNA form (``xn--…``). Its domain is the one stable Message-IDs are minted under.
    mail_from: str = "Monthly Reports <reports@localhost>"
    #: The name the workers give in EHLO; empty: the machine's FQDN if it has a dot, else
    #: ``mail_from``'s domain.
    smtp_helo_name: str = ""
    #: Longest one whole send may take (connect, greeting, TLS, login, the transaction), in seconds.
    smtp_timeout_seconds: float = 10.0
    #: Where the versioned templates are: one folder per version (``v1/``, ``v2/``). Default: the
    #: project's ``templates/``, beside the code in a checkout, else in the folder the process runs in.
    templates_dir: Path = DEFAULT_TEMPLATES_DIR
    #: Template version pinned into every per-user message of a new period run. Periods pinned to
    #: an older version (``v1``) keep rendering with it. A version with no folder in
    #: ``TEMPLATES_DIR`` stops every process at start.
    template_version: str = "v2"
    #: The language of users with no locale, or one no shipped language writes (BCP 47: ``en``,
    #: ``tr-TR``), and the locale that writes their money, percentages and month names (Babel, CLDR).
    report_locale: str = "en"
    #: ISO 4217 currency of every ``amount_cents``, counted in its minor unit (cents; yen for JPY).
    report_currency: str = "USD"
    #: ``send`` mails a short, friendly report for a month without activity; ``skip`` mails none.
    report_empty_month: str = "send"
    #: The name in the report's header, footer and logo text (one line, at most 60 characters).
    report_product_name: str = "Monthly Reports"
    #: The header band and the links, ``#rgb`` or ``#rrggbb``; the header's text takes whichever
    #: of white and near-black contrasts more.
    report_brand_color: str = "#1d4ed8"
    #: The chart's bars, ``#rgb`` or ``#rrggbb``.
    report_accent_color: str = "#0ea5e9"
    #: An ``https://`` image shown in the header instead of the product name (32 px high).
    report_logo_url: str | None = None
    #: The sender's postal address in the footer (one line, at most 200 characters).
    report_postal_address: str = ""
    #: Users read per keyset page by the coordinator.
    plan_page_size: int = 1000
    #: Longest the coordinator walks in one message before it re-enqueues itself, in seconds.
    plan_slice_seconds: float = 10.0
    #: Messages waiting in the bulk queue above which the coordinator pauses its walk, so Redis
    #: holds a bounded backlog whatever the number of users.
    plan_high_water: int = 100_000
    #: How long the coordinator waits before it looks at the backlog again, in seconds.
    plan_pause_seconds: float = 5.0
    #: How long a delivery claim keeps other copies of the message from sending, in seconds.
    #: At least the whole send's deadline plus ``CLAIM_LEASE_MARGIN_SECONDS``, checked at start.
    claim_lease_seconds: float = 30.0
    #: A worker that has not called Redis for this long is dead and its messages go back, in ms.
    heartbeat_timeout_ms: int = 10_000
    #: Chance, in millionths, that a broker call runs the dead-worker sweep. Every call: the sweep
    #: is one ZRANGEBYSCORE on the heartbeats when nobody died, and a dead worker's messages then
    #: come back within a poll of its heartbeat going stale. 0: never, and only reconcile finds
    #: what a dead worker held.
    maintenance_chance: int = 1_000_000
    #: ``auto`` keeps each worker process of a ``dramatiq`` line on one CPU of its own, in turn over
    #: the CPUs the line may use; ``none`` leaves the kernel to move them. For a machine whose CPUs
    #: are the workers' own; Linux only.
    worker_cpu_affinity: str = "none"
    #: On SQS: how long a message a worker received stays hidden from the others, in seconds. A
    #: live worker extends what it holds every third of it; a worker killed with ``kill -9`` gives
    #: its messages back this long after it last did. At least ``CLAIM_LEASE_SECONDS``, checked at start.
    sqs_visibility_timeout_seconds: int = 60
    #: On SQS: receives after which SQS moves a message to its queue's dead-letter queue (the
    #: redrive policy of the queues the workers create), from where it is stored as a dead letter.
    sqs_max_receive_count: int = 10
    #: Retries of a transient failure. With the backoffs below, fully jittered, the expected wait
    #: before a message is given up is about 7 hours: greylisting, a provider's bad hour or a
    #: database failover must not dead-letter deliverable mail (mail servers keep trying for days).
    #: 0: a transient failure is dead-lettered at once.
    max_retries: int = 25
    #: Shortest backoff between retries, in milliseconds.
    min_backoff_ms: int = 1_000
    #: Longest backoff between retries, in milliseconds.
    max_backoff_ms: int = 3_600_000
    #: How often each worker process moves what the broker dead-lettered by itself (``.XQ``) into the
    #: dead-letter store, in seconds: a dead letter the store could not take comes in this soon after.
    dead_letter_sweep_seconds: float = 30.0
    #: A pending item untouched for this long, with no live claim, is re-enqueued by reconcile.
    reconcile_stuck_after_seconds: float = 600.0
    #: When the scheduler triggers last month's run: the 1st of each month at this time
    #: (``HH:MM``) in this IANA timezone. With ``send_at_local_time`` set, the month is triggered
    #: as it ends in UTC instead, so that no user's morning comes before it.
    schedule_time: str = "06:00"
    #: The IANA timezone of ``schedule_time`` (``Europe/Paris``); a period is never triggered
    #: before it has ended in UTC, whatever the timezone.
    schedule_timezone: str = "UTC"
    #: ``HH:MM``: each user's report is due at this time on their own clock on the 1st after the
    #: period (the 2nd far east of UTC, where the 1st's comes before the month has ended in UTC);
    #: empty: every report is sent as soon as the run starts. A run keeps the value it was
    #: triggered with.
    send_at_local_time: str = ""
    #: IANA time zone of the users whose own is unset or unknown (an unknown one is counted).
    default_time_zone: str = "UTC"
    #: How many past months the scheduler triggers on start if they were never triggered.
    schedule_lookback_months: int = 1
    #: How often the scheduler reconciles unfinished periods (and catches up), in seconds; 0 turns
    #: both off, leaving repair to ``reports reconcile`` run by the operator.
    schedule_reconcile_interval_seconds: float = 300.0
    #: The level of every process's log.
    log_level: str = "INFO"
    #: Where dead-letter alerts are posted (JSON); ``None`` sends none.
    alert_webhook_url: str | None = None
    #: At most one alert post per this many seconds, across every worker process.
    alert_window_seconds: float = 60.0
    #: Provider failures within ``breaker_window_seconds`` that open the mail circuit breaker.
    breaker_failure_threshold: int = 5
    #: The window ``breaker_failure_threshold`` counts failures in, in seconds.
    breaker_window_seconds: float = 30.0
    #: How long the breaker stays open before one probe may try the provider again, in seconds.
    breaker_cooldown_seconds: float = 30.0
    #: Address ``reports exporter`` listens on (its ``--host`` wins).
    exporter_host: str = "0.0.0.0"
    #: A scrape within this many seconds of the last collection is served the same figures, so
    #: scrapes cannot load the database and Redis; 0 collects at every scrape, in seconds.
    exporter_cache_seconds: float = 5.0
    #: The most emails per second the whole fleet hands to the provider (a provider's account
    #: limit, or a new domain's warm-up); ``None``: no limit.
    send_rate_per_second: float | None = None
    #: Sends the rate admits back to back after an idle spell: 1 spaces every send evenly.
    send_rate_burst: int = 1
    #: Items, deliveries and stored reports of periods older than this many months are pruned
    #: monthly by the scheduler; ``None``: kept for ever.
    retention_months: int | None = None
    #: Where ``reports web`` is reached from outside; every unsubscribe link starts with it.
    #: https, or plain http only to a loopback host (a developer's machine, the demo).
    public_base_url: str = "http://127.0.0.1:8000"
    #: Comma-separated secrets that sign unsubscribe links, newest first (the first signs, any
    #: verifies). Unset is allowed only while PUBLIC_BASE_URL is loopback: the demo's fixed secret.
    unsubscribe_secret: str = ""
    #: Longest ``reports web`` waits for a request's head (from the connection's start or its last
    #: answer), and then again for its body, in seconds: a client that sends slower is cut off.
    web_read_timeout_seconds: float = 10.0
    #: Connections ``reports web`` serves at once; a request beyond them is answered 503.
    web_max_connections: int = 200
    #: Comma-separated addresses or networks of the proxies in front of ``reports web`` whose
    #: X-Forwarded-For and X-Forwarded-Proto it believes, ``*`` for any, empty for none. ``*`` on a
    #: platform whose router is its only way in: otherwise every client seems to be the router,
    #: and the console's login limit per address locks everyone out at once.
    forwarded_allow_ips: str = "127.0.0.1,::1"
    #: Comma-separated Amazon SNS topic ARNs whose notifications ``/hooks/ses`` accepts; empty: 404.
    ses_topic_arns: str = ""
    #: The SendGrid Event Webhook's verification key (base64 DER, as SendGrid shows it); empty: 404.
    sendgrid_webhook_public_key: str = ""
    #: ``user:password`` that Postmark sends as HTTP basic credentials to ``/hooks/postmark``; empty: 404.
    postmark_webhook_auth: str = ""
    #: Mailgun's webhook signing key, the HMAC key of ``/hooks/mailgun``; empty: 404.
    mailgun_webhook_signing_key: str = ""
    #: Permanent failures not about the address (size, content, policy), of this many different
    #: users within ``brake_window_seconds``, pause the period as ``reports cancel`` does.
    brake_failure_threshold: int = 10
    #: The window ``brake_failure_threshold`` counts failures in, in seconds.
    brake_window_seconds: float = 300.0
    #: Soft-bounced emails of one user within ``soft_bounce_window_days`` that suppress the user
    #: (each email once, however often its provider reported it).
    soft_bounce_limit: int = 3
    #: The window, in days, that ``soft_bounce_limit`` counts a user's soft-bounced emails in: long
    #: enough for three monthly reports, the only emails most users get.
    soft_bounce_window_days: int = 90
    #: For tests only: a PEM file of the CAs that the SNS certificate and subscription fetches trust
    #: instead of the system's, which also lets them reach a loopback host. Refused at start unless
    #: PUBLIC_BASE_URL is loopback, so a production deployment cannot set it by accident.
    sns_test_ca_file: str | None = None
    #: The console's users at ``/console/``: comma-separated ``name:role:argon2-hash`` (role
    #: ``admin`` or ``viewer``; ``reports console hash-password`` makes the hash); empty: 404.
    console_users: str = ""
    #: Key that signs the console's session cookies, the same on every web process; empty: a
    #: random key the web processes keep in the shared Redis.
    console_secret: str = ""
    #: How long a console login lasts, in seconds; then the operator logs in again.
    console_session_seconds: float = 8 * 3600.0

    def __post_init__(self) -> None:
        if not self.database_url:
            object.__setattr__(self, "database_url", f"sqlite:///{self.var_dir / 'reports.db'}")
        _check_ranges(self)
        _check_names(self)
        if _scheme(self.broker_url) not in BROKER_SCHEMES:
            raise ConfigurationError(
                f"BROKER_URL must start with {', '.join(s + '://' for s in BROKER_SCHEMES)}"
                f", got {redact_url(self.broker_url)}."
            )
        if not self.redis_url and (self.broker_is_rabbitmq or self.broker_is_sqs):
            raise ConfigurationError(
                "REDIS_URL is required when BROKER_URL is RabbitMQ or SQS: the circuit breaker, the send rate, "
                "the alert gate and the metrics are shared through Redis (redis://host:6379/0)."
            )
        if _scheme(self.shared_redis_url) not in REDIS_SCHEMES:
            raise ConfigurationError(
                f"REDIS_URL must start with {', '.join(s + '://' for s in REDIS_SCHEMES)}"
                f", got {redact_url(self.redis_url)}."
            )
        check_endpoints(self)
        check_feedback(self)
        check_console(self)

    def __repr__(self) -> str:
        """Every setting, with the URLs redacted: a repr lands in logs and tracebacks."""
        shown = (f"{f.name}={_shown(f.name, getattr(self, f.name))!r}" for f in fields(self))
        return f"{type(self).__name__}({', '.join(shown)})"

    @property
    def broker_is_rabbitmq(self) -> bool:
        return _scheme(self.broker_url) in RABBITMQ_SCHEMES

    @property
    def broker_is_sqs(self) -> bool:
        return _scheme(self.broker_url) in SQS_SCHEMES

    @property
    def shared_redis_url(self) -> str:
        """The Redis of the fleet's shared state: REDIS_URL, or the broker's when that is unset
        (left unset rather than copied, so that settings with another broker follow it)."""
        return self.redis_url or self.broker_url

    @property
    def helo_name(self) -> str:
        """The name given in EHLO: SMTP_HELO_NAME, or its default (read from the host once asked)."""
        return self.smtp_helo_name or default_helo_name(socket.getfqdn(), self.mail_domain)

    @property
    def send_schedule(self) -> SendSchedule | None:
        """When a run triggered now makes its reports due; ``None``: as soon as it starts."""
        return SendSchedule.parse(self.send_at_local_time, self.default_time_zone)

    @property
    def soft_bounce_window(self) -> timedelta:
        return timedelta(days=self.soft_bounce_window_days)

    @property
    def outbox_dir(self) -> Path:
        return self.var_dir / "outbox"

    @property
    def mail_domain(self) -> str:
        """The sender's domain (ASCII, IDNA for an internationalised one), which stable
        Message-IDs are minted under."""
        return parse_sender(self.mail_from).domain

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for name, variable in ENVIRONMENT.items():
            raw = env.get(variable)
            if raw is None or raw == "":
                continue
            try:
                values[name] = (
                    _OPTIONAL_NUMBERS[name](raw) if name in _OPTIONAL_NUMBERS else _parse(_FIELDS[name].default, raw)
                )
            except ValueError:
                raise ConfigurationError(f"{variable} must be a number, got {raw!r}.") from None
        return cls(**values)  # type: ignore[arg-type]

    def as_environ(self) -> dict[str, str]:
        """The environment that makes :meth:`from_env` rebuild these settings in a child process."""
        return {
            variable: str(getattr(self, name))
            for name, variable in ENVIRONMENT.items()
            if getattr(self, name) is not None
        }


@dataclass(frozen=True)
class _Range:
    """The values a numeric setting accepts: from ``low`` to ``high``, and 0 too when ``zero``
    says what 0 means there (the comment on the setting says the same)."""

    low: float
    high: float
    unit: str
    zero: str | None = None

    def admits(self, value: float) -> bool:
        return math.isfinite(value) and (self.low <= value <= self.high or (self.zero is not None and value == 0))

    def describe(self) -> str:
        span = f"{self.unit} from {_number(self.low)} to {_number(self.high)}"
        return f"0 ({self.zero}) or {span}" if self.zero is not None else span


def _number(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,}"


_MS = MAX_SECONDS * 1000
#: Longest backoff: a retry waits in the broker's delay queue, which Dramatiq keeps under 7 days.
MAX_BACKOFF_MS = 6 * 86_400_000
#: Longest wait a setting may turn into a delayed message (a pause, a deferral), in seconds.
MAX_DELAY_SECONDS = MAX_BACKOFF_MS // 1000
#: Shortest duration a setting that the code turns into milliseconds accepts, in seconds: less
#: rounds down to 0 ms, which Redis refuses as an expiry and which means no time at all.
MIN_MS_SECONDS = 0.001
#: Longest one message runs before Dramatiq's time limit (the ``TimeLimit`` middleware) kills it,
#: in milliseconds: every actor runs under it.
ACTOR_TIME_LIMIT_MS = 600_000
#: Longest a setting may make one message work (a whole send, a coordinator's slice), in
#: seconds: half the time limit, the rest for what the message does before and after.
MAX_IN_MESSAGE_SECONDS = ACTOR_TIME_LIMIT_MS // 2000
#: Shortest period of a timer that calls Redis or the database each time it fires, in seconds.
MIN_TIMER_SECONDS = 1.0
#: SQS's longest visibility timeout, in seconds, and its largest ``maxReceiveCount``.
MAX_SQS_VISIBILITY_SECONDS = 12 * 3600
MAX_SQS_RECEIVE_COUNT = 1_000
#: Every numeric setting and its range, checked in one place so a bad value stops start-up; the
#: settings reference shows each. Read against each setting's use: what the code does with the
#: lowest and the highest value.
_RANGES = {
    "plan_page_size": _Range(1, MAX_PLAN_PAGE_SIZE, "a whole number"),
    "plan_high_water": _Range(1, MAX_COUNT, "a whole number"),
    "heartbeat_timeout_ms": _Range(MIN_HEARTBEAT_TIMEOUT_MS, _MS, "a number of milliseconds"),
    "maintenance_chance": _Range(0, MAINTENANCE_SCALE, "a number of millionths"),
    "max_retries": _Range(0, MAX_RETRIES_ALLOWED, "a whole number"),
    # SQS's own limits: a visibility timeout of at most 12 hours, a receive count of 1 to 1,000.
    "sqs_visibility_timeout_seconds": _Range(1, MAX_SQS_VISIBILITY_SECONDS, "a number of seconds"),
    "sqs_max_receive_count": _Range(1, MAX_SQS_RECEIVE_COUNT, "a whole number"),
    "min_backoff_ms": _Range(1, MAX_BACKOFF_MS, "a number of milliseconds"),
    "max_backoff_ms": _Range(1, MAX_BACKOFF_MS, "a number of milliseconds"),
    "breaker_failure_threshold": _Range(1, MAX_COUNT, "a whole number"),
    "schedule_lookback_months": _Range(1, MAX_LOOKBACK_MONTHS, "a number of months"),
    # The rate's interval between sends becomes a deferral's delay when a send must wait.
    "send_rate_per_second": _Range(MIN_MS_SECONDS, MAX_SEND_RATE, "a number of emails per second"),
    "send_rate_burst": _Range(1, MAX_COUNT, "a whole number"),
    "retention_months": _Range(1, MAX_RETENTION_MONTHS, "a number of months"),
    "web_max_connections": _Range(1, MAX_COUNT, "a whole number"),
    "soft_bounce_limit": _Range(1, MAX_COUNT, "a whole number"),
    "brake_failure_threshold": _Range(1, MAX_COUNT, "a whole number"),
    "soft_bounce_window_days": _Range(1, MAX_SECONDS // 86_400, "a number of days"),
    # Zero would mean no time at all: an SMTP timeout that fails every send, a lease that
    # protects nothing, a coordinator slice that walks no page, a web process that cuts off every
    # client, a failure window that forgets each failure as it counts it (a breaker that never
    # opens). The SMTP timeout (the probe's slot) and the breaker's window reach Redis in ms.
    # The send and the slice run inside one message, which the time limit would kill.
    "smtp_timeout_seconds": _Range(MIN_MS_SECONDS, MAX_IN_MESSAGE_SECONDS, "a number of seconds"),
    "plan_slice_seconds": _Range(MIN_MS_SECONDS, MAX_IN_MESSAGE_SECONDS, "a number of seconds"),
    # At least the shortest send's deadline plus the margin: the check below compares the two.
    "claim_lease_seconds": _Range(MIN_MS_SECONDS + CLAIM_LEASE_MARGIN_SECONDS, MAX_SECONDS, "a number of seconds"),
    "web_read_timeout_seconds": _Range(MIN_MS_SECONDS, MAX_SECONDS, "a number of seconds"),
    "breaker_window_seconds": _Range(MIN_MS_SECONDS, MAX_SECONDS, "a number of seconds"),
    "brake_window_seconds": _Range(MIN_MS_SECONDS, MAX_SECONDS, "a number of seconds"),
    # A breaker open for no time; its cool-down is also how long a report waits, as a delayed message.
    "breaker_cooldown_seconds": _Range(MIN_MS_SECONDS, MAX_DELAY_SECONDS, "a number of seconds"),
    # Timers: each firing reads Redis or the database, and the alert gate's expiry (SET PX) must
    # be above 0 ms. Below a second they would only load both.
    "dead_letter_sweep_seconds": _Range(MIN_TIMER_SECONDS, MAX_SECONDS, "a number of seconds"),
    "alert_window_seconds": _Range(MIN_TIMER_SECONDS, MAX_SECONDS, "a number of seconds"),
    "schedule_reconcile_interval_seconds": _Range(
        MIN_TIMER_SECONDS, MAX_SECONDS, "a number of seconds", zero="reconcile never"
    ),
    # The session cookie's max-age is whole seconds: below one it would expire as it is set.
    "console_session_seconds": _Range(1, MAX_SECONDS, "a number of seconds"),
    # Zero is meaningful here: re-enqueue at once, walk on without a pause, collect at every scrape.
    "reconcile_stuck_after_seconds": _Range(0, MAX_SECONDS, "a number of seconds"),
    # The pause is a delayed message.
    "plan_pause_seconds": _Range(0, MAX_DELAY_SECONDS, "a number of seconds"),
    "exporter_cache_seconds": _Range(0, MAX_SECONDS, "a number of seconds"),
}

#: What ``REPORT_EMPTY_MONTH`` accepts.
EMPTY_MONTH_CHOICES = ("send", "skip")

#: Level names ``LOG_LEVEL`` accepts, in any case.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

#: What ``RABBITMQ_QUEUE_TYPE`` accepts.
QUEUE_TYPES = ("classic", "quorum")

#: What ``WORKER_CPU_AFFINITY`` accepts.
CPU_AFFINITY_CHOICES = ("none", "auto")


def _check_ranges(settings: Settings) -> None:
    for name, allowed in _RANGES.items():
        value = getattr(settings, name)
        if value is None and name in _OPTIONAL_NUMBERS:
            continue
        if not allowed.admits(value):
            raise ConfigurationError(f"{ENVIRONMENT[name]} must be {allowed.describe()}, got {value}.")
    if settings.min_backoff_ms > settings.max_backoff_ms:
        raise ConfigurationError(
            f"MIN_BACKOFF_MS ({settings.min_backoff_ms}) must not exceed MAX_BACKOFF_MS ({settings.max_backoff_ms})."
        )
    if settings.claim_lease_seconds < settings.smtp_timeout_seconds + CLAIM_LEASE_MARGIN_SECONDS:
        raise ConfigurationError(
            f"CLAIM_LEASE_SECONDS ({settings.claim_lease_seconds:g}) must exceed SMTP_TIMEOUT_SECONDS "
            f"({settings.smtp_timeout_seconds:g}) by at least {CLAIM_LEASE_MARGIN_SECONDS:g}: a send that outlives "
            "its claim's lease can be sent a second time by another copy."
        )
    if settings.broker_is_sqs and settings.sqs_visibility_timeout_seconds < settings.claim_lease_seconds:
        raise ConfigurationError(
            f"SQS_VISIBILITY_TIMEOUT_SECONDS ({settings.sqs_visibility_timeout_seconds}) must be at least "
            f"CLAIM_LEASE_SECONDS ({settings.claim_lease_seconds:g}): a message a dead worker held would come back "
            "while its claim still stands, and only wait for it."
        )


def _check_choice(settings: Settings, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(settings, name)
    if value not in choices:
        raise ConfigurationError(f"{ENVIRONMENT[name]} must be one of {', '.join(choices)}, got {value!r}.")


def _check_names(settings: Settings) -> None:
    if not is_version_name(settings.template_version):
        raise ConfigurationError(
            "REPORT_TEMPLATE_VERSION must be a plain folder name (letters, digits, '.', '_', "
            f"'-'; no '/' and not '..'), got {settings.template_version!r}."
        )
    if not (settings.templates_dir / settings.template_version).is_dir():
        # A trigger pins the version on the month's run: every report of it would die, and a
        # replay would die again.
        raise ConfigurationError(
            f"REPORT_TEMPLATE_VERSION {settings.template_version!r} is not a folder in TEMPLATES_DIR "
            f"({settings.templates_dir})."
        )
    _check_choice(settings, "report_empty_month", EMPTY_MONTH_CHOICES)
    # Imported here: Babel's locale data loads only for the processes that build settings.
    from reports.look import ReportLook, check_locale

    check_locale(settings.report_locale, settings.report_currency)
    ReportLook.from_settings(settings)
    parse_sender(settings.mail_from)
    if settings.send_at_local_time:
        parse_clock_time(settings.send_at_local_time, "SEND_AT_LOCAL_TIME")
    check_zone(settings.default_time_zone, "DEFAULT_TIME_ZONE")
    # The scheduler's, checked here too: the release phase's command then stops a deploy that would
    # leave the scheduler failing at every start.
    parse_clock_time(settings.schedule_time, "SCHEDULE_TIME")
    check_zone(settings.schedule_timezone, "SCHEDULE_TIMEZONE")
    _check_choice(settings, "rabbitmq_queue_type", QUEUE_TYPES)
    _check_choice(settings, "worker_cpu_affinity", CPU_AFFINITY_CHOICES)
    if settings.log_level.upper() not in LOG_LEVELS:
        raise ConfigurationError(f"LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, got {settings.log_level!r}.")
    trusted_proxies(settings.forwarded_allow_ips)


def trusted_proxies(listed: str) -> list[str]:
    """FORWARDED_ALLOW_IPS's entries, checked: ``["*"]``, or addresses and networks (10.0.0.0/8)."""
    entries = [entry for entry in (part.strip() for part in listed.split(",")) if entry]
    if entries == ["*"]:
        return entries
    for entry in entries:
        try:
            ipaddress.ip_network(entry)
        except ValueError:
            raise ConfigurationError(
                f"FORWARDED_ALLOW_IPS must list IP addresses or networks (such as 10.0.0.0/8), or be '*' alone, "
                f"got {entry!r}."
            ) from None
    return entries


#: Each setting and the environment variable it is read from.
ENVIRONMENT = {
    "var_dir": "VAR_DIR",
    "database_url": "DATABASE_URL",
    "broker_url": "BROKER_URL",
    "redis_url": "REDIS_URL",
    "broker_namespace": "BROKER_NAMESPACE",
    "rabbitmq_queue_type": "RABBITMQ_QUEUE_TYPE",
    "smtp_url": "SMTP_URL",
    "mail_from": "MAIL_FROM",
    "smtp_helo_name": "SMTP_HELO_NAME",
    "smtp_timeout_seconds": "SMTP_TIMEOUT_SECONDS",
    "templates_dir": "TEMPLATES_DIR",
    "template_version": "REPORT_TEMPLATE_VERSION",
    "report_locale": "REPORT_LOCALE",
    "report_currency": "REPORT_CURRENCY",
    "report_empty_month": "REPORT_EMPTY_MONTH",
    "report_product_name": "REPORT_PRODUCT_NAME",
    "report_brand_color": "REPORT_BRAND_COLOR",
    "report_accent_color": "REPORT_ACCENT_COLOR",
    "report_logo_url": "REPORT_LOGO_URL",
    "report_postal_address": "REPORT_POSTAL_ADDRESS",
    "plan_page_size": "PLAN_PAGE_SIZE",
    "plan_slice_seconds": "PLAN_SLICE_SECONDS",
    "plan_high_water": "PLAN_HIGH_WATER",
    "plan_pause_seconds": "PLAN_PAUSE_SECONDS",
    "claim_lease_seconds": "CLAIM_LEASE_SECONDS",
    "heartbeat_timeout_ms": "HEARTBEAT_TIMEOUT_MS",
    "maintenance_chance": "MAINTENANCE_CHANCE",
    "worker_cpu_affinity": "WORKER_CPU_AFFINITY",
    "sqs_visibility_timeout_seconds": "SQS_VISIBILITY_TIMEOUT_SECONDS",
    "sqs_max_receive_count": "SQS_MAX_RECEIVE_COUNT",
    "max_retries": "MAX_RETRIES",
    "min_backoff_ms": "MIN_BACKOFF_MS",
    "max_backoff_ms": "MAX_BACKOFF_MS",
    "dead_letter_sweep_seconds": "DEAD_LETTER_SWEEP_SECONDS",
    "reconcile_stuck_after_seconds": "RECONCILE_STUCK_AFTER_SECONDS",
    "schedule_time": "SCHEDULE_TIME",
    "schedule_timezone": "SCHEDULE_TIMEZONE",
    "schedule_lookback_months": "SCHEDULE_LOOKBACK_MONTHS",
    "send_at_local_time": "SEND_AT_LOCAL_TIME",
    "default_time_zone": "DEFAULT_TIME_ZONE",
    "schedule_reconcile_interval_seconds": "SCHEDULE_RECONCILE_INTERVAL_SECONDS",
    "log_level": "LOG_LEVEL",
    "alert_webhook_url": "ALERT_WEBHOOK_URL",
    "alert_window_seconds": "ALERT_WINDOW_SECONDS",
    "breaker_failure_threshold": "BREAKER_FAILURE_THRESHOLD",
    "breaker_window_seconds": "BREAKER_WINDOW_SECONDS",
    "breaker_cooldown_seconds": "BREAKER_COOLDOWN_SECONDS",
    "exporter_host": "EXPORTER_HOST",
    "exporter_cache_seconds": "EXPORTER_CACHE_SECONDS",
    "send_rate_per_second": "SEND_RATE_PER_SECOND",
    "send_rate_burst": "SEND_RATE_BURST",
    "retention_months": "RETENTION_MONTHS",
    "public_base_url": "PUBLIC_BASE_URL",
    "unsubscribe_secret": "UNSUBSCRIBE_SECRET",
    "web_read_timeout_seconds": "WEB_READ_TIMEOUT_SECONDS",
    "web_max_connections": "WEB_MAX_CONNECTIONS",
    "forwarded_allow_ips": "FORWARDED_ALLOW_IPS",
    "ses_topic_arns": "SES_TOPIC_ARNS",
    "sendgrid_webhook_public_key": "SENDGRID_WEBHOOK_PUBLIC_KEY",
    "postmark_webhook_auth": "POSTMARK_WEBHOOK_AUTH",
    "mailgun_webhook_signing_key": "MAILGUN_WEBHOOK_SIGNING_KEY",
    "brake_failure_threshold": "BRAKE_FAILURE_THRESHOLD",
    "brake_window_seconds": "BRAKE_WINDOW_SECONDS",
    "soft_bounce_limit": "SOFT_BOUNCE_LIMIT",
    "soft_bounce_window_days": "SOFT_BOUNCE_WINDOW_DAYS",
    "sns_test_ca_file": "SNS_TEST_CA_FILE",
    "console_users": "CONSOLE_USERS",
    "console_secret": "CONSOLE_SECRET",
    "console_session_seconds": "CONSOLE_SESSION_SECONDS",
}


def _scheme(url: str) -> str:
    return url.partition("://")[0]


def _parse(default: object, raw: str) -> object:
    """Convert ``raw`` to the type of the setting's default."""
    if isinstance(default, Path):
        return Path(raw)
    if isinstance(default, int | float):
        return type(default)(raw)
    return raw


def _shown(name: str, value: object) -> object:
    if name in SECRETS:
        return "***" if value else ""
    if name == "alert_webhook_url" and isinstance(value, str):
        return redact_webhook_url(value)
    if name in SECRET_URLS and isinstance(value, str):
        return redact_url(value)
    return value


#: Each setting's field, whose default tells how to read its variable. Not a default ``Settings()``:
#: building one checks it, and the import would fail where a default does not hold.
_FIELDS = {f.name: f for f in fields(Settings)}
