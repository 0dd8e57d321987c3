"""On a three-node RabbitMQ cluster with quorum queues, a node killed with ``kill -9`` in the middle of
a run (the bulk queue's leader, or the node the workers are connected to) loses no report, mails
none twice, and the backlog, the workers' held snapshots and the exporter read right throughout.

The cluster (tests/support/rabbitmq_cluster.py) is started once for the session, in about half a
minute. Each test kills a node and leaves it down until the month is complete, so the two
survivors carry the rest; the next test starts it again first. They run alone (``serial``): under
the parallel part each pytest process would start a cluster of its own.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace

import dramatiq
import pytest

from reports.fanout.progress import count
from reports.jobs import QUEUES
from reports.ops.metrics import fleet_collector
from reports.periods import Period
from reports.worker import held
from reports.worker.broker import build_broker, declare_queues
from reports.worker.queues import queue_for
from tests.support import rabbitmq_cluster
from tests.support.databases import load_users
from tests.support.processes import run_cli
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.serial,
    pytest.mark.parametrize("database_url", ["postgresql"], indirect=True),
]

PERIOD = "2026-10"

#: Seconds after an ack within which a worker's snapshot shows it (the publish interval, the
#: consumer's idle turn and slack).
SHOWN_WITHIN = held.PUBLISH_INTERVAL_SECONDS + 2

#: The node in an Erlang process id as rabbitmqctl prints it: ``<reports-b@localhost.1700.123.0>``.
_PID_NODE = re.compile(r"<([^.]+@[^.]+)\.")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    with rabbitmq_cluster.running(tmp_path_factory.mktemp("rabbitmq-cluster")) as running:
        yield running


@pytest.fixture
def vhost(cluster):
    # A node the previous test killed comes back first, with its data.
    cluster.revive()
    return cluster.new_vhost()


@dataclass
class Sample:
    """One look at the run while a node is down: the backlog and the exporter's ``bulk`` figures
    (``None`` when they could not be read), then the pending items."""

    at: float
    backlog: int | None
    exported: dict[str, float] | None
    pending: int


def _consumer_nodes(cluster, vhost: str) -> dict[str, set[str]]:
    """The nodes whose channels consume each queue of ``vhost``, leaving out the consumers of a
    node that is down (a quorum queue keeps them, ``suspected_down``, until the node is back)."""
    # A table: its JSON shows process ids without their node.
    header, *rows = cluster.ctl(
        "list_consumers", "-p", vhost, "queue_name", "channel_pid", "activity_status"
    ).splitlines()
    nodes: dict[str, set[str]] = {}
    for row in rows:
        consumer = dict(zip(header.split("\t"), row.split("\t"), strict=True))
        if consumer["activity_status"] == "up":
            nodes.setdefault(consumer["queue_name"], set()).add(_PID_NODE.match(consumer["channel_pid"]).group(1))
    return nodes


def _bulk_figures(collector) -> dict[str, float]:
    [family] = [f for f in collector.collect() if f.name == "reports_queue_messages"]
    return {s.labels["state"]: s.value for s in family.samples if s.labels["queue"] == "bulk"}


@pytest.mark.parametrize("victim", ["the bulk queue's leader", "the workers' node"])
def test_a_node_killed_mid_run_loses_no_report_and_mails_none_twice(
    cluster, vhost, victim, settings, sessions, smtp_server, start_workers
):
    settings = replace(
        settings,
        redis_url=settings.shared_redis_url,
        rabbitmq_queue_type="quorum",
        smtp_url=smtp_server.url,
        plan_page_size=50,
        exporter_cache_seconds=0,
    )
    # Declared through node a: RabbitMQ puts a new quorum queue's leader on the declaring client's node.
    declaring = build_broker(replace(settings, broker_url=cluster.url(vhost, first=cluster.nodes["a"])))
    declare_queues(declaring, QUEUES)
    declaring.close()
    queues = cluster.queues(vhost)
    assert {name: row["type"] for name, row in queues.items()} == {
        f"{queue}{suffix}": "quorum" for queue in QUEUES for suffix in ("", ".DQ", ".XQ")
    }
    assert all(len(row["members"]) == 3 for row in queues.values())
    leader = cluster.node_named(queues["bulk"]["leader"])
    workers_node = next(node for node in cluster.nodes.values() if node is not leader)
    settings = replace(settings, broker_url=cluster.url(vhost, first=workers_node))
    doomed = leader if victim == "the bulk queue's leader" else workers_node

    population = load_users(sessions, count=500, inactive_every=10)
    # At most 80 emails a second: the run lasts six seconds or more.
    smtp_server.handler.delay_seconds = 0.1
    start_workers(settings, processes=1, threads=8)
    consuming = wait_until(lambda: _consumer_nodes(cluster, vhost).get("bulk"), timeout=30, what="the consumers")
    assert consuming == {workers_node.name}
    producer = queue_for(build_broker(settings))
    collector = fleet_collector(settings, sessions)
    assert run_cli(settings, "trigger", PERIOD).returncode == 0

    def progress():
        with sessions.begin() as session:
            return count(session, Period.parse(PERIOD))

    # Walked (every pending item has a message somewhere), and a fifth mailed.
    wait_until(
        lambda: (p := progress()).planned and p.delivered >= len(population.active) // 5,
        timeout=60,
        interval=0.05,
        what="the walk and a fifth of the mail",
    )

    cluster.kill(doomed)
    killed_at = time.monotonic()
    at_kill = progress()
    assert at_kill.pending > len(population.active) // 2, "the run was nearly over at the kill; it proved little"

    samples: list[Sample] = []
    while not (now := progress()).complete:
        assert time.monotonic() - killed_at < 120, f"the month did not complete with {doomed.name} down: {now}"
        # The backlog first, the pending items after: a message leaves the backlog only once its
        # item is no longer pending, so reading in this order cannot make the backlog look short.
        try:
            backlog = producer.backlog("bulk")
        except dramatiq.errors.BrokerConnectionError:
            backlog = None
        try:
            exported = _bulk_figures(collector)
        except dramatiq.errors.BrokerConnectionError:
            exported = None
        samples.append(Sample(time.monotonic() - killed_at, backlog, exported, progress().pending))
        time.sleep(0.2)

    final = progress()
    assert (final.total, final.delivered, final.dead) == (len(population.active), len(population.active), 0)
    # Every user exactly once: no worker died, so not even the one duplicate window opened.
    by_user = smtp_server.by_user()
    assert sorted(by_user) == population.active
    assert {user: len(mails) for user, mails in by_user.items() if len(mails) != 1} == {}

    # The workers consume from the survivors, the workers' node's loss notwithstanding.
    survivors = {node.name for node in cluster.nodes.values() if node is not doomed}
    consuming = _consumer_nodes(cluster, vhost).get("bulk", set())
    assert consuming and consuming <= survivors

    # Throughout: read at once from the survivors, and never fewer messages than pending items but
    # for what the workers took since their last snapshot (written at most once a second while they
    # hold messages): never more than the fleet's prefetch, Dramatiq's two a thread.
    unread = [s for s in samples if s.backlog is None or s.exported is None]
    assert not unread, f"the backlog or the exporter could not be read: {unread}"
    prefetch = 8 * 2
    short = [s for s in samples if s.backlog < s.pending - prefetch]
    assert not short, f"the backlog counted fewer messages than pending items: {short}"

    # After: nothing held, nothing counted, nothing dead in RabbitMQ. A copy RabbitMQ gave back
    # while its original was running waits, deferred, for the original's claim to lapse, then
    # finds the report sent.
    wait_until(
        lambda: producer.backlog("bulk") == 0,
        timeout=settings.claim_lease_seconds + SHOWN_WITHIN,
        what="the backlog to empty",
    )
    assert held.held_of(held.read(producer.broker.shared_redis, settings.broker_namespace), "bulk") == 0
    assert _bulk_figures(collector) == {"ready": 0, "delayed": 0, "broker_dead": 0, "in_progress": 0}
    producer.broker.close()
