"""RabbitMQ's queues declared as one type (RABBITMQ_QUEUE_TYPE), and a queue RabbitMQ already has
as another type (or with other arguments) refused before anything is declared.

Why, and what an operator sets for quorum queues: docs/howto/rabbitmq.md. This overrides private
methods of Dramatiq's RabbitMQ broker; Dramatiq is pinned.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable
from typing import Any

import pika
import pika.exceptions
from dramatiq.brokers.rabbitmq import DEAD_MESSAGE_TTL, RabbitmqBroker
from dramatiq.common import dq_name, xq_name
from dramatiq.errors import ConnectionClosed

from reports.errors import ConfigurationError
from reports.settings import QUEUE_TYPES

#: The queue argument that names a queue's type.
TYPE_ARGUMENT = "x-queue-type"

#: AMQP reply codes: a passive declaration of a queue that does not exist; a declaration whose
#: arguments differ from the queue's.
NOT_FOUND = 404
PRECONDITION_FAILED = 406

#: How long a quorum queue whose leader does not answer is asked again for its count, in seconds:
#: an election after the leader's node is lost takes a fraction of a second when the node's
#: connections close with it.
LEADER_PATIENCE_SECONDS = 2.0
#: Pause between two such asks, in seconds.
LEADER_PAUSE_SECONDS = 0.1

#: What RabbitMQ calls the queue's current type when it refuses a declaration of another
#: (``… but current is 'quorum'``, ``… but current is the value 'quorum' of type 'longstr'``).
_CURRENT = re.compile(r"current is (?:the value )?'([^']+)'")


class QueueMismatch(ConfigurationError):
    """A queue RabbitMQ already has is of another type than RABBITMQ_QUEUE_TYPE, or has other arguments."""


def current_type(reply_text: str) -> str:
    """The type RabbitMQ's refusal of a declaration says a queue has. A queue declared without a
    type (as Dramatiq declares them) is ``current is none``: a classic queue."""
    found = _CURRENT.search(reply_text)
    return found.group(1) if found else "classic"


#: Where pika logs a channel the broker closed.
_PIKA_CHANNEL_LOG = logging.getLogger("pika.channel")


class _Answers(logging.Filter):
    """Drops pika's warnings about the channels RabbitMQ closes while :meth:`TypedRabbitmqBroker.check`
    asks, in the thread that asks: a missing queue (404) and a declaration that differs (406) are
    the answers, not faults, and a mismatch is reported in one line of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        # Compared only as an int: pika's own objects, logged as the first argument elsewhere, raise
        # when compared with one, and a filter that raises aborts the connection that logged.
        first = record.args[0] if isinstance(record.args, tuple) and record.args else None
        answer = type(first) is int and first in (NOT_FOUND, PRECONDITION_FAILED)
        return not (record.thread == self.thread and answer)


