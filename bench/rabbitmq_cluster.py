"""Benchmark: a month on a three-node RabbitMQ cluster with quorum queues, against classic queues on the
same cluster, and with a node killed (``kill -9``) a third of the way through; and what a queued message
costs each node in memory and on disk.

Usage (from the repository root, as root: the cluster's nodes use the machine node's Erlang cookie)::

    .venv/bin/python bench/rabbitmq_cluster.py --users 20000 --messages 100000

The cluster is the tests' (``tests/support/rabbitmq_cluster.py``): three ``rabbitmq-server`` processes
of the bench's own, on ports and in a folder of their own; this machine's own node is not touched.
Each run has a vhost of its own on it. Its queues are declared through node a, so a quorum queue's
leader (and a classic queue) is there; the Procfile's pools (``bulk``: ``--processes``, ``--threads``;
``default``: 1 x 2) get ``BROKER_URL`` with node b first, so they are connected to b. The month is
triggered and its delivered count read every 50 ms.

Runs, in this order: ``classic`` and ``quorum`` with no kill, ``--repeats`` months each, alternating
(the median of each and their ratio are printed); then ``quorum, leader killed`` (node a, the bulk
queue's leader, killed once a third is delivered) and ``quorum, workers' node killed`` (node b). A
killed node stays down until the month is complete, then comes back before the next run. Printed for
each: reports per second over the month, the CPU the cluster's nodes used per report, whether every
user got exactly one email, and for a kill the **stall**: the longest time after the kill in which
no delivery was recorded, next to the longest such time shortly before the kill.

Memory: ``--messages`` messages published to a ``bulk`` queue nobody consumes (quorum, then classic,
each in a vhost of its own); each node's resident memory (its processes, from /proc) and the size of
its data folder, before and after, per message.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from end_to_end import empty_run_tables  # bench/end_to_end.py, beside this script
from support import (  # bench/support.py, beside this script
    MailBench,
    Pools,
    interrupt_on_sigterm,
    mail_bench,
    settings_environ,
    tree_rss_kib,
)

from reports.database import create_db_engine, session_factory
from reports.fanout import progress
from reports.jobs import BUILD_REPORT, BULK_QUEUE, DEFAULT_QUEUE, QUEUES, ReportJob
from reports.worker.broker import build_broker, declare_queues
from reports.worker.queues import queue_for
from tests.support import rabbitmq_cluster

#: Seconds between two reads of the delivered count.
POLL_SECONDS = 0.05
#: The share of the month delivered when a node is killed.
KILL_AT = 1 / 3


@dataclass(frozen=True)
class Mode:
    name: str
    queue_type: str
    #: The node killed once a third is delivered: ``a`` (the queues' leaders) or ``b`` (the workers'), or none.
    victim: str | None = None


MODES = (
    Mode("classic", "classic"),
    Mode("quorum", "quorum"),
    Mode("quorum, leader killed", "quorum", "a"),
    Mode("quorum, workers' node killed", "quorum", "b"),
)


@dataclass(frozen=True)
class Run:
    mode: Mode
    seconds: float
    delivered: int
    once: str
    #: CPU seconds the cluster's nodes used during the month.
    node_cpu: float
    #: Longest time without a delivery after the kill, and in the half of the stretch before it nearest the kill.
    stall: float | None = None
    before: float | None = None

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds

    def describe(self) -> str:
        line = (
            f"{self.mode.name:<30} {self.rate:7,.0f} reports/s ({self.seconds:.1f} s); RabbitMQ CPU "
            f"{1000 * self.node_cpu / self.delivered:.2f} ms a report\n{'':<30} {self.once}"
        )
        if self.stall is not None:
            line += f"\n{'':<30} stall after the kill {self.stall:.2f} s (longest before it {self.before:.2f} s)"
        return line


def cpu_seconds(root: int) -> float:
    """CPU seconds (user and system) that ``root`` and every process below it have used, from /proc."""
    ticks = 0
    for pid in tree_rss_kib(root):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def cluster_cpu_seconds(cluster: rabbitmq_cluster.Cluster) -> float:
    return sum(cpu_seconds(node.process.pid) for node in cluster.nodes.values() if node.process is not None)


def longest_gap(samples: list[tuple[float, int]]) -> float:
    """The longest time between two reads of ``samples`` (time, delivered) without a new delivery."""
    longest, since = 0.0, samples[0][0] if samples else 0.0
    for (_, before), (at, now) in zip(samples, samples[1:], strict=False):
        if now > before:
            since = at
        longest = max(longest, at - since)
    return longest


def month(cluster: rabbitmq_cluster.Cluster, bench: MailBench, args: argparse.Namespace, mode: Mode) -> Run:
    vhost = cluster.new_vhost()
    nodes = cluster.nodes
    settings = dataclasses.replace(
        bench.settings,
        broker_url=cluster.url(vhost, first=nodes["b"]),
        redis_url=bench.settings.broker_url,
        rabbitmq_queue_type=mode.queue_type,
    )
    declaring = build_broker(dataclasses.replace(settings, broker_url=cluster.url(vhost, first=nodes["a"])))
    declare_queues(declaring, QUEUES)
    declaring.close()
    engine = create_db_engine(settings.database_url)
    sessions = session_factory(engine)
    pools = Pools(bench.workdir, settings_environ(settings))
    samples: list[tuple[float, int]] = []
    killed_at = None
    try:
        pools.start(f"{mode.queue_type}-coordinator", DEFAULT_QUEUE, 1, 2)
        pools.start(f"{mode.queue_type}-bulk", BULK_QUEUE, args.processes, args.threads)
        bench.sink.reset()
        cpu_before = cluster_cpu_seconds(cluster)
        started = time.monotonic()
        trigger = subprocess.run(
            [sys.executable, "-m", "reports", "trigger", str(bench.period)],
            env=settings_environ(settings),
            capture_output=True,
            text=True,
            check=False,
        )
        if trigger.returncode != 0:
            raise RuntimeError(f"reports trigger failed: {trigger.stderr}")
        while True:
            with sessions.begin() as session:
                now = progress.count(session, bench.period)
            samples.append((time.monotonic(), now.delivered))
            if mode.victim is not None and killed_at is None and now.delivered >= KILL_AT * len(bench.active):
                victim = nodes[mode.victim]
                # What the victim used so far leaves the cluster's sum with it.
                assert victim.process is not None
                cpu_before -= cpu_seconds(victim.process.pid)
                cluster.kill(victim)
                killed_at = time.monotonic()
            if now.complete and now.total >= len(bench.active):
                break
            if time.monotonic() - started > args.timeout:
                raise RuntimeError(f"{mode.name}: not complete after {args.timeout} s: {now}")
            pools.check()
            time.sleep(POLL_SECONDS)
        seconds = time.monotonic() - started
        node_cpu = cluster_cpu_seconds(cluster) - cpu_before
    finally:
        pools.stop_all()
        engine.dispose()
    check = bench.sink.check(bench.active)
    run = Run(mode, seconds, samples[-1][1], check.describe(), node_cpu)
    if killed_at is not None:
        after = [s for s in samples if s[0] >= killed_at]
        before = [s for s in samples if killed_at - (killed_at - started) / 2 <= s[0] < killed_at]
        run = dataclasses.replace(run, stall=longest_gap(after), before=longest_gap(before))
    cluster.revive()
    empty_run_tables(settings.database_url)
    return run


def node_footprint(node: rabbitmq_cluster.Node) -> tuple[int, int]:
    """The node's resident memory (KiB, its process tree) and its data folder's size (KiB)."""
    assert node.process is not None
    rss = sum(tree_rss_kib(node.process.pid).values())
    disk = subprocess.run(["du", "-sk", str(node.folder / "mnesia")], capture_output=True, text=True, check=True)
    return rss, int(disk.stdout.split()[0])


def memory(cluster: rabbitmq_cluster.Cluster, bench: MailBench, queue_type: str, messages: int) -> str:
    vhost = cluster.new_vhost()
    settings = dataclasses.replace(
        bench.settings,
        broker_url=cluster.url(vhost, first=cluster.nodes["a"]),
        redis_url=bench.settings.broker_url,
        rabbitmq_queue_type=queue_type,
    )
    broker = build_broker(settings)
    declare_queues(broker, [BULK_QUEUE])
    time.sleep(2)  # the nodes settle after the queue's members start
    before = {short: node_footprint(node) for short, node in cluster.nodes.items()}
    payloads = (ReportJob(bench.period, user_id, "v2").payload() for user_id in range(1, messages + 1))
    queue_for(broker).send_jobs(BUILD_REPORT, payloads)
    time.sleep(5)  # the write-ahead log flushed to the queues' segment files
    after = {short: node_footprint(node) for short, node in cluster.nodes.items()}
    broker.close()
    per_node = ", ".join(
        f"{short}: {1024 * (after[short][0] - before[short][0]) / messages:,.0f} B memory "
        f"{1024 * (after[short][1] - before[short][1]) / messages:,.0f} B disk"
        for short in cluster.nodes
    )
    return f"{queue_type:<8} {messages:,} queued messages, per message: {per_node}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--messages", type=int, default=100_000, help="queued for the memory figures; 0: none")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2, help="months on classic and on quorum queues, each")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    interrupt_on_sigterm()
    with (
        tempfile.TemporaryDirectory(prefix="bench-cluster-") as folder,
        mail_bench(users=args.users, inactive_percent=10, prefix="bench-cluster-") as bench,
    ):
        started = time.monotonic()
        with rabbitmq_cluster.running(Path(folder)) as cluster:
            print(f"cluster of three nodes up in {time.monotonic() - started:.1f} s", flush=True)
            rates: dict[str, list[float]] = {"classic": [], "quorum": []}
            # Classic and quorum alternate (classic first on odd repeats), then each kill once.
            for repeat in range(args.repeats):
                for mode in MODES[:2] if repeat % 2 == 0 else MODES[1::-1]:
                    run = month(cluster, bench, args, mode)
                    rates[mode.name].append(run.rate)
                    print(run.describe(), flush=True)
            classic, quorum = (statistics.median(rates[name]) for name in ("classic", "quorum"))
            print(
                f"median reports/s: classic {classic:,.0f}, quorum {quorum:,.0f}; quorum / classic {quorum / classic:.2f}"
            )
            for mode in MODES[2:]:
                print(month(cluster, bench, args, mode).describe(), flush=True)
            for queue_type in ("quorum", "classic") if args.messages else ():
                print(memory(cluster, bench, queue_type, args.messages), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
