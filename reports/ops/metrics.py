"""Prometheus metrics read at scrape time from Redis and the database, for ``reports exporter``.

Reading the durable state at each scrape (rather than counting inside worker processes) keeps
the figures right under the ``dramatiq`` CLI's many processes: nothing stale survives a restart,
nothing is counted twice, and no gauge drifts. Counters that only a moment can produce (a
message dying, the breaker changing state) are kept in Redis, fleet-wide, by the code where the
moment happens (:func:`count`), and read here.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC
from typing import Any, cast

import redis
import sqlalchemy.exc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reports import suppressions
from reports.clock import utcnow
from reports.counters import DURATION_BUCKETS, FALLBACKS_COUNTER, SEP, counter_key
from reports.delivery import send_rate
from reports.delivery.breaker import STATE_VALUES, State, mail_breaker_name
from reports.endpoints import SqsTarget
from reports.errors import ReportsError
from reports.fanout import progress
from reports.feedback import store as feedback_store
from reports.feedback.events import Kind
from reports.jobs import BUILD_REPORT, COORDINATOR, QUEUES, SEND_NOW
from reports.models import DeadLetter, DeadLetterReason, ItemState, PeriodRun, RunState
from reports.settings import Settings
from reports.worker import held, rabbitmq
from reports.worker.broker import BROKER_OUTAGES
from reports.worker.holding import ready_since_ms

#: Why a message of a known actor died; an undecodable message has no actor to count it under.
DEAD_REASONS = (DeadLetterReason.PERMANENT, DeadLetterReason.RETRIES_EXHAUSTED, DeadLetterReason.BROKER)

#: Periods whose item counts are exported: the most recent ones.
PERIODS_EXPORTED = 12

#: Seconds the exporter waits for Redis to connect or answer: under Prometheus's default scrape
#: timeout (10 s), so a Redis that stopped answering marks its figures unread instead of hanging
#: every scrape until Prometheus gives up on all of them.
REDIS_TIMEOUT_SECONDS = 3.0

#: Failures that are a source's outage, not a bug: logged without their traceback.
OUTAGES = (*BROKER_OUTAGES, redis.RedisError, sqlalchemy.exc.OperationalError, ReportsError, OSError)

logger = logging.getLogger(__name__)


#: How long after the last look a queue's "ready but unseen since" time is kept, in seconds: a
#: lower bound of its oldest message's age only while the exporter looks at least this often.
UNSEEN_FORGOTTEN_SECONDS = 300


def waiting_age(now: float, *, oldest_waiting_ms: int | None, unseen_since: float | None) -> float:
    """A RabbitMQ queue's oldest message age, in seconds: the oldest held message no worker has
    started, else how long the queue has had ready messages that no worker holds (a lower
    bound), else 0.

    :param now: Unix time, in seconds.
    :param oldest_waiting_ms: the oldest waiting held message's ``message_timestamp`` (ms).
    :param unseen_since: Unix time since when ready messages have waited unseen, if they do.
    """
    if oldest_waiting_ms is not None:
        return max(now - oldest_waiting_ms / 1000, 0.0)
    if unseen_since is not None:
        return max(now - unseen_since, 0.0)
    return 0.0


class CachedCollector(Collector):
    """Serves ``collector``'s figures collected at most once per ``max_age_seconds``.

    Every collection reads the database and scans Redis: without this, anyone who can reach the
    exporter loads both as fast as they can scrape. Scrapes that arrive while a collection runs
    wait for it and share its figures. Prometheus scrapes every 15 s or more, so 5 s costs it
    nothing; a collection that fails is not kept.

    :param clock: seconds from an arbitrary start (``time.monotonic``).
    """

    def __init__(
        self, collector: Collector, *, max_age_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.collector = collector
        self.max_age_seconds = max_age_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._metrics: list[Metric] = []
        self._collected_at: float | None = None

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            now = self.clock()
            if self._collected_at is None or now - self._collected_at >= self.max_age_seconds:
                self._metrics = list(self.collector.collect())
                self._collected_at = now
            return iter(self._metrics)


def fleet_collector(settings: Settings, sessions: sessionmaker[Session]) -> CachedCollector:
    """The figures of every queue, the breaker, the send rate and the periods, read from the broker,
    the shared Redis and the database, collected at most once per EXPORTER_CACHE_SECONDS: what the
    exporter serves and the console's fleet page shows."""
    shared = _redis(settings.shared_redis_url)
    collector = ReportsCollector(
        shared,
        namespace=settings.broker_namespace,
        sessions=sessions,
        queues=QUEUES,
        breaker_name=mail_breaker_name(settings.broker_namespace),
        broker_depths=_broker_depths(settings),
        queue_client=_queue_client(settings, shared),
    )
    return CachedCollector(collector, max_age_seconds=settings.exporter_cache_seconds)