class TypedRabbitmqBroker(RabbitmqBroker):
    """Dramatiq's RabbitMQ broker declaring each queue, its ``.DQ`` and its ``.XQ`` with
    ``x-queue-type``.

    Before it declares any of the three, it raises :class:`QueueMismatch` if RabbitMQ has one of
    them as another type (or with other arguments): declaring them one by one would create the
    missing ones before RabbitMQ refused the next, leaving a queue of each type. :meth:`check`
    does the same for several queues at once.

    :param queue_type: ``classic`` or ``quorum`` (RABBITMQ_QUEUE_TYPE).
    """

    def __init__(self, *, queue_type: str, **options: Any) -> None:
        super().__init__(**options)
        self.queue_type = queue_type

    def _build_queue_arguments(self, queue_name: str) -> dict[str, Any]:
        arguments: dict[str, Any] = super()._build_queue_arguments(queue_name)  # type: ignore[no-untyped-call]
        return {**arguments, TYPE_ARGUMENT: self.queue_type}

    def _declare_xq_queue(self, queue_name: str) -> Any:
        return self.channel.queue_declare(queue=xq_name(queue_name), durable=True, arguments=self._xq_arguments())

    def _xq_arguments(self) -> dict[str, Any]:
        # Dramatiq's own, with the type: its dead letters expire after a fixed time.
        return {"x-message-ttl": DEAD_MESSAGE_TTL, TYPE_ARGUMENT: self.queue_type}

    def get_queue_message_counts(self, queue_name: str) -> tuple[int, int, int]:
        """Dramatiq's count of the messages ready in the queue, its ``.DQ`` and its ``.XQ``, with
        the queue and the ``.DQ`` asked again while their leader does not answer.

        A quorum queue whose leader does not answer within RabbitMQ's 250 ms (no leader during an
        election, or one too busy) is counted as 0 messages and 0 consumers. The workers consume
        both queues whenever they run, so that answer is taken for a true one only once it has
        lasted :data:`LEADER_PATIENCE_SECONDS` (a queue with no worker to consume it, and empty).
        """
        deadline = time.monotonic() + LEADER_PATIENCE_SECONDS
        while True:
            work, delayed = self._declare_queue(queue_name), self._declare_dq_queue(queue_name)  # type: ignore[no-untyped-call]
            unanswered = self.queue_type == "quorum" and any(
                d.method.message_count == 0 and d.method.consumer_count == 0 for d in (work, delayed)
            )
            if not unanswered or time.monotonic() >= deadline:
                dead = self._declare_xq_queue(queue_name)
                return work.method.message_count, delayed.method.message_count, dead.method.message_count
            time.sleep(LEADER_PAUSE_SECONDS)

    def check(self, queues: Iterable[str]) -> None:
        """Raise :class:`QueueMismatch` if RabbitMQ has one of ``queues``, their ``.DQ`` or their
        ``.XQ`` as another type or with other arguments; declare none that it lacks.

        Those it has are declared again, as this broker declares them: a declaration that differs
        is refused by RabbitMQ and changes nothing.
        """
        answers = _Answers()
        _PIKA_CHANNEL_LOG.addFilter(answers)
        try:
            for queue in queues:
                self._refuse_mismatched(queue)
        except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as error:
            # As Dramatiq's own declaration does: the callers try again on a new connection.
            del self.connection
            raise ConnectionClosed(error) from None  # type: ignore[no-untyped-call]
        finally:
            _PIKA_CHANNEL_LOG.removeFilter(answers)

    def _ensure_queue(self, canonical_queue_name: str) -> None:
        if canonical_queue_name in self.queues_pending:
            self.check([canonical_queue_name])
        super()._ensure_queue(canonical_queue_name)  # type: ignore[no-untyped-call]

    def _refuse_mismatched(self, queue_name: str) -> None:
        expected = {
            queue_name: self._build_queue_arguments(queue_name),
            dq_name(queue_name): self._build_queue_arguments(queue_name),
            xq_name(queue_name): self._xq_arguments(),
        }
        # On a channel of its own: RabbitMQ closes the channel that a passive declaration of a
        # missing queue, or a declaration that differs, was made on, and a caller may be holding
        # the thread's.
        channel = self.connection.channel()
        try:
            for name, arguments in expected.items():
                try:
                    channel.queue_declare(queue=name, passive=True)
                except pika.exceptions.ChannelClosedByBroker as error:
                    if error.reply_code != NOT_FOUND:
                        raise
                    channel = self.connection.channel()
                    continue
                try:
                    channel.queue_declare(queue=name, durable=True, arguments=arguments)
                except pika.exceptions.ChannelClosedByBroker as error:
                    if error.reply_code != PRECONDITION_FAILED:
                        raise
                    raise QueueMismatch(self._mismatch(name, error.reply_text)) from None
        finally:
            if channel.is_open:
                channel.close()

    def _mismatch(self, name: str, reply_text: str) -> str:
        nodes = self.parameters if isinstance(self.parameters, list) else [self.parameters]
        where = f"the queue {name!r} (vhost {nodes[0].virtual_host!r})"
        if f"'{TYPE_ARGUMENT}'" not in reply_text:
            # RabbitMQ names the first argument that differs, which may come before the type.
            reason = reply_text.removeprefix("PRECONDITION_FAILED - ")
            return f"RabbitMQ already has {where} with other arguments ({reason}): drain and delete it first."
        current = current_type(reply_text)
        fix = f"set RABBITMQ_QUEUE_TYPE={current}, or " if current in QUEUE_TYPES else ""
        return (
            f"RABBITMQ_QUEUE_TYPE is {self.queue_type}, but RabbitMQ already has {where} as a {current} queue, "
            f"and a queue's type is fixed when it is declared: {fix}drain and delete the queue first "
            "(Run on RabbitMQ, 'Change the queue type')."
        )
