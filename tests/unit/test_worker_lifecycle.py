"""A worker process's life: one drain per burst of SIGTERMs, and a heartbeat on a timer of its own."""

from __future__ import annotations

import logging
import multiprocessing
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest
import redis
from dramatiq.compat import StreamablePipe

from reports.settings import Settings
from reports.worker import lifecycle
from reports.worker.broker import build_broker
from reports.worker.lifecycle import (
    DrainOnce,
    Heartbeat,
    coalesce_term_signals,
    draining,
    has_stopped,
    log_to_own_stderr,
)
from tests.support.waiting import wait_until


class FakeClock:
    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Original:
    """A SIGTERM handler that records its calls."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, signum: int, frame: FrameType | None) -> str:
        self.calls.append(signum)
        return "original"


@pytest.fixture(autouse=True)
def not_draining() -> Iterator[None]:
    draining.clear()
    yield
    draining.clear()


@pytest.fixture
def sigterm_handler() -> Iterator[Original]:
    """A recording handler installed on SIGTERM; the real handler is put back afterwards."""
    saved = signal.getsignal(signal.SIGTERM)
    original = Original()
    signal.signal(signal.SIGTERM, original)
    try:
        yield original
    finally:
        signal.signal(signal.SIGTERM, saved)


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """These tests touch no database: one SQLite path is enough for the settings."""
    return f"sqlite:///{tmp_path / 'unused.db'}"


# --- coalesce_term_signals -------------------------------------------------------------------


def test_the_first_sigterm_calls_the_original_handler_and_starts_the_drain():
    original, clock = Original(), FakeClock()
    handler = coalesce_term_signals(original, window_seconds=5, clock=clock)
    assert not draining.is_set()

    assert handler(signal.SIGTERM, None) == "original"

    assert original.calls == [signal.SIGTERM]
    assert draining.is_set()


def test_a_second_sigterm_within_the_window_is_ignored():
    original, clock = Original(), FakeClock()
    handler = coalesce_term_signals(original, window_seconds=5, clock=clock)
    handler(signal.SIGTERM, None)

    clock.advance(0.1)
    assert handler(signal.SIGTERM, None) is None
    clock.advance(4.8)
    assert handler(signal.SIGTERM, None) is None

    assert original.calls == [signal.SIGTERM]
    assert draining.is_set()


def test_a_sigterm_after_the_window_calls_the_original_again():
    original, clock = Original(), FakeClock()
    handler = coalesce_term_signals(original, window_seconds=5, clock=clock)
    handler(signal.SIGTERM, None)
    clock.advance(0.1)
    handler(signal.SIGTERM, None)

    clock.advance(5.0)
    assert handler(signal.SIGTERM, None) == "original"

    assert original.calls == [signal.SIGTERM, signal.SIGTERM]


def test_the_window_is_measured_from_the_last_sigterm_passed_on_not_from_the_ignored_ones():
    original, clock = Original(), FakeClock()
    handler = coalesce_term_signals(original, window_seconds=5, clock=clock)
    handler(signal.SIGTERM, None)  # t = 0: passed on
    clock.advance(4)
    handler(signal.SIGTERM, None)  # t = 4: ignored
    clock.advance(2)
    handler(signal.SIGTERM, None)  # t = 6: a new request

    assert len(original.calls) == 2


def test_each_wrapper_has_a_window_of_its_own():
    clock = FakeClock()
    first, second = Original(), Original()
    coalesce_term_signals(first, window_seconds=5, clock=clock)(signal.SIGTERM, None)

    coalesce_term_signals(second, window_seconds=5, clock=clock)(signal.SIGTERM, None)

    assert (first.calls, second.calls) == ([signal.SIGTERM], [signal.SIGTERM])


def test_a_burst_whose_first_sigterm_came_before_the_wrapper_ignores_the_next_one():
    original, clock = Original(), FakeClock()
    handler = coalesce_term_signals(original, window_seconds=5, clock=clock, already_had_one=True)
    assert draining.is_set()

    clock.advance(1)
    assert handler(signal.SIGTERM, None) is None
    clock.advance(5)
    assert handler(signal.SIGTERM, None) == "original"

    assert original.calls == [signal.SIGTERM]


def dramatiq_like_handler() -> tuple[Callable[[int, FrameType | None], None], list[int]]:
    """A handler shaped as Dramatiq's worker-process one (its state in the closure's ``running``),
    and the signals it was called with."""
    running = True
    calls: list[int] = []

    def termhandler(signum: int, frame: FrameType | None) -> None:
        nonlocal running
        calls.append(signum)
        running = False

    return termhandler, calls


def test_has_stopped_reads_whether_dramatiqs_handler_had_its_sigterm():
    handler, _ = dramatiq_like_handler()
    assert not has_stopped(handler)

    handler(signal.SIGTERM, None)

    assert has_stopped(handler)


def test_has_stopped_is_false_for_any_other_handler():
    flag = False

    def closure_without_running(signum: int, frame: FrameType | None) -> bool:
        return flag

    assert not has_stopped(Original())
    assert not has_stopped(closure_without_running)
    assert not has_stopped(signal.default_int_handler)


# --- DrainOnce -------------------------------------------------------------------------------


def test_drain_once_wraps_the_sigterm_handler_in_the_main_thread(sigterm_handler):
    DrainOnce(window_seconds=5).after_process_boot(broker=None)  # type: ignore[arg-type]

    installed = signal.getsignal(signal.SIGTERM)
    assert installed is not sigterm_handler and callable(installed)
    installed(signal.SIGTERM, None)  # type: ignore[operator]
    installed(signal.SIGTERM, None)  # type: ignore[operator]
    assert sigterm_handler.calls == [signal.SIGTERM]
    assert draining.is_set()


def test_drain_once_knows_a_sigterm_that_came_before_it_was_installed():
    saved = signal.getsignal(signal.SIGTERM)
    handler, calls = dramatiq_like_handler()
    signal.signal(signal.SIGTERM, handler)
    try:
        signal.raise_signal(signal.SIGTERM)  # the platform's, while the process imported the actors
        DrainOnce(window_seconds=5).after_process_boot(broker=None)  # type: ignore[arg-type]
        signal.raise_signal(signal.SIGTERM)  # the master's copy of it, once the workers booted
    finally:
        signal.signal(signal.SIGTERM, saved)

    assert calls == [signal.SIGTERM]
    assert draining.is_set()


def test_real_sigterms_in_a_burst_reach_the_original_handler_once(sigterm_handler):
    DrainOnce(window_seconds=5).after_process_boot(broker=None)  # type: ignore[arg-type]

    signal.raise_signal(signal.SIGTERM)
    signal.raise_signal(signal.SIGTERM)

    assert sigterm_handler.calls == [signal.SIGTERM]
    assert draining.is_set()


def test_drain_once_does_nothing_outside_the_main_thread(sigterm_handler):
    errors: list[BaseException] = []

    def boot() -> None:
        try:
            DrainOnce(window_seconds=5).after_process_boot(broker=None)  # type: ignore[arg-type]
        except BaseException as e:  # noqa: BLE001 - reported in the main thread
            errors.append(e)

    thread = threading.Thread(target=boot)
    thread.start()
    thread.join(timeout=10)

    assert errors == []
    assert signal.getsignal(signal.SIGTERM) is sigterm_handler
    assert not draining.is_set()


def test_drain_once_leaves_a_non_callable_handler_alone():
    saved = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        DrainOnce(window_seconds=5).after_process_boot(broker=None)  # type: ignore[arg-type]
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, saved)


# --- Heartbeat -------------------------------------------------------------------------------


class _Parked:
    """Stands in for the broker's Redis client at teardown, so the beating thread stops writing."""

    def __init__(self) -> None:
        self.reached = threading.Event()

    def register_script(self, *_args: object, **_kwargs: object) -> None:
        self.reached.set()
        threading.Event().wait()  # the daemon thread stays here until the process ends


