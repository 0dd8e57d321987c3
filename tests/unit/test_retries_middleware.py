"""JitteredRetries on Dramatiq's StubBroker with a real Worker: retries, permanent failures, dead letters.

The StubBroker keeps these tests narrow and fast; the messages still go through Dramatiq's real
encoding, worker threads, delay queues and acks.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import dramatiq
import dramatiq.broker
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import Middleware, Retries, default_middleware

from reports.dead_message import DeadMessage
from reports.errors import InvalidPayload, InvalidRecipient, MailDeferred, ProviderUnavailable
from reports.worker import failure_logs
from reports.worker.retries import JitteredRetries
from tests.support.waiting import wait_until

QUEUE = "mail"


class RecordDelays(Middleware):
    """Remembers every delayed enqueue (a retry): message id, its ``retries`` option, delay and eta."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.delayed: list[tuple[str, int, int, int]] = []

    def after_enqueue(self, broker: dramatiq.Broker, message: dramatiq.Message[Any], delay: int | None) -> None:
        if delay is not None:
            with self.lock:
                self.delayed.append(
                    (message.message_id, int(message.options.get("retries", 0)), delay, message.options["eta"])
                )


@dataclass
class Harness:
    broker: StubBroker
    retries: JitteredRetries
    recorder: RecordDelays
    dead: list[DeadMessage] = field(default_factory=list)
    workers: list[dramatiq.Worker] = field(default_factory=list)

    def start_worker(self, threads: int = 4) -> dramatiq.Worker:
        # A short worker timeout: delayed retries are checked every 20 ms, not every second.
        worker = dramatiq.Worker(self.broker, worker_timeout=20, worker_threads=threads)
        worker.start()
        self.workers.append(worker)
        return worker

    def run_until_idle(self, queue: str = QUEUE, timeout_ms: int = 15_000) -> None:
        self.broker.join(queue, timeout=timeout_ms, fail_fast=False)
        for worker in self.workers:
            worker.join()


@pytest.fixture
def harness(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Harness]]:
    """Builds a StubBroker of the test's own with JitteredRetries, set as Dramatiq's global broker."""
    built: list[Harness] = []
    # Whatever broker was global before comes back at teardown.
    monkeypatch.setattr(dramatiq.broker, "global_broker", None)

    def build(
        *,
        max_retries: int = 3,
        min_backoff_ms: int = 1,
        max_backoff_ms: int = 10,
        on_dead: Callable[[DeadMessage], None] | None = None,
        seed: int = 1,
    ) -> Harness:
        # Dramatiq's own Retries is left out, as in reports.worker.broker.build_broker.
        broker = StubBroker(middleware=[m() for m in default_middleware if m is not Retries])
        recorder = RecordDelays()
        harness = Harness(broker=broker, retries=None, recorder=recorder)  # type: ignore[arg-type]
        lock = threading.Lock()

        def collect(dead: DeadMessage) -> None:
            with lock:
                harness.dead.append(dead)

        harness.retries = JitteredRetries(
            max_retries=max_retries,
            min_backoff_ms=min_backoff_ms,
            max_backoff_ms=max_backoff_ms,
            on_dead=on_dead or collect,
            rng=random.Random(seed),
        )
        broker.add_middleware(harness.retries)
        broker.add_middleware(recorder)
        broker.emit_after("process_boot")
        dramatiq.set_broker(broker)
        built.append(harness)
        return harness

    yield build
    for harness in built:
        for worker in harness.workers:
            worker.stop()
        harness.broker.close()


