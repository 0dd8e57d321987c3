"""The fleet at a glance, from the figures the metrics exporter serves (:mod:`reports.ops.metrics`):
each queue's depth, oldest age and the messages workers hold, the mail breaker, and the send rate.
Read from the queues' counts and the workers' snapshots, never by taking a message to look at it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.core import Metric

from reports.delivery.breaker import STATE_VALUES, State


@dataclass
class QueueFigures:
    ready: int = 0
    delayed: int = 0
    #: Dead-lettered by the broker itself, not yet moved into the dead-letter store.
    broker_dead: int = 0
    #: Fetched by workers and not yet acked: prefetched, running, or delayed until due.
    held: int = 0
    oldest_age_seconds: float = 0.0


@dataclass
class Fleet:
    queues: dict[str, QueueFigures] = field(default_factory=dict)
    #: ``None`` when the shared Redis, which keeps it, could not be read.
    breaker: State | None = None
    #: Sends held back by the send rate, by outcome (``waited``, ``deferred``).
    throttled: dict[str, int] = field(default_factory=dict)
    #: Dead letters in the store not yet replayed.
    dead_letters_waiting: int = 0
    #: The sources (``broker``, ``redis``, ``database``) the collection could not read: their
    #: figures above are missing or their defaults, not readings.
    unreadable: list[str] = field(default_factory=list)


_BREAKER_STATES = {value: state for state, value in STATE_VALUES.items()}


def read(metrics: Iterable[Metric]) -> Fleet:
    """The fleet's figures out of one collection of the exporter's metrics."""
    fleet = Fleet()
    for metric in metrics:
        for sample in metric.samples:
            labels = sample.labels
            if sample.name == "reports_queue_messages":
                figures = fleet.queues.setdefault(labels["queue"], QueueFigures())
                state = "held" if labels["state"] == "in_progress" else labels["state"]
                setattr(figures, state, int(sample.value))
            elif sample.name == "reports_queue_oldest_message_age_seconds":
                fleet.queues.setdefault(labels["queue"], QueueFigures()).oldest_age_seconds = sample.value
            elif sample.name == "reports_breaker_state" and labels.get("breaker") == "mail":
                fleet.breaker = _BREAKER_STATES.get(int(sample.value), State.OPEN)
            elif sample.name == "reports_send_throttled_total":
                fleet.throttled[labels["outcome"]] = int(sample.value)
            elif sample.name == "reports_dead_letters_stored" and labels["replayed"] == "false":
                fleet.dead_letters_waiting = int(sample.value)
            elif sample.name == "reports_exporter_source_up" and not sample.value:
                fleet.unreadable.append(labels["source"])
    return fleet
