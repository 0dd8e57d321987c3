"""Hold the fleet-wide send rate with two processes of 8 threads calling `reports.delivery.send_rate.pace`.

Usage: python bench/send_rate.py [--rate 200] [--seconds 60] [--deep-rate 20] [--deep-seconds 20]

Two cases, each two processes x 8 threads against the Redis at TEST_REDIS_URL (default
redis://127.0.0.1:6379/0), in a namespace of its own (deleted after):

1. At the rate: every thread loops pace() and a 5 ms "send" (what a worker does once its SMTP
   connection is open), so 16 threads could send about 3,200 a second; a wait of up to
   pace()'s 1 s is slept, a longer one deferred (the thread sleeps the deferral, as a deferred
   message is away that long). The target: the achieved rate within 5 % of --rate over the run.
2. A deep queue: the same 16 threads against --deep-rate (20/s: 160 times the demand) with
   pace()'s sleep cut to 20 ms, so most calls are deferrals. The rate must neither be exceeded
   nor starved (deferred callers hold no slots).

It prints, per case, sends, achieved rate, error against the target, the busiest second and the
throttled counts the exporter would show.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import threading
import time
import uuid
from typing import Any

import redis
import support  # noqa: F401  (bench/support.py: this checkout's code first on sys.path)

from reports.counters import counter_key
from reports.delivery import send_rate
from reports.outcome import Outcome

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
THREADS = 8
PROCESSES = 2
#: What one send costs the worker thread once the rate lets it go, in seconds.
SEND_SECONDS = 0.005
#: What the issue asks: within this fraction of the rate.
TOLERANCE = 0.05


def _process(
    namespace: str,
    rate: float,
    burst: int,
    max_sleep_ms: float,
    seconds: float,
    go: Any,
    start: Any,
    out: multiprocessing.Queue,
) -> None:
    limiter = send_rate.SendRate(redis.Redis.from_url(REDIS_URL), namespace=namespace, per_second=rate, burst=burst)
    times: list[float] = []
    lock = threading.Lock()
    out.put("ready")
    go.wait()
    until = start.value + seconds

    def loop() -> None:
        while time.time() < until:
            deferral = send_rate.pace(limiter, time.time() * 1000, max_sleep_ms=max_sleep_ms, sleep=time.sleep)
            if isinstance(deferral, Outcome):
                time.sleep(deferral.delay_seconds)
                continue
            with lock:
                times.append(time.time())
            time.sleep(SEND_SECONDS)

    threads = [threading.Thread(target=loop) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put(times)


def run_case(name: str, *, rate: float, burst: int, max_sleep_ms: float, seconds: float) -> bool:
    namespace = f"bench-rate-{uuid.uuid4().hex[:8]}"
    context = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = context.Queue()
    go, start = context.Event(), context.Value("d", 0.0)
    processes = [
        context.Process(target=_process, args=(namespace, rate, burst, max_sleep_ms, seconds, go, start, out))
        for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    client = redis.Redis.from_url(REDIS_URL)
    try:
        for _ in processes:
            assert out.get(timeout=60) == "ready"
        start.value = begun = time.time()
        go.set()
        sent = sorted(t - begun for _ in processes for t in out.get(timeout=seconds + 60))
        counts = {
            k.decode(): int(v) for k, v in client.hgetall(counter_key(namespace, send_rate.THROTTLED_COUNTER)).items()
        }
    finally:
        for process in processes:
            process.join(timeout=10)
        client.delete(send_rate.send_rate_key(namespace), counter_key(namespace, send_rate.THROTTLED_COUNTER))
    sent = [t for t in sent if t < seconds]
    # The burst goes at once; the rate is what follows it.
    achieved = (len(sent) - burst) / seconds
    error = achieved / rate - 1
    busiest = max(sum(1 for t in sent if s <= t < s + 1) for s in range(int(seconds)))
    met = abs(error) <= TOLERANCE
    print(
        f"{name}: {PROCESSES} processes x {THREADS} threads, target {rate:g}/s (burst {burst}), "
        f"{seconds:g} s, sleep up to {max_sleep_ms:g} ms"
    )
    print(
        f"  sent {len(sent)}; achieved {achieved:.2f}/s, error {error:+.2%} ({'met' if met else 'NOT met'}: "
        f"within {TOLERANCE:.0%}); busiest second {busiest}; throttled: waited {counts.get('waited', 0)}, "
        f"deferred {counts.get('deferred', 0)}"
    )
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--deep-rate", type=float, default=20)
    parser.add_argument("--deep-seconds", type=float, default=20)
    arguments = parser.parse_args()
    at_rate = run_case(
        "at the rate", rate=arguments.rate, burst=1, max_sleep_ms=send_rate.MAX_SLEEP_MS, seconds=arguments.seconds
    )
    deep = run_case("deep queue", rate=arguments.deep_rate, burst=1, max_sleep_ms=20, seconds=arguments.deep_seconds)
    raise SystemExit(0 if at_rate and deep else 1)


if __name__ == "__main__":
    main()
