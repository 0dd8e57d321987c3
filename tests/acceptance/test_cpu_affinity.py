"""WORKER_CPU_AFFINITY=auto on real worker processes: each one's threads, those started after it
booted included, stay on one CPU, the processes take the CPUs in turn, and the month is mailed as
ever; without it every thread may run on any CPU."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import replace

import pytest

from tests.support.databases import load_users
from tests.support.processes import children, run_cli, wait_for_progress

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.parametrize("database_url", ["postgresql"], indirect=True),
    pytest.mark.skipif(
        not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
        reason="needs Linux and two CPUs or more to tell one CPU from several",
    ),
]

PERIOD = "2026-10"


def cpus_of_each_thread(pid: int) -> list[set[int]]:
    return [os.sched_getaffinity(int(thread)) for thread in os.listdir(f"/proc/{pid}/task")]


def test_each_pinned_worker_process_keeps_to_one_cpu_and_every_user_is_mailed_once(
    settings, sessions, smtp_server, start_workers
):
    settings = replace(settings, smtp_url=smtp_server.url, worker_cpu_affinity="auto")
    population = load_users(sessions, count=40, inactive_every=5)
    allowed = sorted(os.sched_getaffinity(0))
    group = start_workers(settings, processes=3, threads=4)

    assert run_cli(settings, "trigger", PERIOD).returncode == 0
    assert wait_for_progress(settings, PERIOD, timeout=90)["delivered"] == len(population.active)

    by_user = smtp_server.by_user()
    assert sorted(by_user) == population.active
    assert all(len(messages) == 1 for messages in by_user.values())
    # Read once the month is mailed: the worker threads, consumers and heartbeat have all started.
    cpus = {}
    for worker in children(group.process.pid):
        threads = cpus_of_each_thread(worker)
        assert len(threads) > 4  # the worker threads and those Dramatiq and the process start
        assert all(len(thread) == 1 for thread in threads), threads
        assert len({frozenset(thread) for thread in threads}) == 1, threads
        cpus[worker] = next(iter(threads[0]))
    assert Counter(cpus.values()) == Counter(allowed[number % len(allowed)] for number in range(3))
    log = group.log()
    for number in (1, 2, 3):
        assert f"Worker process {number} runs on CPU {allowed[(number - 1) % len(allowed)]}." in log


def test_without_it_every_worker_thread_may_run_on_any_cpu(settings, start_workers):
    allowed = os.sched_getaffinity(0)
    group = start_workers(settings, processes=2, threads=2)

    for worker in children(group.process.pid):
        assert all(thread == allowed for thread in cpus_of_each_thread(worker))
    assert "runs on CPU" not in group.log()