@pytest.fixture
def heartbeat_broker(settings: Settings) -> Iterator[object]:
    broker = build_broker(settings)
    client = broker.client
    yield broker
    # The heartbeat thread never ends on its own: park it before the namespace is cleaned up.
    parked = _Parked()
    broker.client = parked  # type: ignore[assignment]
    parked.reached.wait(timeout=5)
    client.close()


def heartbeat_score(settings: Settings, broker_id: str) -> float | None:
    return redis.Redis.from_url(settings.broker_url).zscore(f"{settings.broker_namespace}:__heartbeats__", broker_id)


def test_the_heartbeat_writes_the_brokers_id_with_the_time_in_milliseconds(settings, heartbeat_broker):
    before_ms = time.time() * 1000
    Heartbeat(interval_seconds=0.1).after_worker_boot(heartbeat_broker, worker=None)  # type: ignore[arg-type]

    score = wait_until(
        lambda: heartbeat_score(settings, heartbeat_broker.broker_id),
        timeout=1.0,
        interval=0.02,
        what="the first heartbeat",
    )

    after_ms = time.time() * 1000
    assert before_ms - 50 <= score <= after_ms + 50


def test_the_heartbeat_keeps_beating(settings, heartbeat_broker):
    Heartbeat(interval_seconds=0.1).after_worker_boot(heartbeat_broker, worker=None)  # type: ignore[arg-type]
    first = wait_until(
        lambda: heartbeat_score(settings, heartbeat_broker.broker_id),
        timeout=1.0,
        interval=0.02,
        what="the first heartbeat",
    )

    second = wait_until(
        lambda: (score := heartbeat_score(settings, heartbeat_broker.broker_id)) > first and score,
        timeout=1.0,
        interval=0.02,
        what="a later heartbeat",
    )
    third = wait_until(
        lambda: (score := heartbeat_score(settings, heartbeat_broker.broker_id)) > second and score,
        timeout=1.0,
        interval=0.02,
        what="another heartbeat",
    )

    assert first < second < third
    assert abs(third - time.time() * 1000) < 1_000


