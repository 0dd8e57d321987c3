"""The fleet-wide send rate on a real Redis: wait values, the burst, deferrals, and the rate held
by threads in two processes sharing one schedule.

Most tests pass the clock in (milliseconds) and walk it; the last ones run in real time.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from reports.counters import counter_key
from reports.delivery import aimd, send_rate
from reports.delivery.breaker import mail_breaker_name
from reports.delivery.send_rate import SendRate, Slot, pace
from reports.ops.metrics import ReportsCollector
from reports.outcome import Outcome
from tests.support.clocks import FakeClock

T0 = 1_800_000_000_000.0  # an arbitrary "now", in epoch milliseconds

NewLimiter = Callable[..., SendRate]


@pytest.fixture
def new_limiter(redis_url: str, broker_namespace: str) -> Iterator[NewLimiter]:
    """Builds limiters on the test's namespace; each call is another "process" with its own client."""
    clients: list[redis.Redis] = []

    def build(per_second: float | None = 10, burst: int = 1, clock: Callable[[], float] = time.monotonic) -> SendRate:
        client = redis.Redis.from_url(redis_url)
        clients.append(client)
        return SendRate(client, namespace=broker_namespace, per_second=per_second, burst=burst, clock=clock)

    yield build
    for client in clients:
        client.close()


def throttled(redis_url: str, namespace: str) -> dict[str, int]:
    raw = redis.Redis.from_url(redis_url).hgetall(counter_key(namespace, send_rate.THROTTLED_COUNTER))
    return {key.decode(): int(value) for key, value in raw.items()}


def test_sends_at_the_rate_go_at_once_and_a_faster_one_waits_for_its_slot(new_limiter: NewLimiter) -> None:
    limiter = new_limiter(per_second=10)
    assert limiter.acquire(T0) == Slot(wait_ms=0, reserved=True)
    assert limiter.acquire(T0 + 100) == Slot(wait_ms=0, reserved=True)
    # 30 ms after the last one: its slot is 70 ms away, and three callers at once are spaced.
    assert [limiter.acquire(T0 + 130).wait_ms for _ in range(3)] == pytest.approx([70, 170, 270])


def test_a_burst_goes_back_to_back_after_an_idle_spell_then_the_rate_holds(new_limiter: NewLimiter) -> None:
    limiter = new_limiter(per_second=10, burst=3)
    assert [limiter.acquire(T0).wait_ms for _ in range(5)] == pytest.approx([0, 0, 0, 100, 200])
    # Idle long enough to earn the whole burst back, and no more than the burst.
    assert [limiter.acquire(T0 + 10_000).wait_ms for _ in range(4)] == pytest.approx([0, 0, 0, 100])


def test_a_fractional_rate_spaces_sends_by_its_exact_interval(new_limiter: NewLimiter) -> None:
    limiter = new_limiter(per_second=0.4)  # a warming domain: one send every 2.5 s
    assert [limiter.acquire(T0).wait_ms for _ in range(3)] == pytest.approx([0, 2500, 5000])


def test_processes_share_one_schedule(new_limiter: NewLimiter) -> None:
    first, second = new_limiter(per_second=5), new_limiter(per_second=5)
    assert first.acquire(T0).wait_ms == 0
    assert second.acquire(T0).wait_ms == pytest.approx(200)
    assert first.acquire(T0).wait_ms == pytest.approx(400)


def test_a_wait_longer_than_the_caller_will_sleep_reserves_nothing(new_limiter: NewLimiter) -> None:
    limiter = new_limiter(per_second=10)
    limiter.acquire(T0)
    assert limiter.acquire(T0, max_wait_ms=150) == Slot(wait_ms=100, reserved=True)
    # 200 ms away is too far for this caller: it is told, and the slot stays free for the next one.
    assert limiter.acquire(T0, max_wait_ms=150) == Slot(wait_ms=200, reserved=False)
    assert limiter.acquire(T0, max_wait_ms=150) == Slot(wait_ms=200, reserved=False)
    assert limiter.acquire(T0) == Slot(wait_ms=200, reserved=True)


def test_pace_sleeps_for_a_near_slot_and_defers_a_far_one_without_a_retry(
    new_limiter: NewLimiter,
    redis_url: str,
    broker_namespace: str,
) -> None:
    limiter = new_limiter(per_second=2)
    slept: list[float] = []
    pace(limiter, T0, max_sleep_ms=600, sleep=slept.append)
    pace(limiter, T0, max_sleep_ms=600, sleep=slept.append)
    assert slept == [pytest.approx(0.5)]
    deferral = pace(limiter, T0, max_sleep_ms=600, sleep=slept.append)
    # A deferral, which the actors re-enqueue without spending a retry, for when the slot is near.
    assert isinstance(deferral, Outcome) and deferral.is_deferred
    assert deferral.delay_seconds == pytest.approx(1.0)
    assert slept == [pytest.approx(0.5)]
    assert throttled(redis_url, broker_namespace) == {"waited": 1, "deferred": 1}


