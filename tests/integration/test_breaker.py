"""The mail provider's circuit breaker on a real Redis: every transition, shared between processes.

Times are passed in (milliseconds), so the tests walk the clock instead of sleeping; the one
real-time effect (the failure window's key expiry) is longer than any test here. The state cache's
age is read from a clock of its own (monotonic seconds), which the cache tests pass in and move.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from reports.delivery.breaker import STATE_CACHE_MS, CircuitBreaker, Permit, State, mail_breaker_name
from tests.support.broker import redis_commands
from tests.support.clocks import FakeClock

THRESHOLD = 5
WINDOW_MS = 10_000
COOLDOWN_MS = 30_000
PROBE_TIMEOUT_MS = 5_000
T0 = 1_800_000_000_000  # an arbitrary "now", in epoch milliseconds

NewBreaker = Callable[..., CircuitBreaker]


@pytest.fixture
def new_breaker(redis_url: str, broker_namespace: str) -> Iterator[NewBreaker]:
    """Builds breakers on the test's own name; each call is another "process" with its own client."""
    clients: list[redis.Redis] = []
    name = mail_breaker_name(broker_namespace)

    def build(*, url: str = redis_url, **overrides: Any) -> CircuitBreaker:
        client = redis.Redis.from_url(url)
        clients.append(client)
        options = {
            "failure_threshold": THRESHOLD,
            "window_ms": WINDOW_MS,
            "cooldown_ms": COOLDOWN_MS,
            "probe_timeout_ms": PROBE_TIMEOUT_MS,
            **overrides,
        }
        return CircuitBreaker(client, name=name, **options)

    yield build
    for client in clients:
        client.close()


def fail(breaker: CircuitBreaker, now_ms: int, times: int = 1) -> State:
    state = State.CLOSED
    for _ in range(times):
        state = breaker.record_failure(now_ms, token=uuid.uuid4().hex)
    return state


def open_breaker(breaker: CircuitBreaker, now_ms: int = T0) -> None:
    assert fail(breaker, now_ms, THRESHOLD) is State.OPEN


ALLOWED = Permit(allowed=True, wait_ms=0, probe=False)
PROBE = Permit(allowed=True, wait_ms=0, probe=True)


def denied(wait_ms: int) -> Permit:
    return Permit(allowed=False, wait_ms=wait_ms, probe=False)


# --- Closed ----------------------------------------------------------------------------------


def test_a_new_breaker_is_closed_and_lets_every_call_through(new_breaker: NewBreaker) -> None:
    breaker = new_breaker()

    assert breaker.state() is State.CLOSED
    assert [breaker.allow(T0 + i) for i in range(5)] == [ALLOWED] * 5


def test_one_failure_short_of_the_threshold_keeps_it_closed_and_the_next_opens_it(new_breaker: NewBreaker) -> None:
    breaker = new_breaker()

    states = [fail(breaker, T0 + i * 1_000) for i in range(THRESHOLD - 1)]
    assert states == [State.CLOSED] * (THRESHOLD - 1)
    assert breaker.state() is State.CLOSED
    assert breaker.allow(T0 + 4_500) == ALLOWED

    assert fail(breaker, T0 + 5_000) is State.OPEN
    assert breaker.state() is State.OPEN
    assert breaker.allow(T0 + 5_001).allowed is False


def test_failures_spread_wider_than_the_window_never_open_it(new_breaker: NewBreaker) -> None:
    breaker = new_breaker()
    # One failure every window/(threshold-1): at most threshold-1 of them are ever inside one window.
    step = WINDOW_MS // (THRESHOLD - 1)

    states = [fail(breaker, T0 + i * step) for i in range(4 * THRESHOLD)]

    assert set(states) == {State.CLOSED}
    assert breaker.state() is State.CLOSED
    assert breaker.allow(T0 + 4 * THRESHOLD * step) == ALLOWED


def test_a_success_while_closed_does_not_change_the_state(new_breaker: NewBreaker) -> None:
    breaker = new_breaker()
    fail(breaker, T0, THRESHOLD - 1)

    breaker.record_success()

    assert breaker.state() is State.CLOSED
    assert breaker.allow(T0 + 1) == ALLOWED


# --- Open ------------------------------------------------------------------------------------