def test_the_heartbeat_writes_only_its_own_key(settings, heartbeat_broker):
    Heartbeat(interval_seconds=0.1).after_worker_boot(heartbeat_broker, worker=None)  # type: ignore[arg-type]
    wait_until(
        lambda: heartbeat_score(settings, heartbeat_broker.broker_id),
        timeout=1.0,
        interval=0.02,
        what="the first heartbeat",
    )

    client = redis.Redis.from_url(settings.broker_url)
    assert client.zcard(f"{settings.broker_namespace}:__heartbeats__") == 1
    assert list(client.scan_iter(match=f"{settings.broker_namespace}:*")) == [
        f"{settings.broker_namespace}:__heartbeats__".encode()
    ]


def test_the_heartbeat_is_not_started_for_a_broker_that_is_not_redis():
    from dramatiq.brokers.stub import StubBroker

    before = {thread.ident for thread in threading.enumerate()}
    broker = StubBroker()
    try:
        Heartbeat(interval_seconds=0.1).after_worker_boot(broker, worker=None)  # type: ignore[arg-type]
        started = [t for t in threading.enumerate() if t.ident not in before and t.name == "heartbeat"]
        assert started == []
    finally:
        broker.close()


def test_the_heartbeat_survives_redis_errors(settings, heartbeat_broker, caplog):
    failures = threading.Event()
    real = heartbeat_broker.client

    class Flaky:
        calls = 0

        def register_script(self, script: str) -> Callable[..., object]:
            beat = real.register_script(script)

            def flaky(**kwargs: object) -> object:
                Flaky.calls += 1
                if Flaky.calls <= 2:
                    failures.set()
                    raise redis.ConnectionError("Redis is down for a moment")
                return beat(**kwargs)

            return flaky

    heartbeat_broker.client = Flaky()
    Heartbeat(interval_seconds=0.05).after_worker_boot(heartbeat_broker, worker=None)  # type: ignore[arg-type]

    wait_until(
        lambda: heartbeat_score(settings, heartbeat_broker.broker_id),
        timeout=2.0,
        interval=0.02,
        what="a heartbeat after the errors",
    )
    assert failures.is_set()
    warnings = [r for r in caplog.records if r.name == lifecycle.logger.name and r.levelname == "WARNING"]
    assert len(warnings) == 2


# --- log_to_own_stderr -----------------------------------------------------------------------


@pytest.fixture
def piped_handler() -> Iterator[logging.StreamHandler]:
    """A root handler writing into a pipe, as Dramatiq's worker process logs; all put back after."""
    read_end, write_end = multiprocessing.Pipe(duplex=False)
    handler = logging.StreamHandler(StreamablePipe(write_end))
    root, saved = logging.getLogger(), (sys.stdout, sys.stderr)
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        sys.stdout, sys.stderr = saved
        read_end.close()
        write_end.close()


def test_log_to_own_stderr_points_the_piped_handler_at_the_processs_stderr(piped_handler):
    assert log_to_own_stderr()

    assert piped_handler.stream is sys.__stderr__
    assert sys.stderr is sys.__stderr__


def test_log_to_own_stderr_says_so_when_a_blocked_write_holds_the_handler(piped_handler):
    held, release = threading.Event(), threading.Event()

    def blocked_write() -> None:
        with piped_handler.lock:  # type: ignore[union-attr]
            held.set()
            release.wait(5)

    writer = threading.Thread(target=blocked_write)
    writer.start()
    held.wait(5)
    try:
        assert not log_to_own_stderr(lock_timeout_seconds=0.1)
    finally:
        release.set()
        writer.join()
    assert isinstance(piped_handler.stream, StreamablePipe)
