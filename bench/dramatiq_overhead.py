"""Dramatiq's own CPU per message: a worker that runs an actor doing nothing, with each stack of middleware.

Usage: .venv/bin/python bench/dramatiq_overhead.py [--messages 20000] [--threads 8] [--repeats 3]

Each run is a process of its own (this script with --run STACK) on a private redis-server: it
enqueues --messages messages for an actor that only counts them, starts a ``dramatiq.Worker`` of
--threads threads in the same process, and measures the process's CPU (``time.process_time``, every
thread) from the worker's start until the last message has been acked. The actor does nothing, so
what is measured is what any message costs a worker: the fetch, the decode, the worker threads'
hand-off, the middleware's signals and the ack, and Redis's share is not in it (another process).

Stacks:

* ``defaults``: a plain ``RedisBroker`` with Dramatiq's default middleware, as its docs start.
* ``project``: the broker and middleware the workers run (``import actors``: reports.worker.broker's
  broker with the time limit and CurrentMessage, JitteredRetries, ActorMetrics, BrokerDeadLetters,
  Heartbeat, DrainOnce, reports.worker.consumer: acks in batches, undecodable messages, and
  reports.worker.signals: each signal only to the middleware that handle it).

Prints each stack's median CPU per message in microseconds, and the worker's messages per second of
CPU: a bound on what one core could do with actors that cost nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import dramatiq
import redis
from support import redis_server  # bench/support.py, beside this script

STACKS = ("defaults", "project")
QUEUE = "overhead"
#: Seconds a run may take before it is given up.
RUN_TIMEOUT = 600


def _broker(stack: str, redis_url: str) -> dramatiq.Broker:
    if stack == "defaults":
        from dramatiq.brokers.redis import RedisBroker

        broker: dramatiq.Broker = RedisBroker(url=redis_url, namespace="bench-overhead")
        dramatiq.set_broker(broker)
        return broker
    os.environ.update(BROKER_URL=redis_url, BROKER_NAMESPACE="bench-overhead")
    import actors  # builds the project's broker and sets it as Dramatiq's

    return actors.broker


def run(stack: str, redis_url: str, messages: int, threads: int) -> float:
    """CPU seconds per message for one stack, in this process."""
    broker = _broker(stack, redis_url)
    done = threading.Event()
    counted = [0]
    lock = threading.Lock()

    @dramatiq.actor(queue_name=QUEUE, broker=broker, max_retries=0)
    def nothing(index: int) -> None:
        with lock:
            counted[0] += 1
            if counted[0] == messages:
                done.set()

    client = redis.Redis.from_url(redis_url)
    for index in range(messages):
        nothing.send(index)
    started = time.process_time()
    worker = dramatiq.Worker(broker, queues={QUEUE}, worker_threads=threads, worker_timeout=100)
    worker.start()
    if not done.wait(RUN_TIMEOUT):
        raise RuntimeError(f"{stack}: {counted[0]} of {messages} messages ran in {RUN_TIMEOUT} s")
    # The last acks follow the actors' returns; an ack deletes the message's body.
    while client.hlen(f"bench-overhead:{QUEUE}.msgs"):
        time.sleep(0.01)
    spent = time.process_time() - started
    worker.stop()
    return spent / messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--run", choices=STACKS, help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        print(run(args.run, args.redis_url, args.messages, args.threads))
        return
    print(
        f"{args.messages:,} messages, {args.threads} worker threads, {args.repeats} runs per stack; nproc {os.cpu_count()}"
    )
    figures: dict[str, list[float]] = {stack: [] for stack in STACKS}
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            for stack in STACKS if repeat % 2 == 0 else reversed(STACKS):
                with redis_server(folder) as url:
                    output = subprocess.run(
                        [
                            sys.executable,
                            str(Path(__file__).resolve()),
                            "--run",
                            stack,
                            "--redis-url",
                            url,
                            "--messages",
                            str(args.messages),
                            "--threads",
                            str(args.threads),
                        ],
                        check=True,
                        capture_output=True,
                        text=True,
                        timeout=RUN_TIMEOUT,
                        cwd=folder,
                        env={**os.environ, "DATABASE_URL": f"sqlite:///{folder}/overhead.db"},
                    )
                    figures[stack].append(float(output.stdout.strip().splitlines()[-1]))
    for stack in STACKS:
        per_message = statistics.median(figures[stack])
        runs = ", ".join(f"{s * 1e6:.0f}" for s in figures[stack])
        print(
            f"{stack:<9} {per_message * 1e6:6.0f} µs CPU per message ({1 / per_message:,.0f} messages per CPU second; runs: {runs} µs)"
        )
    print(f"project / defaults: {statistics.median(figures['project']) / statistics.median(figures['defaults']):.2f}x")


if __name__ == "__main__":
    main()
