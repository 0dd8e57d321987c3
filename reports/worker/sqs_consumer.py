"""The SQS broker and the consumer the workers run on it: dramatiq-sqs's broker with delays beyond
SQS's 15 minutes sent in steps, its queues created with a redrive policy, and a consumer that keeps
what it holds hidden, tells the fleet what it holds, and stores what it rejects or cannot decode
before deleting it.

Why each: docs/howto/sqs.md. This replaces dramatiq-sqs's consumer loop and its broker's queue
creation and enqueue; dramatiq-sqs is pinned.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import dramatiq
import redis
from dramatiq.broker import MessageProxy
from dramatiq.errors import DecodeError
from dramatiq_sqs import MessageTooLarge, SQSBroker
from dramatiq_sqs.broker import SQSConsumer

from reports.endpoints import SqsTarget
from reports.worker import holding, rejects, sqs
from reports.worker.signals import DirectSignals
from reports.worker.sqs_visibility import Receipts, VisibilityKeeper

logger = logging.getLogger(__name__)

#: HTTP connections the broker's client keeps: every worker thread acks through it.
CONNECTIONS = 32

#: How long the consumer waits before it looks again while it holds a whole prefetch, in seconds.
FULL_PAUSE_SECONDS = 0.05


class ReportsSqsBroker(DirectSignals, holding.SharesHeld, SQSBroker):  # type: ignore[misc]  # dramatiq-sqs has no annotations
    """dramatiq-sqs's broker with this module's consumer and enqueue.

    :param target: the region, queue-name prefix and endpoint (BROKER_URL).
    :param visibility_timeout: how long a received message stays hidden, in seconds
        (SQS_VISIBILITY_TIMEOUT_SECONDS).
    :param max_receive_count: the redrive policy's ``maxReceiveCount`` of the queues this broker
        creates (SQS_MAX_RECEIVE_COUNT).
    :param shared_redis: the Redis of the fleet's shared state (REDIS_URL), where the snapshots go.
    :param namespace: the key namespace there (BROKER_NAMESPACE).
    :param delay_step_seconds: the longest delay sent in one step: SQS's 15 minutes.
    """

    def __init__(
        self,
        *,
        target: SqsTarget,
        visibility_timeout: int,
        max_receive_count: int,
        shared_redis: redis.Redis,
        namespace: str,
        middleware: list[dramatiq.Middleware],
        delay_step_seconds: int = sqs.MAX_DELAY_SECONDS,
    ) -> None:
        super().__init__(
            # As on the RabbitMQ broker, ``namespace`` is the key namespace in the shared Redis:
            # dramatiq-sqs's own (its queue-name prefix) is read only by the queue creation
            # replaced here, which takes the target's prefix.
            shared_redis=shared_redis,
            namespace=namespace,
            middleware=middleware,
            dead_letter=True,
            visibility_timeout=visibility_timeout,
            **sqs.client_options(target, connections=CONNECTIONS),
        )
        self.target = target
        #: boto3's client is thread-safe (its resources are not): every call goes through it.
        self.client: Any = self.sqs.meta.client
        self.max_receive_count = max_receive_count
        self.delay_step_seconds = delay_step_seconds
        self.urls: dict[str, str] = {}
        self.dead_letter_urls: dict[str, str] = {}
        self._creating = threading.Lock()
        self.receipts: dict[str, Receipts] = {}
        self.keeper = VisibilityKeeper(self.client, timeout_seconds=visibility_timeout)

    def url_of(self, queue_name: str) -> str:
        """The URL of ``queue_name``'s SQS queue, declared and created (with its dead-letter queue) if need be."""
        self.declare_queue(queue_name)
        self._ensure_queue(queue_name)
        return self.urls[queue_name]

    def dead_letter_url_of(self, queue_name: str) -> str:
        """The URL of ``queue_name``'s dead-letter queue (see :meth:`url_of`)."""
        self.url_of(queue_name)
        return self.dead_letter_urls[queue_name]

    def _ensure_queue(self, queue_name: str) -> None:
        if queue_name not in self.queue_names:
            raise dramatiq.QueueNotFound(queue_name)  # type: ignore[no-untyped-call]
        if queue_name in self.urls:
            return
        with self._creating:
            if queue_name in self.urls:
                return
            prefix = self.target.prefix
            dead_letters = self._get_or_create(
                sqs.dead_letter_name(prefix, queue_name),
                lambda: {"MessageRetentionPeriod": str(self.dead_letter_retention)},
            )
            url = self._get_or_create(sqs.sqs_name(prefix, queue_name), lambda: self._attributes(dead_letters))
            self.dead_letter_urls[queue_name] = dead_letters
            self.urls[queue_name] = url
            # dramatiq-sqs's own maps, which its join() reads.
            self.queues[queue_name] = self.sqs.Queue(url)
            self.dead_letter_queues[queue_name] = self.sqs.Queue(dead_letters)

    def _attributes(self, dead_letter_url: str) -> dict[str, str]:
        """A queue's attributes when this broker creates it: SQS moves a message received
        ``max_receive_count`` times without being deleted to the queue's dead-letter queue, where
        the workers' sweep stores it as a dead letter."""
        with sqs.translated():
            arn = self.client.get_queue_attributes(QueueUrl=dead_letter_url, AttributeNames=["QueueArn"])["Attributes"]
        redrive = {"deadLetterTargetArn": arn["QueueArn"], "maxReceiveCount": str(self.max_receive_count)}
        return {
            "MessageRetentionPeriod": str(self.retention),
            "VisibilityTimeout": str(self.visibility_timeout),
            "RedrivePolicy": json.dumps(redrive),
        }

    def _get_or_create(self, name: str, attributes: Callable[[], dict[str, str]]) -> str:
        """The URL of the SQS queue ``name``; created with ``attributes()`` if it does not exist.
        An existing queue (one an operator made, with a policy or a KMS key) is left as it is."""
        url = sqs.queue_url(self.client, name)
        if url is not None:
            return url
        with sqs.translated():
            return str(self.client.create_queue(QueueName=name, Attributes=attributes())["QueueUrl"])

    def enqueue(self, message: dramatiq.Message[Any], *, delay: int | None = None) -> dramatiq.Message[Any]:
        """Send ``message`` after ``delay`` ms; a delay beyond SQS's longest goes in steps
        (:func:`reports.worker.sqs.stepped`) instead of raising ``MessageDelayTooLong``."""
        url = self.url_of(message.queue_name)
        now_ms = int(time.time() * 1000)
        sent, seconds = sqs.stepped(message, delay, now_ms=now_ms, step_seconds=self.delay_step_seconds)
        self.emit_before("enqueue", sent, delay)
        with sqs.translated():
            self.client.send_message(QueueUrl=url, MessageBody=self._body(sent), DelaySeconds=seconds)
        self.emit_after("enqueue", sent, delay)
        return sent

    def enqueue_many(self, queue_name: str, messages: Sequence[dramatiq.Message[Any]]) -> int:
        """Send ``messages`` (none delayed) to ``queue_name`` in batch calls; how many were sent."""
        url = self.url_of(queue_name)
        for message in messages:
            self.emit_before("enqueue", message, None)
        sqs.send_batches(self.client, url, [self._body(message) for message in messages])
        for message in messages:
            self.emit_after("enqueue", message, None)
        return len(messages)

    def _body(self, message: dramatiq.Message[Any]) -> str:
        body = sqs.encode(message)
        if len(body) > self.max_message_size:
            raise MessageTooLarge(f"Messages in SQS can be at most {self.max_message_size} bytes large.")
        return body

    def depths(self, queue_name: str) -> tuple[int, int, int]:
        """``queue_name``'s messages ready, delayed and in flight, as SQS counts them (:func:`reports.worker.sqs.depths`)."""
        return sqs.depths(self.client, self.url_of(queue_name))

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = sqs.MAX_WAIT_SECONDS * 1000) -> Consumer:
        url = self.url_of(queue_name)
        # One per queue for the process's life: a consumer started after an error settles what
        # the one before it handed out, and the keeper goes on extending it meanwhile.
        receipts = self.receipts.setdefault(queue_name, Receipts(url))
        self.keeper.watch(receipts)
        return Consumer(self, queue_name, receipts, prefetch=prefetch, timeout=timeout)

    def close(self) -> None:
        self.client.close()


