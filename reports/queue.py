"""The queue port: what the flows ask of the broker, and an in-memory queue for tests.

The flows (the walk, reconcile, trigger, replay) are handed a :class:`Queue` when a process
starts; :mod:`reports.worker.queues` implements it once per broker. :class:`InMemoryQueue` keeps
what it is sent in a list, as Dramatiq's ``StubBroker`` does, for tests that need no broker.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from reports.jobs import COORDINATOR, ActorSpec


class Queue(Protocol):
    """The broker as the flows see it."""

    def send_jobs(self, spec: ActorSpec, payloads: Iterable[Mapping[str, Any]]) -> int:
        """Enqueue one message to ``spec``'s actor per payload; how many were sent."""
        ...

    def send_coordinator(self, walker: str, payload: Mapping[str, Any], *, delay_ms: int | None = None) -> None:
        """Start, or carry on after ``delay_ms``, the coordinator chain ``walker`` (the run names it)."""
        ...

    def backlog(self, queue: str) -> int:
        """Messages of ``queue`` not yet done: ready, delayed, and held by live workers."""
        ...

    def enqueue_again(
        self, *, queue: str, actor: str, args: list[Any], kwargs: dict[str, Any], walker: str | None = None
    ) -> str:
        """Enqueue a stored message's arguments as a fresh message (its attempts start over), a
        coordinator's as the chain ``walker``; its id."""
        ...


@dataclass(frozen=True)
class Message:
    """A message as :class:`InMemoryQueue` keeps it."""

    queue: str
    actor: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: The coordinator chain's token, for a coordinator message.
    walker: str | None = None
    delay_ms: int | None = None
    message_id: str = field(default_factory=lambda: str(uuid.uuid4()))


class InMemoryQueue:
    """A :class:`Queue` that keeps every message in :attr:`messages`, and each
    :meth:`send_jobs` call's messages as one of :attr:`batches`; nothing is ever consumed."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.batches: list[list[Message]] = []

    def send_jobs(self, spec: ActorSpec, payloads: Iterable[Mapping[str, Any]]) -> int:
        batch = [Message(spec.queue, spec.name, spec.arguments(payload)) for payload in payloads]
        self.messages += batch
        if batch:
            self.batches.append(batch)
        return len(batch)

    def send_coordinator(self, walker: str, payload: Mapping[str, Any], *, delay_ms: int | None = None) -> None:
        args = COORDINATOR.arguments(payload)
        self.messages.append(Message(COORDINATOR.queue, COORDINATOR.name, args, walker=walker, delay_ms=delay_ms))

    def backlog(self, queue: str) -> int:
        return sum(message.queue == queue for message in self.messages)

    def enqueue_again(
        self, *, queue: str, actor: str, args: list[Any], kwargs: dict[str, Any], walker: str | None = None
    ) -> str:
        message = Message(queue, actor, tuple(args), dict(kwargs), walker=walker)
        self.messages.append(message)
        return message.message_id

    def of(self, spec: ActorSpec) -> list[Message]:
        """The messages sent to ``spec``'s actor, in order."""
        return [message for message in self.messages if message.actor == spec.name]
