"""The brokers' middleware signals (reports.worker.signals) reach the same hooks, in the same order,
with the same failure handling, as Dramatiq's own broker: the same messages through a real Worker
on Dramatiq's StubBroker with and without the mix-in record the same calls.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import Middleware, SkipMessage

from reports.worker.signals import DirectSignals

QUEUE = "signals"


class DirectStubBroker(DirectSignals, StubBroker):
    pass


class Calls:
    """Every hook called, by the message's argument, in the order each message met them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_message: dict[str, list[str]] = defaultdict(list)

    def record(self, message: Any, call: str) -> None:
        with self.lock:
            self.by_message[message.args[0]].append(call)


class Watches(Middleware):
    def __init__(self, calls: Calls, label: str) -> None:
        self.calls, self.label = calls, label

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        self.calls.record(message, f"{self.label}.before_process_message")

    def after_process_message(
        self, broker: dramatiq.Broker, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        self.calls.record(message, f"{self.label}.after_process_message {type(exception).__name__}")

    def after_ack(self, broker: dramatiq.Broker, message: Any) -> None:
        self.calls.record(message, f"{self.label}.after_ack")


class Skips(Middleware):
    """Skips the message whose argument is ``"skip"``; its after-hook of processing always fails."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        self.calls.record(message, "skips.before_process_message")
        if message.args[0] == "skip":
            raise SkipMessage()

    def after_process_message(
        self, broker: dramatiq.Broker, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        self.calls.record(message, "skips.after_process_message")
        raise RuntimeError("an after-hook that fails is logged, and the others still run")

    def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
        self.calls.record(message, "skips.after_skip_message")

    def before_nack(self, broker: dramatiq.Broker, message: Any) -> None:
        self.calls.record(message, "skips.before_nack")


class FailsBeforeAck(Middleware):
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    def before_ack(self, broker: dramatiq.Broker, message: Any) -> None:
        self.calls.record(message, "fails.before_ack")
        raise ValueError("a before-hook that fails with anything but a MiddlewareError is logged")


def _run(broker: StubBroker, calls: Calls) -> None:
    broker.add_middleware(Watches(calls, "first"))
    broker.add_middleware(Skips(calls))
    broker.add_middleware(FailsBeforeAck(calls))

    @dramatiq.actor(queue_name=QUEUE, broker=broker, max_retries=0)
    def work(argument: str) -> None:
        if argument == "fail":
            raise KeyError(argument)

    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=20)
    worker.start()
    try:
        for argument in ("ok", "skip", "fail"):
            work.send(argument)
        broker.join(QUEUE, fail_fast=False, timeout=10_000)
        worker.join()
        # Added once signals have been sent: the next message reaches it too.
        broker.add_middleware(Watches(calls, "late"))
        work.send("after")
        broker.join(QUEUE, fail_fast=False, timeout=10_000)
        worker.join()
    finally:
        worker.stop()


def _recorded(broker: StubBroker) -> tuple[dict[str, list[str]], list[str]]:
    calls = Calls()
    handler = _Collect()
    logging.getLogger("dramatiq").addHandler(handler)
    try:
        _run(broker, calls)
    finally:
        logging.getLogger("dramatiq").removeHandler(handler)
        broker.close()
    return dict(calls.by_message), sorted(handler.failures)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.CRITICAL)
        self.failures: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.failures.append(record.getMessage().split(" of ")[0])


def test_signals_reach_the_same_hooks_in_the_same_order_as_dramatiqs_broker() -> None:
    dramatiq_calls, dramatiq_failures = _recorded(StubBroker())
    direct_calls, direct_failures = _recorded(DirectStubBroker())

    assert direct_calls == dramatiq_calls
    assert direct_failures == dramatiq_failures
    # What the comparison covers: the order of before- and after-hooks, a skip, a failure, a hook
    # that raises, and a middleware added late.
    assert direct_calls["ok"] == [
        "first.before_process_message",
        "skips.before_process_message",
        "skips.after_process_message",
        "first.after_process_message NoneType",
        "fails.before_ack",
        "first.after_ack",
    ]
    assert direct_calls["skip"] == [
        "first.before_process_message",
        "skips.before_process_message",
        "skips.after_skip_message",
        "fails.before_ack",
        "first.after_ack",
    ]
    assert direct_calls["fail"][2:4] == ["skips.after_process_message", "first.after_process_message KeyError"]
    assert "skips.before_nack" in direct_calls["fail"]
    assert direct_calls["after"][0] == "first.before_process_message"
    assert "late.after_ack" in direct_calls["after"]
    assert "Unexpected failure in before_ack" in direct_failures
    assert "Unexpected failure in after_process_message" in direct_failures


def test_a_signal_only_some_middleware_define_reaches_those_alone(caplog: pytest.LogCaptureFixture) -> None:
    class Listens(Middleware):
        def __init__(self) -> None:
            self.heard: list[str] = []

        def after_custom_signal(self, broker: dramatiq.Broker, value: str) -> None:
            self.heard.append(value)

    broker = DirectStubBroker(middleware=[])
    listens = Listens()
    broker.add_middleware(Middleware())
    broker.add_middleware(listens)

    broker.emit_after("custom_signal", "heard")

    assert listens.heard == ["heard"]
    # Dramatiq's broker would also call the plain middleware's missing hook, and log that it failed.
    assert caplog.records == []


@pytest.mark.parametrize("broker_class", [StubBroker, DirectStubBroker])
def test_a_before_hooks_middleware_error_stops_the_signal(broker_class: type[StubBroker]) -> None:
    class Stops(Middleware):
        def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
            raise SkipMessage()

    broker = broker_class(middleware=[Stops()])

    with pytest.raises(SkipMessage):
        broker.emit_before("process_message", None)


@pytest.mark.parametrize("broker_class", [StubBroker, DirectStubBroker])
def test_an_after_hooks_middleware_error_is_only_logged(
    broker_class: type[StubBroker], caplog: pytest.LogCaptureFixture
) -> None:
    class Raises(Middleware):
        def after_process_message(self, broker: dramatiq.Broker, message: Any, **outcome: Any) -> None:
            raise SkipMessage()

    broker = broker_class(middleware=[Raises()])

    broker.emit_after("process_message", None, result=None)

    assert [record.getMessage().split(" of ")[0] for record in caplog.records] == [
        "Unexpected failure in after_process_message"
    ]