def test_while_open_every_call_is_denied_with_the_remaining_cool_down(new_breaker: NewBreaker) -> None:
    breaker = new_breaker()
    open_breaker(breaker, T0)

    assert breaker.allow(T0) == denied(COOLDOWN_MS)
    assert breaker.allow(T0 + 1) == denied(COOLDOWN_MS - 1)
    assert breaker.allow(T0 + 12_345) == denied(COOLDOWN_MS - 12_345)
    assert breaker.allow(T0 + COOLDOWN_MS - 1) == denied(1)
    assert breaker.state() is State.OPEN


# --- Half-open -------------------------------------------------------------------------------


def test_after_the_cool_down_exactly_one_caller_gets_the_probe(new_breaker: NewBreaker) -> None:
    breaker = new_breaker()
    open_breaker(breaker, T0)
    after = T0 + COOLDOWN_MS

    assert breaker.allow(after) == PROBE
    assert breaker.state() is State.HALF_OPEN
    # Everyone else waits as if open, until the probe's lease would run out.
    assert breaker.allow(after) == denied(PROBE_TIMEOUT_MS)
    assert breaker.allow(after + 1_000) == denied(PROBE_TIMEOUT_MS - 1_000)
    assert breaker.allow(after + PROBE_TIMEOUT_MS - 1) == denied(1)
    assert breaker.state() is State.HALF_OPEN


def test_while_the_probe_is_out_the_others_wait_no_longer_than_a_cool_down(new_breaker: NewBreaker) -> None:
    breaker = new_breaker(cooldown_ms=2_000, probe_timeout_ms=30_000)
    open_breaker(breaker, T0)
    after = T0 + 2_000
    assert breaker.allow(after) == PROBE

    assert breaker.allow(after) == denied(2_000)
    assert breaker.allow(after + 29_000) == denied(1_000)
    breaker.record_success()
    assert breaker.allow(after + 2_000) == ALLOWED


def test_a_successful_probe_closes_the_breaker_for_everyone(new_breaker: NewBreaker) -> None:
    breaker = new_breaker()
    open_breaker(breaker, T0)
    after = T0 + COOLDOWN_MS
    assert breaker.allow(after) == PROBE

    breaker.record_success()

    assert breaker.state() is State.CLOSED
    assert [breaker.allow(after + i) for i in range(3)] == [ALLOWED] * 3
    # The failure count started over: it takes a full threshold again to open.
    assert fail(breaker, after + 10, THRESHOLD - 1) is State.CLOSED
    assert fail(breaker, after + 20) is State.OPEN


def test_a_failed_probe_reopens_the_breaker_with_a_fresh_cool_down(new_breaker: NewBreaker) -> None:
    breaker = new_breaker()
    open_breaker(breaker, T0)
    probe_at = T0 + COOLDOWN_MS
    assert breaker.allow(probe_at) == PROBE

    failed_at = probe_at + 700
    assert fail(breaker, failed_at) is State.OPEN

    assert breaker.state() is State.OPEN
    assert breaker.allow(failed_at) == denied(COOLDOWN_MS)
    assert breaker.allow(failed_at + COOLDOWN_MS - 1) == denied(1)
    assert breaker.allow(failed_at + COOLDOWN_MS) == PROBE


def test_a_probe_that_never_reports_frees_its_slot_after_the_probe_timeout(new_breaker: NewBreaker) -> None:
    breaker = new_breaker()
    open_breaker(breaker, T0)
    probe_at = T0 + COOLDOWN_MS
    assert breaker.allow(probe_at) == PROBE  # and then its worker dies

    assert breaker.allow(probe_at + PROBE_TIMEOUT_MS - 1) == denied(1)
    assert breaker.allow(probe_at + PROBE_TIMEOUT_MS) == PROBE
    assert breaker.allow(probe_at + PROBE_TIMEOUT_MS) == denied(PROBE_TIMEOUT_MS)
    assert breaker.state() is State.HALF_OPEN


def test_a_probe_given_back_makes_the_next_caller_the_probe_at_once(new_breaker: NewBreaker) -> None:
    breaker = new_breaker()
    open_breaker(breaker, T0)
    probe_at = T0 + COOLDOWN_MS
    probe = breaker.allow(probe_at)
    assert probe == PROBE
    assert breaker.allow(probe_at + 10) == denied(PROBE_TIMEOUT_MS - 10)

    breaker.give_back(probe, probe_at + 20)

    assert breaker.allow(probe_at + 20) == PROBE
    assert breaker.allow(probe_at + 20) == denied(PROBE_TIMEOUT_MS)
    assert breaker.state() is State.HALF_OPEN