def test_without_a_rate_pace_neither_waits_nor_calls_redis() -> None:
    assert send_rate.build(redis.Redis(port=1), namespace="x", per_second=None, burst=1) is None
    pace(None, T0, max_sleep_ms=0, sleep=lambda _s: pytest.fail("slept"))


def test_the_exporter_counts_throttled_sends_from_zero(
    new_limiter: NewLimiter, redis_url: str, broker_namespace: str, sessions
) -> None:
    collector = ReportsCollector(
        redis.Redis.from_url(redis_url),
        namespace=broker_namespace,
        sessions=sessions,
        queues=(),
        breaker_name=mail_breaker_name(broker_namespace),
    )

    def samples() -> dict[str, float]:
        family = next(f for f in collector.collect() if f.name == "reports_send_throttled")
        return {s.labels["outcome"]: s.value for s in family.samples if s.name.endswith("_total")}

    assert samples() == {"waited": 0, "deferred": 0}
    limiter = new_limiter(per_second=1)
    for _ in range(3):
        limiter.acquire(T0, max_wait_ms=1000)
    assert samples() == {"waited": 1, "deferred": 1}


# --- With no ceiling: a process trusts its reading of "no cut" for READING_MS ------------------


def observed_sends(redis_url: str, namespace: str) -> int:
    raw = redis.Redis.from_url(redis_url).hget(f"{namespace}:send_rate:observed", "sends")
    return int(raw or 0)


def test_with_no_ceiling_sends_on_a_fresh_reading_go_without_redis_and_are_counted_with_the_next_ask(
    new_limiter: NewLimiter, redis_url: str, broker_namespace: str
) -> None:
    clock = FakeClock()
    limiter = new_limiter(per_second=None, clock=clock)
    assert limiter.acquire(T0) == Slot(wait_ms=0, reserved=True)
    for i in range(1, 40):
        clock.advance_ms(5)
        assert limiter.acquire(T0 + 5 * i) == Slot(wait_ms=0, reserved=True, adapting=False)
    # 195 ms on: only the first send has asked Redis, so only it is counted there.
    assert observed_sends(redis_url, broker_namespace) == 1
    clock.advance_ms(send_rate.READING_MS)
    limiter.acquire(T0 + 450)
    # The reading went stale: this send asked, and brought the 39 sent without asking.
    assert observed_sends(redis_url, broker_namespace) == 41


def test_a_cut_in_another_process_is_followed_once_the_reading_goes_stale(new_limiter: NewLimiter) -> None:
    clock = FakeClock()
    fleet_a, fleet_b = new_limiter(per_second=None, clock=clock), new_limiter(per_second=None, clock=clock)
    assert not fleet_a.acquire(T0).adapting
    assert fleet_b.slow_down(T0 + 10) is not None
    # Within its reading's life, the other process still sends as it read: the bounded price.
    clock.advance_ms(send_rate.READING_MS - 1)
    assert fleet_a.acquire(T0 + 20) == Slot(wait_ms=0, reserved=True, adapting=False)
    clock.advance_ms(1)
    followed = fleet_a.acquire(T0 + 30)
    assert followed.adapting and followed.reserved
    # Now on the cut schedule: the next probe is spaced, not let go at once.
    assert fleet_a.acquire(T0 + 30, max_wait_ms=0).reserved is False


def test_the_process_that_cuts_follows_its_own_cut_at_once(new_limiter: NewLimiter) -> None:
    clock = FakeClock()
    limiter = new_limiter(per_second=None, clock=clock)
    assert not limiter.acquire(T0).adapting
    limiter.slow_down(T0 + 10)
    assert limiter.acquire(T0 + 20).adapting


def test_the_first_cut_counts_the_sends_this_process_made_without_asking(new_limiter: NewLimiter) -> None:
    clock = FakeClock()
    limiter = new_limiter(per_second=None, clock=clock)
    for i in range(40):
        limiter.acquire(T0 + 5 * i)  # 40 sends in 200 ms, one of which asked Redis
    cut = limiter.slow_down(T0 + 200)
    assert cut is not None
    # 200 a second were sent; the cut is taken from that, not from the one send Redis counted.
    assert cut.per_second == pytest.approx(aimd.DECREASE * 200)


def test_with_a_ceiling_every_send_asks_the_schedule(new_limiter: NewLimiter) -> None:
    clock = FakeClock()
    limiter = new_limiter(per_second=10, clock=clock)
    # No time passes on the process's clock, yet each send is spaced by the schedule in Redis.
    assert [limiter.acquire(T0).wait_ms for _ in range(3)] == pytest.approx([0, 100, 200])