def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_SECONDS, socket_connect_timeout=REDIS_TIMEOUT_SECONDS)


def _queue_client(settings: Settings, shared: redis.Redis) -> redis.Redis | None:
    """The Redis broker's own client: its queues are in BROKER_URL's Redis, which REDIS_URL may not be."""
    if settings.broker_is_rabbitmq or settings.broker_is_sqs:
        return None
    return shared if settings.broker_url == settings.shared_redis_url else _redis(settings.broker_url)


def _broker_depths(settings: Settings) -> Callable[[Sequence[str]], Mapping[str, tuple[int, int, int]]] | None:
    if settings.broker_is_rabbitmq:
        return functools.partial(rabbitmq.ready_counts_at, settings.broker_url, queue_type=settings.rabbitmq_queue_type)
    if settings.broker_is_sqs:
        from reports.worker import sqs  # boto3: only where BROKER_URL names SQS

        return functools.partial(sqs.depths_at, SqsTarget.from_url(settings.broker_url))
    return None


class ReportsCollector(Collector):
    def __init__(
        self,
        client: redis.Redis,
        *,
        namespace: str,
        sessions: sessionmaker[Session],
        queues: Iterable[str],
        breaker_name: str,
        broker_depths: Callable[[Sequence[str]], Mapping[str, tuple[int, int, int]]] | None = None,
        queue_client: redis.Redis | None = None,
    ) -> None:
        """:param client: the shared Redis (REDIS_URL), where the counters, the breaker and the
            workers' snapshots are.
        :param broker_depths: when the broker is RabbitMQ or SQS, reads each queue's ready,
            delayed and dead messages (:func:`reports.worker.rabbitmq.ready_counts_at`,
            :func:`reports.worker.sqs.depths_at`).
        :param queue_client: otherwise, the Redis broker the queues are read from; ``client`` when
            omitted."""
        self.client = client
        self.namespace = namespace
        self.sessions = sessions
        self.queues = tuple(queues)
        self.breaker_name = breaker_name
        self.broker_depths = broker_depths
        self.queue_client = queue_client or client

    def collect(self) -> Iterator[Metric]:
        """Each source's figures, or none of them when it cannot be read: an outage of one leaves
        the others' figures (and the alerts on them) standing, and ``reports_exporter_source_up``
        says which is missing."""
        up = GaugeMetricFamily(
            "reports_exporter_source_up",
            "1 if this collection read the source's figures, 0 if it could not (they are left out).",
            labels=["source"],
        )
        for source, figures in (
            ("broker", self._queues),
            ("redis", self._shared),
            ("database", self._database),
        ):
            try:
                metrics = list(figures())
            except Exception as error:
                # Only the error's kind: a driver's text can carry a URL and its password.
                kind = type(getattr(error, "orig", None) or error).__name__
                logger.warning(
                    "The exporter could not read the %s (%s): its figures are left out of this scrape.",
                    source,
                    kind,
                    exc_info=not isinstance(error, OUTAGES),
                )
                up.add_metric([source], 0.0)
            else:
                up.add_metric([source], 1.0)
                yield from metrics
        yield up

    def _shared(self) -> Iterator[Metric]:
        """What the fleet keeps in the shared Redis."""
        yield from self._counters()
        yield from self._actors()
        yield from self._breaker()
        yield from self._scheduler()

    def _queues(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily("reports_queue_messages", "Messages in a queue, by state.", labels=["queue", "state"])
        oldest = GaugeMetricFamily(
            "reports_queue_oldest_message_age_seconds",
            "Seconds since the oldest ready message in a queue became ready (enqueued, or due after a retry's or "
            "deferral's delay); 0 when empty; on RabbitMQ and SQS see the metrics reference.",
            labels=["queue"],
        )
        if self.broker_depths is not None:
            yield from self._held_queues(self.broker_depths(self.queues), depth, oldest)
            return
        now = time.time()
        for queue in self.queues:
            key = f"{self.namespace}:{queue}"
            with self.queue_client.pipeline(transaction=False) as pipe:
                pipe.llen(key)
                pipe.llen(f"{key}.DQ")
                pipe.zcard(f"{key}.XQ")
                pipe.lindex(key, 0)
                ready, delayed, broker_dead, head = pipe.execute()
            depth.add_metric([queue, "ready"], ready)
            # Delayed: in the delay queue, and taken from it by a worker that holds it until due.
            depth.add_metric([queue, "delayed"], delayed + self._unacked(f"{queue}{held.DELAY_SUFFIX}"))
            depth.add_metric([queue, "broker_dead"], broker_dead)
            depth.add_metric([queue, "in_progress"], self._unacked(queue))
            oldest.add_metric([queue], self._age(key, head, now))
        yield depth
        yield oldest

    def _held_queues(
        self,
        depths: Mapping[str, tuple[int, int, int]],
        depth: GaugeMetricFamily,
        oldest: GaugeMetricFamily,
    ) -> Iterator[Metric]:
        """RabbitMQ counts only what no consumer holds, and SQS counts a dead worker's messages in
        flight until they come back: what the live workers hold comes from their snapshots in
        Redis (:mod:`reports.worker.held`), read after the broker's counts so that a message
        taken in between is counted twice rather than missed."""
        try:
            figures: dict[str, held.QueueHeld] | None = held.read(self.client, self.namespace)
        except redis.RedisError:
            # The shared Redis is down (its own source says so): the broker's counts still stand.
            figures = None
        now = time.time()
        for queue, (ready, delayed, broker_dead) in depths.items():
            depth.add_metric([queue, "ready"], ready)
            # As on Redis, delayed messages a worker took from the delay queue and holds until due
            # are delayed (RabbitMQ counts them nowhere); unknown while the shared Redis is down.
            held_until_due = (
                0 if figures is None else figures.get(f"{queue}{held.DELAY_SUFFIX}", held.QueueHeld()).count
            )
            depth.add_metric([queue, "delayed"], delayed + held_until_due)
            depth.add_metric([queue, "broker_dead"], broker_dead)
            if figures is None:
                continue
            # As on Redis: in_progress and the oldest age leave out delayed messages held until due.
            mine = figures.get(queue, held.QueueHeld())
            depth.add_metric([queue, "in_progress"], mine.count)
            unseen_since = self._unseen_since(queue, unseen=ready > 0 and mine.oldest_waiting_ms is None, now=now)
            oldest.add_metric(
                [queue], waiting_age(now, oldest_waiting_ms=mine.oldest_waiting_ms, unseen_since=unseen_since)
            )
        yield depth
        yield oldest

    def _unseen_since(self, queue: str, *, unseen: bool, now: float) -> float | None:
        """Since when ``queue`` has had ready messages and no worker holding one of them waiting.

        RabbitMQ shows a ready message only to whoever takes it (and taking one to look, then
        requeueing it, counts as a redelivery on quorum queues), so its age is unknown: the
        time since an exporter first saw the queue so is a lower bound, kept in Redis for every
        exporter to share, and forgotten :data:`UNSEEN_FORGOTTEN_SECONDS` after the last look.
        """
        key = f"{self.namespace}:exporter:unseen_since:{queue}"
        if not unseen:
            self.client.delete(key)
            return None
        with self.client.pipeline(transaction=False) as pipe:
            pipe.set(key, repr(now), nx=True)
            pipe.expire(key, UNSEEN_FORGOTTEN_SECONDS)
            pipe.get(key)
            _set, _expire, since = pipe.execute()
        return float(since)

    def _unacked(self, queue: str) -> int:
        total = 0
        for acks in self.queue_client.scan_iter(match=f"{self.namespace}:__acks__.*.{queue}", count=1000):
            total += self.queue_client.scard(acks)
        return total

    def _age(self, key: str, head: bytes | None, now: float) -> float:
        if head is None:
            return 0.0
        raw = cast(bytes | None, self.queue_client.hget(f"{key}.msgs", head))
        if raw is None:
            return 0.0
        message = json.loads(raw)
        timestamp_ms = ready_since_ms(message["message_timestamp"], message.get("options") or {})
        return max(now - timestamp_ms / 1000, 0.0)

    def _counters(self) -> Iterator[Metric]:
        dead = CounterMetricFamily(
            "reports_dead_letters",
            "Messages that died, by queue, actor and reason.",
            labels=["queue", "actor", "reason"],
        )
        # Every known series from 0, so the first dead letter is an increase Prometheus can see.
        counts = {
            SEP.join((spec.queue, spec.name, reason)): 0.0
            for spec in (COORDINATOR, BUILD_REPORT, SEND_NOW)
            for reason in DEAD_REASONS
        }
        counts.update({SEP.join(labels): value for labels, value in self._hash("dead_letters")})
        for key, value in sorted(counts.items()):
            dead.add_metric(key.split(SEP), value)
        yield dead
        transitions = CounterMetricFamily(
            "reports_breaker_transitions",
            "Circuit breaker state changes, by the state entered.",
            labels=["breaker", "state"],
        )
        # Every state from 0, so the breaker's first entry into each is an increase Prometheus can see.
        entered = {SEP.join(("mail", state)): 0.0 for state in State}
        entered.update({SEP.join(labels): value for labels, value in self._hash("breaker_transitions")})
        for key, value in sorted(entered.items()):
            transitions.add_metric(key.split(SEP), value)
        yield transitions
        yield self._throttled()
        yield self._fallbacks()

    def _fallbacks(self) -> Metric:
        fallbacks = CounterMetricFamily(
            "reports_user_fallbacks",
            "Users given a default because their own was unknown: the locale (REPORT_LOCALE, also when "
            "not shipped), counted per report, the words of a language whose catalog the template version "
            "lacks (English), counted per report, or the time zone (DEFAULT_TIME_ZONE), counted as the walk "
            "records them.",
            labels=["fact"],
        )
        counts = {"catalog": 0.0, "locale": 0.0, "time_zone": 0.0}
        counts.update({labels[0]: value for labels, value in self._hash(FALLBACKS_COUNTER)})
        for fact, value in sorted(counts.items()):
            fallbacks.add_metric([fact], value)
        return fallbacks

    def _throttled(self) -> Metric:
        throttled = CounterMetricFamily(
            "reports_send_throttled",
            "Sends held back by the fleet's send rate: waited for a slot, or deferred.",
            labels=["outcome"],
        )
        counts = {str(outcome): 0.0 for outcome in send_rate.ThrottleOutcome}
        counts.update({labels[0]: value for labels, value in self._hash(send_rate.THROTTLED_COUNTER)})
        for outcome, value in sorted(counts.items()):
            throttled.add_metric([outcome], value)
        return throttled

    def _actors(self) -> Iterator[Metric]:
        outcomes = CounterMetricFamily(
            "reports_actor_outcomes", "Messages processed, by actor and outcome.", labels=["actor", "outcome"]
        )
        for labels, value in self._hash("actor_outcomes"):
            outcomes.add_metric(labels, value)
        yield outcomes
        per_bucket: dict[str, dict[str, float]] = {}
        for (actor, le), value in self._hash("actor_duration_buckets"):
            per_bucket.setdefault(actor, {})[le] = value
        sums = {labels[0]: value for labels, value in self._hash("actor_duration_sum")}
        durations = HistogramMetricFamily(
            "reports_actor_duration_seconds", "Time to process a message, by actor.", labels=["actor"]
        )
        for actor, counts in sorted(per_bucket.items()):
            cumulative, buckets = 0.0, []
            for le in [*map(repr, DURATION_BUCKETS), "+Inf"]:
                cumulative += counts.get(le, 0.0)
                buckets.append((le, cumulative))
            durations.add_metric([actor], buckets, sum_value=sums.get(actor, 0.0))
        yield durations

    def _hash(self, name: str) -> Iterator[tuple[list[str], float]]:
        raw = cast(dict[bytes, bytes], self.client.hgetall(counter_key(self.namespace, name)))
        for field, value in sorted(raw.items()):
            yield field.decode().split(SEP), float(value)

    def _breaker(self) -> Iterator[Metric]:
        raw = cast(bytes | None, self.client.hget(f"{self.breaker_name}:state", "state"))
        state = State(raw.decode()) if raw else State.CLOSED
        gauge = GaugeMetricFamily(
            "reports_breaker_state", "Circuit breaker state: 0 closed, 1 half-open, 2 open.", labels=["breaker"]
        )
        gauge.add_metric(["mail"], STATE_VALUES[state])
        yield gauge

    def _database(self) -> Iterator[Metric]:
        items = GaugeMetricFamily(
            "reports_period_items", "Report items of a period, by state.", labels=["period", "state"]
        )
        planned = GaugeMetricFamily(
            "reports_period_planned", "1 once the coordinator has walked every user.", labels=["period"]
        )
        total = GaugeMetricFamily("reports_period_total", "Report items recorded for a period.", labels=["period"])
        scheduled = GaugeMetricFamily(
            "reports_period_scheduled",
            "Pending report items of a period not yet due: waiting for their users' mornings.",
            labels=["period"],
        )
        cancelled = GaugeMetricFamily(
            "reports_period_cancelled", "1 while an operator has the period cancelled.", labels=["period"]
        )
        triggered = GaugeMetricFamily(
            "reports_period_triggered_timestamp_seconds",
            "When a period was first triggered (Unix time).",
            labels=["period"],
        )
        stored = GaugeMetricFamily(
            "reports_dead_letters_stored", "Dead letters in the store, by replayed.", labels=["replayed"]
        )
        with self.sessions.begin() as session:
            runs = session.execute(
                select(PeriodRun.period, PeriodRun.planned, PeriodRun.triggered_at, PeriodRun.state)
                .order_by(PeriodRun.period.desc())
                .limit(PERIODS_EXPORTED)
            ).all()
            counts = progress.items_by_state(session, [period for period, _, _, _ in runs])
            waiting = progress.scheduled_by_period(session, utcnow())
            # Two counts, not one grouped by replayed: the letters not yet replayed come from their
            # own index, and the total from the smallest index, never from the table's tracebacks.
            every_letter = session.scalar(select(func.count()).select_from(DeadLetter)) or 0
            unreplayed = session.scalar(select(func.count()).where(DeadLetter.replayed_at.is_(None))) or 0
            letters = {False: unreplayed, True: every_letter - unreplayed}
            suppressed = suppressions.count_by_reason(session)
            feedback = list(self._feedback(session, [period for period, _, _, _ in runs], counts))
        for period, is_planned, triggered_at, state in runs:
            by_state = counts.get(period, {})
            for item_state in ItemState:
                items.add_metric([period, item_state], by_state.get(item_state, 0))
            total.add_metric([period], sum(by_state.values()))
            scheduled.add_metric([period], waiting.get(period, 0))
            planned.add_metric([period], 1.0 if is_planned else 0.0)
            triggered.add_metric([period], triggered_at.replace(tzinfo=UTC).timestamp())
            cancelled.add_metric([period], 1.0 if state == RunState.CANCELLED else 0.0)
        for replayed in (False, True):
            stored.add_metric([str(replayed).lower()], letters.get(replayed, 0))
        yield items
        yield total
        yield scheduled
        yield planned
        yield triggered
        yield cancelled
        yield stored
        yield self._suppressions(suppressed)
        yield from feedback

    @staticmethod
    def _feedback(session: Session, periods: list[str], items: Mapping[str, Mapping[str, int]]) -> Iterator[Metric]:
        """The providers' events (counted from the stored events and the pruned ones' counts, so
        neither a restart nor a prune takes anything off), and each period's complaint and bounce
        rates: users who complained about, or hard-bounced, the period's email over the period's
        delivered emails."""
        events = CounterMetricFamily(
            "reports_feedback_events",
            "Provider webhook events stored, pruned ones included, by provider and kind.",
            labels=["provider", "kind"],
        )
        for (provider, kind), n in sorted(feedback_store.count_by_provider_kind(session).items()):
            events.add_metric([provider, kind], n)
        yield events
        unmatched = CounterMetricFamily(
            "reports_feedback_unmatched_events",
            "Provider webhook events that matched no user, pruned ones included.",
            labels=["provider"],
        )
        for provider, n in sorted(feedback_store.unmatched_by_provider(session).items()):
            unmatched.add_metric([provider], n)
        yield unmatched
        figures = feedback_store.users_by_period(session, periods)
        # Written out, not built from a loop: the docs' metric reference reads these calls.
        gauges = {
            "complaints": GaugeMetricFamily(
                "reports_period_complaints", "Users who complained about the period's email.", labels=["period"]
            ),
            "bounces": GaugeMetricFamily(
                "reports_period_bounces",
                "Users whose address hard-bounced the period's email after the provider took it.",
                labels=["period"],
            ),
            "complaint_rate": GaugeMetricFamily(
                "reports_period_complaint_rate",
                "Complaints over the period's delivered emails (absent before any delivery).",
                labels=["period"],
            ),
            "bounce_rate": GaugeMetricFamily(
                "reports_period_bounce_rate",
                "Hard bounces over the period's delivered emails (absent before any delivery).",
                labels=["period"],
            ),
        }
        for period, by_kind in figures.items():
            delivered = items.get(period, {}).get(ItemState.DELIVERED, 0)
            complaints, bounces = by_kind.get(Kind.COMPLAINT, 0), by_kind.get(Kind.HARD_BOUNCE, 0)
            gauges["complaints"].add_metric([period], complaints)
            gauges["bounces"].add_metric([period], bounces)
            if delivered:
                gauges["complaint_rate"].add_metric([period], complaints / delivered)
                gauges["bounce_rate"].add_metric([period], bounces / delivered)
        yield from gauges.values()

    @staticmethod
    def _suppressions(counts: dict[str, int]) -> Metric:
        gauge = GaugeMetricFamily(
            "reports_suppressions", "Users on the suppression list, by reason.", labels=["reason"]
        )
        for reason, n in counts.items():
            gauge.add_metric([reason], n)
        return gauge

    def _scheduler(self) -> Iterator[Metric]:
        raw = cast(bytes | None, self.client.get(f"{self.namespace}:scheduler:last_trigger"))
        gauge = GaugeMetricFamily(
            "reports_scheduler_last_trigger_timestamp_seconds",
            "When the scheduler last triggered a period (Unix time).",
        )
        if raw is not None:
            last: dict[str, Any] = json.loads(raw)
            gauge.add_metric([], float(last["at"]))
        yield gauge