def test_a_probe_given_back_after_its_slot_ran_out_leaves_the_breaker_as_it_is(new_breaker: NewBreaker) -> None:
    breaker = new_breaker()
    open_breaker(breaker, T0)
    probe_at = T0 + COOLDOWN_MS
    stale = breaker.allow(probe_at)
    next_at = probe_at + PROBE_TIMEOUT_MS
    fresh = breaker.allow(next_at)
    assert fresh == PROBE

    # The slot is the next probe's now: it keeps it.
    breaker.give_back(stale, next_at + 1)
    assert breaker.allow(next_at + 1) == denied(PROBE_TIMEOUT_MS - 1)

    # Nor does a probe given back reopen or close a breaker it no longer holds.
    assert fail(breaker, next_at + 2) is State.OPEN
    breaker.give_back(fresh, next_at + 3)
    assert breaker.allow(next_at + 3) == denied(COOLDOWN_MS - 1)
    assert breaker.state() is State.OPEN


def test_state_follows_every_transition(new_breaker: NewBreaker) -> None:
    breaker = new_breaker()
    seen = [breaker.state()]
    fail(breaker, T0, THRESHOLD - 1)
    seen.append(breaker.state())
    fail(breaker, T0 + 1)
    seen.append(breaker.state())
    breaker.allow(T0 + 1 + COOLDOWN_MS)
    seen.append(breaker.state())
    fail(breaker, T0 + 2 + COOLDOWN_MS)
    seen.append(breaker.state())
    breaker.allow(T0 + 2 + 2 * COOLDOWN_MS)
    seen.append(breaker.state())
    breaker.record_success()
    seen.append(breaker.state())

    assert seen == [State.CLOSED, State.CLOSED, State.OPEN, State.HALF_OPEN, State.OPEN, State.HALF_OPEN, State.CLOSED]


def test_every_transition_is_logged(new_breaker: NewBreaker, caplog: pytest.LogCaptureFixture) -> None:
    breaker = new_breaker()
    with caplog.at_level("WARNING", logger="reports.delivery.breaker"):
        open_breaker(breaker, T0)
        breaker.allow(T0 + COOLDOWN_MS)
        breaker.record_success()

    transitions = [(r.from_state, r.to_state) for r in caplog.records if hasattr(r, "to_state")]
    assert transitions == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


# --- Shared between processes ----------------------------------------------------------------


def test_two_processes_share_one_breaker(new_breaker: NewBreaker) -> None:
    # Without the state cache every change is seen at once (the cached variants are below).
    first, second = new_breaker(state_cache_ms=0), new_breaker(state_cache_ms=0)

    # Failures seen by either count together.
    fail(first, T0, 2)
    fail(second, T0 + 1, THRESHOLD - 3)
    assert (first.state(), second.state()) == (State.CLOSED, State.CLOSED)
    assert fail(second, T0 + 2) is State.OPEN
    assert first.state() is State.OPEN
    assert first.allow(T0 + 3) == denied(COOLDOWN_MS - 1)

    # One probe fleet-wide; its success, reported by the other process, closes it for both.
    assert first.allow(T0 + 2 + COOLDOWN_MS) == PROBE
    assert second.allow(T0 + 2 + COOLDOWN_MS) == denied(PROBE_TIMEOUT_MS)
    first.record_success()
    assert second.state() is State.CLOSED
    assert second.allow(T0 + 3 + COOLDOWN_MS) == ALLOWED


def test_breakers_with_different_names_do_not_share_state(
    new_breaker: NewBreaker, redis_url: str, broker_namespace: str
) -> None:
    mail = new_breaker()
    other = CircuitBreaker(
        redis.Redis.from_url(redis_url),
        name=f"{broker_namespace}:breaker:other",
        failure_threshold=THRESHOLD,
        window_ms=WINDOW_MS,
        cooldown_ms=COOLDOWN_MS,
        probe_timeout_ms=PROBE_TIMEOUT_MS,
    )
    open_breaker(mail, T0)

    assert other.state() is State.CLOSED
    assert other.allow(T0 + 1) == ALLOWED
    other.client.close()