# --- In real time: threads in two processes ---------------------------------------------------

RATE = 40.0
SECONDS = 4.0


def _send_in_threads(
    redis_url: str, namespace: str, go: Any, start: Any, threads: int, max_sleep_ms: float, sent: multiprocessing.Queue
) -> None:
    """One "worker process": ``threads`` threads pacing sends from ``start`` for ``SECONDS``."""
    client = redis.Redis.from_url(redis_url)
    limiter = SendRate(client, namespace=namespace, per_second=RATE, burst=5)
    times: list[float] = []
    lock = threading.Lock()
    sent.put("ready")
    go.wait()
    start_at = start.value

    def loop() -> None:
        while time.time() < start_at + SECONDS:
            deferral = pace(limiter, time.time() * 1000, max_sleep_ms=max_sleep_ms, sleep=time.sleep)
            if isinstance(deferral, Outcome):
                time.sleep(deferral.delay_seconds)  # what a deferred message does
                continue
            with lock:
                times.append(time.time())

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    sent.put(times)


def _run_two_processes(redis_url: str, namespace: str, *, threads: int, max_sleep_ms: float) -> list[float]:
    context = multiprocessing.get_context("spawn")
    sent: multiprocessing.Queue = context.Queue()
    go, start = context.Event(), context.Value("d", 0.0)
    processes = [
        context.Process(target=_send_in_threads, args=(redis_url, namespace, go, start, threads, max_sleep_ms, sent))
        for _ in range(2)
    ]
    for process in processes:
        process.start()
    try:
        assert [sent.get(timeout=60) for _ in processes] == ["ready", "ready"]
        start.value = start_at = time.time()
        go.set()
        times = [t for _ in processes for t in sent.get(timeout=SECONDS + 30)]
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    return [t - start_at for t in sorted(times) if t - start_at < SECONDS]


@pytest.mark.parametrize(("threads", "max_sleep_ms"), [(4, 1000), (16, 20)], ids=["waiting", "deferring"])
def test_threads_in_two_processes_send_at_the_rate_and_no_faster(
    redis_url: str, broker_namespace: str, threads: int, max_sleep_ms: float
) -> None:
    sent = _run_two_processes(redis_url, broker_namespace, threads=threads, max_sleep_ms=max_sleep_ms)
    expected = 5 + RATE * SECONDS  # the burst, then the rate
    assert abs(len(sent) - expected) <= 0.05 * expected, (len(sent), expected)
    # No second holds more than the rate plus the burst.
    per_second = [sum(1 for t in sent if s <= t < s + 1) for s in range(int(SECONDS))]
    assert max(per_second) <= RATE + 5, per_second


def test_a_patient_caller_naps_until_its_slot_may_be_booked_instead_of_being_deferred(
    new_limiter: NewLimiter,
) -> None:
    limiter = new_limiter(per_second=10)
    slept: list[float] = []
    pace(limiter, T0, max_sleep_ms=150, sleep=slept.append)
    pace(limiter, T0, max_sleep_ms=150, sleep=slept.append)
    assert slept == [pytest.approx(0.1)]
    # The third slot is 200 ms away, past the 150 ms that may be booked: without patience, deferred.
    assert isinstance(pace(limiter, T0, max_sleep_ms=150, sleep=slept.append), Outcome)
    # With it: a nap until the slot may be booked (50 ms), then the booked sleep (150 ms).
    slept.clear()
    permit = pace(limiter, T0, max_sleep_ms=150, patience_ms=1_000, sleep=slept.append)
    assert isinstance(permit, Slot) and permit.reserved
    assert slept == [pytest.approx(0.05), pytest.approx(0.15)]


def test_a_cut_after_a_refusal_about_the_pace_slows_the_whole_fleet_and_probes_until_a_success(
    new_limiter: NewLimiter,
) -> None:
    fleet_a, fleet_b = new_limiter(per_second=100), new_limiter(per_second=100)
    for i in range(50):
        fleet_a.acquire(T0 + i * 10)
    cut = fleet_a.slow_down(T0 + 500)
    assert cut is not None and cut.per_second < 100
    # The other process, on the same Redis, sees the cut: it is adapting and probes, one at a time.
    first = fleet_b.acquire(T0 + 600)
    assert first.adapting and first.wait_ms == 0
    assert fleet_b.acquire(T0 + 600, max_wait_ms=0).reserved is False
    # A second refusal before any success since the cut is the same overload: no further cut.
    assert fleet_b.slow_down(T0 + 700) is None
    fleet_b.sped(T0 + 600)
    adapted = fleet_a.adapted()
    assert adapted is not None and adapted.fresh and adapted.per_second > cut.per_second