class Calls:
    """Thread-safe record of an actor's calls: the arguments and when, in epoch milliseconds."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[Any, int]] = []

    def __call__(self, value: Any) -> None:
        with self.lock:
            self.calls.append((value, int(time.time() * 1000)))

    def __len__(self) -> int:
        with self.lock:
            return len(self.calls)

    @property
    def times(self) -> list[int]:
        with self.lock:
            return [at for _, at in self.calls]


# --- Permanent failures ----------------------------------------------------------------------


def test_a_permanent_error_is_attempted_once_and_dead_lettered_with_its_traceback(harness) -> None:
    h = harness(max_retries=5)
    calls = Calls()

    @dramatiq.actor(queue_name=QUEUE)
    def send_report(user_id: int, *, period: str) -> None:
        calls(user_id)
        raise InvalidRecipient(f"user {user_id}: 'not-an-address' has no @")

    h.start_worker()
    before_ms = int(time.time() * 1000)
    sent = send_report.send(7, period="2026-10")
    h.run_until_idle()
    after_ms = int(time.time() * 1000)

    assert len(calls) == 1
    assert h.recorder.delayed == []  # never retried
    assert len(h.dead) == 1
    dead = h.dead[0]
    assert dead.message_id == sent.message_id
    assert (dead.actor, dead.queue) == ("send_report", QUEUE)
    assert (dead.args, dead.kwargs) == ((7,), {"period": "2026-10"})
    assert (dead.reason, dead.attempts) == ("permanent", 1)
    assert dead.error_class == "InvalidRecipient"
    assert dead.error_message == "user 7: 'not-an-address' has no @"
    assert """raise InvalidRecipient(f"user {user_id}: 'not-an-address' has no @")""" in dead.traceback
    assert "in send_report" in dead.traceback
    assert dead.traceback.rstrip().endswith("InvalidRecipient: user 7: 'not-an-address' has no @")
    assert before_ms <= dead.first_failed_ms <= dead.died_ms <= after_ms
    # Stored through on_dead, so the message is acked: nothing is left in Dramatiq's dead letters.
    assert h.broker.dead_letters == []


def test_an_invalid_payload_raised_on_a_retry_dies_at_once_as_permanent(harness) -> None:
    h = harness(max_retries=5)
    calls = Calls()

    @dramatiq.actor(queue_name=QUEUE)
    def flaky_then_bad(user_id: int) -> None:
        calls(user_id)
        if len(calls) == 1:
            raise ProviderUnavailable()
        raise InvalidPayload("period is not a period")

    h.start_worker()
    flaky_then_bad.send(1)
    h.run_until_idle()

    assert len(calls) == 2
    assert [(dead.reason, dead.attempts, dead.error_class) for dead in h.dead] == [("permanent", 2, "InvalidPayload")]
    first_call_ms, second_call_ms = calls.times
    # The first failure is remembered across the retry, not reset by it.
    assert first_call_ms <= h.dead[0].first_failed_ms <= second_call_ms <= h.dead[0].died_ms


# --- Transient failures ----------------------------------------------------------------------


def test_a_transient_error_is_attempted_max_retries_plus_one_times_then_dies_as_exhausted(harness) -> None:
    h = harness(max_retries=3, min_backoff_ms=1, max_backoff_ms=10)
    calls = Calls()

    @dramatiq.actor(queue_name=QUEUE)
    def send_report(user_id: int) -> None:
        calls(user_id)
        raise MailDeferred(451, "4.3.0 Try again later")

    h.start_worker()
    sent = send_report.send(3)
    h.run_until_idle()

    assert len(calls) == 4
    assert len(h.dead) == 1
    dead = h.dead[0]
    assert dead.message_id == sent.message_id  # the same message across retries
    assert (dead.reason, dead.attempts) == ("retries_exhausted", 4)
    assert dead.queue == QUEUE  # not the delay queue it came back from
    assert (dead.error_class, dead.error_message) == ("MailDeferred", "SMTP 451: 4.3.0 Try again later")
    assert 'raise MailDeferred(451, "4.3.0 Try again later")' in dead.traceback
    assert calls.times[0] <= dead.first_failed_ms <= calls.times[1]
    assert dead.first_failed_ms <= dead.died_ms
    # Three retries, each numbered and each delayed by at most min(cap, base·2^retry).
    retried = [(message_id, retries, delay) for message_id, retries, delay, _ in h.recorder.delayed]
    assert [(message_id, retries) for message_id, retries, _ in retried] == [(sent.message_id, n) for n in (1, 2, 3)]
    assert [delay <= min(10, 1 * 2**n) for n, (_, _, delay) in enumerate(retried)] == [True, True, True]
    assert h.broker.dead_letters == []


def test_a_message_that_recovers_before_its_retries_run_out_never_becomes_a_dead_letter(harness) -> None:
    h = harness(max_retries=3)
    calls = Calls()

    @dramatiq.actor(queue_name=QUEUE)
    def send_report(user_id: int) -> None:
        calls(user_id)
        if len(calls) <= 3:
            raise ProviderUnavailable()

    h.start_worker()
    send_report.send(5)
    h.run_until_idle()

    assert len(calls) == 4
    assert h.dead == []
    assert h.broker.dead_letters == []


# --- Per-actor and per-message overrides -----------------------------------------------------


@pytest.mark.parametrize("actor_max_retries", [0, 1, 6])
def test_an_actor_overrides_max_retries(harness, actor_max_retries: int) -> None:
    h = harness(max_retries=3)
    calls = Calls()

    @dramatiq.actor(queue_name=QUEUE, max_retries=actor_max_retries)
    def send_report(user_id: int) -> None:
        calls(user_id)
        raise ProviderUnavailable()

    h.start_worker()
    send_report.send(1)
    h.run_until_idle()

    assert len(calls) == actor_max_retries + 1
    assert [(dead.reason, dead.attempts) for dead in h.dead] == [("retries_exhausted", actor_max_retries + 1)]


def test_a_message_option_overrides_the_actors_max_retries(harness) -> None:
    h = harness(max_retries=3)
    calls = Calls()

    @dramatiq.actor(queue_name=QUEUE, max_retries=5)
    def send_report(user_id: int) -> None:
        calls(user_id)
        raise ProviderUnavailable()

    h.start_worker()
    send_report.send_with_options(args=(1,), max_retries=1)
    h.run_until_idle()

    assert len(calls) == 2
    assert [dead.attempts for dead in h.dead] == [2]


def test_an_actor_overrides_the_backoff_window(harness) -> None:
    # The broker-wide window is 1-10 ms; this actor's is 200-300 ms.
    h = harness(max_retries=3, min_backoff_ms=1, max_backoff_ms=10)
    calls = Calls()

    @dramatiq.actor(queue_name=QUEUE, max_retries=2, min_backoff=200, max_backoff=300)
    def send_report(user_id: int) -> None:
        calls(user_id)
        raise ProviderUnavailable()

    h.start_worker()
    send_report.send(1)
    h.run_until_idle()

    delays = [delay for _, _, delay, _ in h.recorder.delayed]
    assert len(delays) == 2
    assert delays[0] <= 200 and delays[1] <= 300
    assert max(delays) > 10  # impossible with the broker-wide cap
    # The worker really waited: the last attempt came at least that long after the first.
    assert calls.times[-1] - calls.times[0] >= sum(delays) - 5


# --- A storm of synchronized failures --------------------------------------------------------


def test_five_hundred_messages_failing_at_once_are_retried_spread_over_the_whole_window(harness) -> None:
    """The issue's key property, through the real middleware: retry 3 of 500 messages, base 1 s, cap 60 s."""
    storm, base_ms, cap_ms, retry = 500, 1_000, 60_000, 3
    window_ms = min(cap_ms, base_ms * 2**retry)
    h = harness(max_retries=retry + 1, min_backoff_ms=base_ms, max_backoff_ms=cap_ms, seed=2026)

    @dramatiq.actor(queue_name=QUEUE)
    def send_report(user_id: int) -> None:
        raise MailDeferred(421, "4.3.2 Service not available")

    # Each message has already been retried three times: this failure is the fourth.
    for user_id in range(storm):
        send_report.send_with_options(args=(user_id,), retries=retry)
    h.start_worker(threads=8)

    def first_retries() -> list[tuple[str, int, int, int]]:
        with h.recorder.lock:
            return [entry for entry in h.recorder.delayed if entry[1] == retry + 1]

    wait_until(lambda: len(first_retries()) >= storm, timeout=20, interval=0.02, what="500 retries")
    retried = first_retries()

    assert len({message_id for message_id, *_ in retried}) == storm
    delays = [delay for _, _, delay, _ in retried]
    assert all(0 <= delay <= window_ms for delay in delays)
    counts = [0] * 10
    for delay in delays:
        counts[min(delay * 10 // window_ms, 9)] += 1
    assert all(storm * 0.05 <= n <= storm * 0.15 for n in counts), counts
    assert max(delays) - min(delays) > 0.9 * window_ms
    # The broker's delay queue holds them with etas spread the same way (less the enqueue skew).
    etas = [eta for *_, eta in retried]
    assert max(etas) - min(etas) > 0.85 * window_ms


# --- When the dead-letter store is down ------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "max_retries"),
    [(InvalidRecipient(), 3), (ProviderUnavailable(), 1)],
    ids=["permanent", "retries_exhausted"],
)
def test_a_dead_letter_that_cannot_be_stored_stays_in_dramatiqs_dead_letter_queue(
    harness, error: Exception, max_retries: int
) -> None:
    attempts_to_store: list[DeadMessage] = []

    def store_down(dead: DeadMessage) -> None:
        attempts_to_store.append(dead)
        raise ConnectionError("dead-letter database unreachable")

    h = harness(max_retries=max_retries, on_dead=store_down)
    calls = Calls()

    @dramatiq.actor(queue_name=QUEUE)
    def send_report(user_id: int) -> None:
        calls(user_id)
        raise error

    h.start_worker()
    sent = send_report.send(9)
    h.run_until_idle()

    assert [dead.message_id for dead in attempts_to_store] == [sent.message_id]
    kept = h.broker.dead_letters_by_queue[QUEUE]
    assert [message.message_id for message in kept] == [sent.message_id]
    assert kept[0].failed
    assert kept[0].args == (9,)
    assert len(calls) == (1 if max_retries == 3 else 2)


# --- What the log says -----------------------------------------------------------------------


def test_a_retry_is_one_warning_with_the_message_id_the_reason_and_the_next_attempts_time(
    harness, caplog: pytest.LogCaptureFixture
) -> None:
    failure_logs.install()
    h = harness(max_retries=1)
    calls = Calls()

    @dramatiq.actor(queue_name=QUEUE)
    def send_report(user_id: int) -> None:
        calls(user_id)
        if len(calls) == 1:
            raise MailDeferred(451, "4.3.0 Temporary lookup failure")

    with caplog.at_level(logging.INFO):
        message = send_report.send(7)
        h.start_worker()
        h.run_until_idle()

    assert len(calls) == 2
    assert "Traceback" not in caplog.text
    assert [r.levelno for r in caplog.records if r.levelno >= logging.ERROR] == []
    retries = [r.getMessage() for r in caplog.records if r.name == "reports.worker.retries"]
    assert len(retries) == 1
    assert re.fullmatch(
        rf"Retrying message {message.message_id} \(send_report\) at \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00, "
        r"retry 1 of 1: MailDeferred: SMTP 451: 4\.3\.0 Temporary lookup failure\.",
        retries[0],
    )