def test_twenty_threads_right_after_the_cool_down_get_exactly_one_probe(new_breaker: NewBreaker) -> None:
    open_breaker(new_breaker(), T0)
    breakers = [new_breaker() for _ in range(20)]
    after = T0 + COOLDOWN_MS
    start = threading.Barrier(len(breakers))
    permits: list[Permit] = []
    lock = threading.Lock()

    def ask(breaker: CircuitBreaker) -> None:
        start.wait()
        permit = breaker.allow(after)
        with lock:
            permits.append(permit)

    threads = [threading.Thread(target=ask, args=(breaker,)) for breaker in breakers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert len(permits) == 20
    assert sum(permit.allowed for permit in permits) == 1
    assert [permit for permit in permits if permit.allowed] == [PROBE]
    assert all(permit == denied(PROBE_TIMEOUT_MS) for permit in permits if not permit.allowed)
    assert breakers[0].state() is State.HALF_OPEN


def test_twenty_threads_sharing_one_client_also_get_exactly_one_probe(new_breaker: NewBreaker) -> None:
    breaker = new_breaker()
    open_breaker(breaker, T0)
    after = T0 + COOLDOWN_MS
    start = threading.Barrier(20)
    permits: list[Permit] = []
    lock = threading.Lock()

    def ask() -> None:
        start.wait()
        permit = breaker.allow(after)
        with lock:
            permits.append(permit)

    threads = [threading.Thread(target=ask) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert len(permits) == 20
    assert [permit.probe for permit in permits].count(True) == 1
    assert sum(permit.allowed for permit in permits) == 1


# --- The state cache: a Redis call per cache period, not per send ------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def round_trips(counter: redis.Redis, before: Counter[str]) -> int:
    """The breaker's calls to Redis since ``before``: each is one EVALSHA (the commands its script
    runs are counted under their own names, and are all that may appear beside it)."""
    ran = redis_commands(counter) - before
    assert set(ran) <= {"evalsha", "hget", "hset"}, ran
    return ran["evalsha"]


def test_the_state_is_cached_for_state_cache_ms_by_default(new_breaker: NewBreaker) -> None:
    assert new_breaker().state_cache_ms == STATE_CACHE_MS
    assert 0 < STATE_CACHE_MS < 1_000


def test_many_calls_within_the_cache_period_make_one_redis_call(
    new_breaker: NewBreaker, private_redis: str, clock: FakeClock
) -> None:
    breaker = new_breaker(url=private_redis, clock=clock)
    new_breaker(url=private_redis, state_cache_ms=0).allow(T0)  # loads the script, as any worker's first call
    breaker.client.ping()  # and opens the connection
    counter = redis.Redis.from_url(private_redis)
    before = redis_commands(counter)

    permits = [breaker.allow(T0 + i) for i in range(1_000)]
    clock.advance_ms(STATE_CACHE_MS - 1)
    permits.append(breaker.allow(T0 + 1_000))

    assert permits == [ALLOWED] * 1_001
    assert round_trips(counter, before) == 1

    clock.advance_ms(1)  # the reading is now one cache period old: the next call asks again
    assert breaker.allow(T0 + 1_001) == ALLOWED
    assert round_trips(counter, before) == 2
    counter.close()


def test_threads_of_one_process_that_find_the_reading_stale_together_make_one_redis_call(
    new_breaker: NewBreaker, private_redis: str, clock: FakeClock
) -> None:
    breaker = new_breaker(url=private_redis, clock=clock)
    new_breaker(url=private_redis, state_cache_ms=0).allow(T0)  # loads the script
    breaker.client.ping()
    counter = redis.Redis.from_url(private_redis)
    before = redis_commands(counter)
    start = threading.Barrier(8)
    permits: list[Permit] = []

    def ask() -> None:
        start.wait()
        permits.extend(breaker.allow(T0 + i) for i in range(50))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert permits == [ALLOWED] * 400
    assert round_trips(counter, before) == 1
    counter.close()


def test_while_open_the_cache_refuses_with_the_remaining_cool_down_without_redis(
    new_breaker: NewBreaker, private_redis: str, clock: FakeClock
) -> None:
    breaker = new_breaker(url=private_redis, clock=clock)
    new_breaker(url=private_redis, state_cache_ms=0).allow(T0)  # loads the script
    open_breaker(breaker, T0)  # the failure that opens it also tells this process at once
    counter = redis.Redis.from_url(private_redis)
    before = redis_commands(counter)

    assert breaker.allow(T0) == denied(COOLDOWN_MS)
    assert breaker.allow(T0 + 12_345) == denied(COOLDOWN_MS - 12_345)
    assert breaker.allow(T0 + COOLDOWN_MS - 1) == denied(1)
    assert round_trips(counter, before) == 0

    # The cool-down's end is past: the cache does not answer, the script hands out the probe.
    assert breaker.allow(T0 + COOLDOWN_MS) == PROBE
    assert breaker.allow(T0 + COOLDOWN_MS) == denied(PROBE_TIMEOUT_MS)  # half-open is never cached
    assert round_trips(counter, before) == 2
    counter.close()


def test_another_processs_opening_is_seen_within_one_cache_period(new_breaker: NewBreaker, clock: FakeClock) -> None:
    cached, other = new_breaker(clock=clock), new_breaker(state_cache_ms=0)
    assert cached.allow(T0) == ALLOWED  # read "closed" at clock.now

    open_breaker(other, T0 + 1)

    # The promise's one exception: sends that start within a cache period of the read go ahead.
    clock.advance_ms(STATE_CACHE_MS - 1)
    assert cached.allow(T0 + 2) == ALLOWED
    clock.advance_ms(1)
    assert cached.allow(T0 + 3) == denied(COOLDOWN_MS - 2)


def test_a_late_failure_from_a_cached_permit_is_told_the_breaker_is_open(
    new_breaker: NewBreaker, clock: FakeClock
) -> None:
    cached, other = new_breaker(clock=clock), new_breaker(state_cache_ms=0)
    assert cached.allow(T0) == ALLOWED
    open_breaker(other, T0 + 1)
    assert cached.allow(T0 + 2) == ALLOWED  # within the cache period

    assert fail(cached, T0 + 3) is State.OPEN
    assert cached.allow(T0 + 4) == denied(COOLDOWN_MS - 3)  # from its cache, straight away


def test_a_successful_probe_elsewhere_is_seen_within_one_cache_period(
    new_breaker: NewBreaker, clock: FakeClock
) -> None:
    cached, prober = new_breaker(clock=clock), new_breaker(state_cache_ms=0)
    open_breaker(prober, T0)
    after = T0 + COOLDOWN_MS
    assert cached.allow(T0 + 1) == denied(COOLDOWN_MS - 1)
    assert prober.allow(after) == PROBE
    prober.record_success()

    assert cached.allow(after - 1) == denied(1)  # its cached cool-down, still fresh
    clock.advance_ms(STATE_CACHE_MS)
    assert cached.allow(after - 1) == ALLOWED


def test_an_answer_read_earlier_never_replaces_one_read_later(new_breaker: NewBreaker, clock: FakeClock) -> None:
    """Two threads of one process: the reply to the earlier call arrives last and is not kept."""
    breaker = new_breaker(clock=clock)
    earlier_call_sent_at = clock()
    clock.advance_ms(10)
    open_breaker(breaker, T0)

    # Reordered replies cannot be staged through Redis; this is the step the earlier reply takes.
    breaker._reading.remember((State.CLOSED, 0), earlier_call_sent_at)

    assert breaker.allow(T0 + 1) == denied(COOLDOWN_MS - 1)


def test_twenty_cached_processes_and_threads_past_the_cool_down_get_exactly_one_probe(
    new_breaker: NewBreaker,
) -> None:
    open_breaker(new_breaker(state_cache_ms=0), T0)
    # Every "process" has read "open" and caches it (real time: well within the cache period).
    breakers = [new_breaker() for _ in range(10)]
    assert [breaker.allow(T0 + 1) for breaker in breakers] == [denied(COOLDOWN_MS - 1)] * 10
    after = T0 + COOLDOWN_MS
    start = threading.Barrier(20)
    permits: list[Permit] = []
    lock = threading.Lock()

    def ask(breaker: CircuitBreaker) -> None:
        start.wait()
        for offset in range(5):
            permit = breaker.allow(after + offset)
            with lock:
                permits.append(permit)

    threads = [threading.Thread(target=ask, args=(breaker,)) for breaker in breakers * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert len(permits) == 100
    assert [permit for permit in permits if permit.allowed] == [PROBE]
    assert breakers[0].state() is State.HALF_OPEN