class _SqsMessage(MessageProxy):
    def __init__(self, message: dramatiq.Message[Any], receipt_handle: str) -> None:
        super().__init__(message)
        self.receipt_handle = receipt_handle


class Consumer(SQSConsumer):  # type: ignore[misc]  # dramatiq-sqs has no annotations
    """Receives up to a prefetch's worth, long-polling; settles by receipt handle through the broker's client."""

    broker: ReportsSqsBroker
    # Set by dramatiq-sqs's consumer: received and not yet handed out, and its receive's options.
    messages: deque[_SqsMessage]
    prefetch: int
    wait_time_seconds: int
    visibility_timeout: int

    def __init__(
        self, broker: ReportsSqsBroker, queue_name: str, receipts: Receipts, *, prefetch: int, timeout: int
    ) -> None:
        super().__init__(
            broker.queues[queue_name],
            prefetch,
            min(timeout, sqs.MAX_WAIT_SECONDS * 1000),
            dead_letter_queue=broker.dead_letter_queues[queue_name],
            visibility_timeout=broker.visibility_timeout,
        )
        self.broker = broker
        self.queue_name = queue_name
        self.receipts = receipts
        self.url = receipts.url
        # A long poll of a second at least: SQS answers it as soon as a message arrives, while a
        # poll of 0 s (short polling) asks a sample of its servers and may answer empty.
        self.wait_time_seconds = max(1, self.wait_time_seconds)

    def __next__(self) -> MessageProxy | None:
        message = self._next()
        # Before the message goes to a worker thread, so a reader sees it held before it starts.
        self.broker.held_publisher.publish_if_due()
        return message

    def _next(self) -> MessageProxy | None:
        if not self.messages:
            room = self.prefetch - len(self.receipts)
            if room <= 0:
                time.sleep(FULL_PAUSE_SECONDS)
                return None
            self._receive(min(room, sqs.BATCH))
        return self.messages.popleft() if self.messages else None

    def _receive(self, count: int) -> None:
        with sqs.translated():
            received = self.broker.client.receive_message(
                QueueUrl=self.url,
                MaxNumberOfMessages=count,
                WaitTimeSeconds=self.wait_time_seconds,
                VisibilityTimeout=self.visibility_timeout,
            ).get("Messages", [])
        now = self.broker.keeper.clock()
        for raw in received:
            self.receipts.add(raw["ReceiptHandle"], now)
        for index, raw in enumerate(received):
            try:
                message = self._admit(raw)
            except BaseException:
                # Left to come back when their visibility runs out: none is lost, none kept hidden.
                self.receipts.discard(r["ReceiptHandle"] for r in received[index:])
                raise
            if message is not None:
                self.messages.append(message)

    def _admit(self, raw: dict[str, Any]) -> _SqsMessage | None:
        """The received message to hand out, or ``None`` for one that is not to run now: it cannot
        be decoded (it is dead-lettered), or it is a step of a long delay (it is sent on)."""
        body = sqs.decode(raw["Body"])
        try:
            decoded: dramatiq.Message[Any] = dramatiq.Message.decode(body)
        except DecodeError:
            self._dead_letter(raw, body)
            return None
        wait_ms = sqs.remaining_ms(decoded, now_ms=int(time.time() * 1000))
        if wait_ms > 0:
            logger.debug("Message %s is due in %d ms: sent on.", decoded.message_id, wait_ms)
            self.broker.enqueue(decoded, delay=wait_ms)
            self._delete(raw["ReceiptHandle"])
            return None
        message = _SqsMessage(decoded, raw["ReceiptHandle"])
        holding.hold(self.broker.held, self, self.queue_name, message)
        return message

    def ack(self, message: MessageProxy) -> None:
        self._delete(message.receipt_handle)
        holding.release(self.broker.held, message)

    def nack(self, message: MessageProxy) -> None:
        # dramatiq-sqs's nack copies the message into the dead-letter queue, where only the next
        # sweep finds it. Stored here, it is deleted instead; if it cannot be stored, it is moved.
        body = message.encode()
        if not rejects.store(self.broker, self.queue_name, message.message_id, body):
            self._reject(sqs.encode(message))
        self._delete(message.receipt_handle)
        holding.release(self.broker.held, message)

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        messages = list(messages)
        handles = [message.receipt_handle for message in messages]
        try:
            sqs.show_again(self.broker.client, self.url, handles)
        finally:
            # Not hidden any longer either way: shown again now, or when their visibility runs out.
            self.receipts.discard(handles)
            for message in messages:
                holding.release(self.broker.held, message)

    def close(self) -> None:
        try:
            buffered, self.messages = list(self.messages), deque()
            if buffered:
                self.requeue(buffered)
        finally:
            self.broker.held_publisher.publish_if_due(force=True)

    def _delete(self, handle: str) -> None:
        try:
            with sqs.translated():
                self.broker.client.delete_message(QueueUrl=self.url, ReceiptHandle=handle)
        except sqs.SqsRefused as refused:
            # A handle SQS no longer takes: the message came back to another worker after this one
            # stalled past its visibility timeout. That copy's claim check makes it send nothing.
            logger.warning(
                "Could not delete an SQS message of %s (%s); it will run again and send nothing.",
                self.queue_name,
                refused.code,
            )
        self.receipts.discard([handle])

    def _reject(self, body: str) -> None:
        """Move a message into the queue's dead-letter queue, marked as moved by a worker."""
        with sqs.translated():
            self.broker.client.send_message(
                QueueUrl=self.broker.dead_letter_urls[self.queue_name],
                MessageBody=body,
                MessageAttributes={sqs.REJECTED_ATTRIBUTE: {"DataType": "String", "StringValue": "true"}},
            )

    def _dead_letter(self, raw: dict[str, Any], body: bytes) -> None:
        message_id = raw["MessageId"]
        if not rejects.store(self.broker, self.queue_name, message_id, body):
            self._reject(raw["Body"])
        self._delete(raw["ReceiptHandle"])
        logger.error(
            "Undecodable message %s on %s moved to the dead letters.",
            message_id,
            self.queue_name,
            extra={"message_id": message_id, "queue": self.queue_name},
        )
