"""The SQS side of the broker: queue names and message bodies as dramatiq-sqs writes them, delays
beyond SQS's longest, the queues' depths, the batched send, and reading the dead-letter queues.

dramatiq-sqs names a queue ``PREFIX_<queue>`` (or ``<queue>`` without a prefix) and its
dead-letter queue ``PREFIX_<queue>_dlq``, and sends a message's bytes in base64. SQS keeps a
delayed message itself (for 15 minutes at most) and hides a received one for a visibility
timeout instead of tracking who holds it: why each matters, docs/howto/sqs.md.
"""

from __future__ import annotations

import binascii
import contextlib
import math
from base64 import b64decode, b64encode
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
import botocore.config
import botocore.exceptions
import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.errors import ConnectionClosed
from dramatiq_sqs import broker as dramatiq_sqs

from reports.endpoints import SqsTarget
from reports.errors import ReportsError

#: SQS's longest delay, in seconds: a longer one is reached in steps of at most this.
MAX_DELAY_SECONDS: int = dramatiq_sqs.MAX_DELAY_SECONDS
#: SQS's most messages per batch call (a send, a receive, a change of visibility).
BATCH: int = dramatiq_sqs.MAX_PREFETCH
#: SQS's longest long poll, in seconds.
MAX_WAIT_SECONDS: int = dramatiq_sqs.MAX_WAIT_TIME_SECONDS
#: How long SQS keeps a message no one deleted (its longest), in seconds.
RETENTION_SECONDS: int = dramatiq_sqs.MAX_MESSAGE_RETENTION_SECONDS

#: Message option: when a message delayed beyond :data:`MAX_DELAY_SECONDS` is due, in
#: milliseconds since the epoch (on the clock of the process that enqueued it).
DUE_OPTION = "sqs_due_ms"

#: The SQS message attribute the workers set on a message they move into a dead-letter queue
#: themselves; one that SQS moved there after too many receives has none.
REJECTED_ATTRIBUTE = "reports_rejected"

#: Batch calls of one bulk send in flight at once.
SEND_CONCURRENCY = 8
#: Tries at sending one batch's entries that SQS failed for its own reasons (not the sender's).
SEND_ATTEMPTS = 3

#: Error codes of an SQS that is there but cannot take the call now: worth trying again.
_BUSY_CODES = frozenset(
    {"ThrottlingException", "RequestThrottled", "ServiceUnavailable", "InternalError", "KmsThrottled"}
)


def sqs_name(prefix: str, queue: str) -> str:
    """The SQS queue of Dramatiq's ``queue``, named as dramatiq-sqs names it."""
    return f"{prefix}_{queue}" if prefix else queue


def dead_letter_name(prefix: str, queue: str) -> str:
    return f"{sqs_name(prefix, queue)}_dlq"


def client_for(target: SqsTarget, *, connections: int = 10) -> Any:
    """A boto3 SQS client for ``target`` (thread-safe; boto3's resources are not), its
    credentials from the AWS chain, retrying throttled calls with boto3's standard mode."""
    return boto3.session.Session().client("sqs", **client_options(target, connections=connections))


def client_options(target: SqsTarget, *, connections: int) -> dict[str, Any]:
    config = botocore.config.Config(
        max_pool_connections=connections,
        retries={"mode": "standard"},
        connect_timeout=5,
        # Above the longest long poll.
        read_timeout=MAX_WAIT_SECONDS + 10,
    )
    return {"region_name": target.region, "endpoint_url": target.endpoint_url, "config": config}


def encode(message: dramatiq.Message[Any] | MessageProxy) -> str:
    """A message's body as dramatiq-sqs sends it: its bytes in base64."""
    return b64encode(message.encode()).decode()


def decode(body: str) -> bytes:
    """The bytes of a message's body; the body itself if it is not base64 (another producer's)."""
    try:
        return b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        return body.encode("utf-8", errors="replace")


def stepped(
    message: dramatiq.Message[Any], delay_ms: int | None, *, now_ms: int, step_seconds: int
) -> tuple[dramatiq.Message[Any], int]:
    """The copy of ``message`` to send and its ``DelaySeconds``, for a delay of ``delay_ms``.

    Seconds are rounded up, so a message deferred until a lease ends never runs before it. A
    delay beyond ``step_seconds`` (SQS's longest) is sent for that long, with the time it is due
    in :data:`DUE_OPTION`: the consumer that receives it early sends it on for what is left.
    """
    delay_ms = max(delay_ms or 0, 0)
    copy = message.copy()
    copy.options.pop(DUE_OPTION, None)
    if delay_ms > step_seconds * 1000:
        copy.options[DUE_OPTION] = now_ms + delay_ms
        return copy, step_seconds
    return copy, math.ceil(delay_ms / 1000)


def remaining_ms(message: dramatiq.Message[Any], *, now_ms: int) -> int:
    """How long ``message`` still has to wait (0 when it is due): a step of a long delay arrives early."""
    due = message.options.get(DUE_OPTION)
    return max(int(due) - now_ms, 0) if isinstance(due, int | float) else 0


def is_transient(error: Exception) -> bool:
    """Whether ``error`` is SQS unreachable or busy, rather than a call that can never succeed."""
    if isinstance(error, botocore.exceptions.ConnectionError | botocore.exceptions.HTTPClientError):
        return True
    if isinstance(error, botocore.exceptions.ClientError):
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        return status >= 500 or error_code(error) in _BUSY_CODES
    return False


def error_code(error: botocore.exceptions.ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


class SqsUnreachable(ConnectionClosed, ReportsError):
    """SQS could not be reached, or was too busy to answer: worth trying again.

    A ``ConnectionClosed``, so Dramatiq's worker and :func:`reports.worker.broker.enqueue_until_sent`
    try again; a ``ReportsError``, so a command says it in one line.
    """

    def __init__(self, error: Exception) -> None:
        what = error_code(error) if isinstance(error, botocore.exceptions.ClientError) else type(error).__name__
        ConnectionClosed.__init__(  # type: ignore[no-untyped-call]
            self, f"SQS could not be reached or is busy ({what}): is BROKER_URL's region or endpoint reachable?"
        )


class SqsRefused(ReportsError):
    """SQS refused a call for good: a permission, a queue's policy or its KMS key, or a bad request."""

    def __init__(self, error: botocore.exceptions.ClientError) -> None:
        super().__init__(
            f"SQS refused {error.operation_name} ({error_code(error)}): check the IAM policy, the queue policy "
            "and the KMS key of BROKER_URL's queues."
        )
        self.code = error_code(error)


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Raise an SQS error as :class:`SqsUnreachable` or :class:`SqsRefused`: what SQS says about
    itself never leaves this module as a third party's error."""
    try:
        yield
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as error:
        if is_transient(error):
            raise SqsUnreachable(error) from None
        if isinstance(error, botocore.exceptions.ClientError):
            raise SqsRefused(error) from None
        raise


def send_batches(client: Any, url: str, bodies: Sequence[str]) -> None:
    """Send ``bodies`` to the queue at ``url``, :data:`BATCH` a call, several calls at once.

    Entries SQS failed for its own reasons are sent again; raises ``ConnectionClosed`` if some
    are still not sent after :data:`SEND_ATTEMPTS`, or SQS cannot be reached. Sending a batch
    again after an error may send some of its messages twice, which the delivery claims make
    harmless.
    """
    batches = [bodies[i : i + BATCH] for i in range(0, len(bodies), BATCH)]
    if len(batches) == 1:
        _send_batch(client, url, batches[0])
        return
    with ThreadPoolExecutor(max_workers=min(SEND_CONCURRENCY, len(batches))) as pool:
        for done in [pool.submit(_send_batch, client, url, batch) for batch in batches]:
            done.result()


def _send_batch(client: Any, url: str, bodies: Sequence[str]) -> None:
    pending = {str(i): body for i, body in enumerate(bodies)}
    for _ in range(SEND_ATTEMPTS):
        with translated():
            answer = client.send_message_batch(
                QueueUrl=url, Entries=[{"Id": i, "MessageBody": body} for i, body in pending.items()]
            )
        failed = answer.get("Failed", [])
        refused = [f for f in failed if f.get("SenderFault")]
        if refused:
            raise ValueError(f"SQS refused {len(refused)} message(s): {refused[0].get('Code')}.")
        pending = {f["Id"]: pending[f["Id"]] for f in failed}
        if not pending:
            return
    raise SqsUnreachable(RuntimeError(f"SQS did not take {len(pending)} message(s)"))


def show_again(client: Any, url: str, handles: Sequence[str]) -> None:
    """Make received messages visible again at once (a visibility timeout of 0)."""
    for i in range(0, len(handles), BATCH):
        with translated():
            client.change_message_visibility_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(n), "ReceiptHandle": handle, "VisibilityTimeout": 0}
                    for n, handle in enumerate(handles[i : i + BATCH])
                ],
            )


#: The depth attributes read of a queue: ready, delayed, received and not yet deleted.
DEPTHS = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesDelayed",
    "ApproximateNumberOfMessagesNotVisible",
)


def depths(client: Any, url: str) -> tuple[int, int, int]:
    """The queue's messages ready, delayed and in flight (received, not yet deleted), as SQS
    counts them: approximate, and lagging by up to a minute (docs/howto/sqs.md)."""
    with translated():
        attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=list(DEPTHS))["Attributes"]
    ready, delayed, in_flight = (int(attributes.get(name, 0)) for name in DEPTHS)
    return ready, delayed, in_flight


def depths_at(target: SqsTarget, queues: Sequence[str]) -> dict[str, tuple[int, int, int]]:
    """Each queue's messages ready, delayed and dead (in its dead-letter queue), for a process that
    has no broker (the exporter); a queue that does not exist yet counts nothing."""
    client = client_for(target)
    try:
        figures = {}
        for queue in queues:
            ready, delayed, _in_flight = _depths_by_name(client, sqs_name(target.prefix, queue))
            dead_ready, _, dead_taken = _depths_by_name(client, dead_letter_name(target.prefix, queue))
            figures[queue] = (ready, delayed, dead_ready + dead_taken)
        return figures
    finally:
        client.close()


#: What SQS answers about a queue that does not exist (the JSON and the query protocols' codes).
NO_SUCH_QUEUE = frozenset({"QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"})


def queue_url(client: Any, name: str) -> str | None:
    """The URL of the queue ``name``, or ``None`` if it does not exist."""
    with translated():
        try:
            return str(client.get_queue_url(QueueName=name)["QueueUrl"])
        except botocore.exceptions.ClientError as error:
            if error_code(error) in NO_SUCH_QUEUE:
                return None
            raise


def _depths_by_name(client: Any, name: str) -> tuple[int, int, int]:
    url = queue_url(client, name)
    return (0, 0, 0) if url is None else depths(client, url)


#: Dead letters read from one dead-letter queue per sweep at most.
DEAD_LETTERS_PER_SWEEP = 500


def take_dead_letters(client: Any, url: str, handle: Callable[[bytes, str, bool], None]) -> int:
    """Hand each message of the dead-letter queue at ``url`` to ``handle(body, message_id,
    rejected)`` (``rejected``: moved there by a worker, not by SQS after too many receives);
    returns how many.

    A message is deleted only once ``handle`` returned; if it raises, the message is made
    visible again at once and the sweep stops there (the next one tries again).
    """
    taken = 0
    while taken < DEAD_LETTERS_PER_SWEEP:
        with translated():
            received = client.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=min(BATCH, DEAD_LETTERS_PER_SWEEP - taken),
                MessageAttributeNames=[REJECTED_ATTRIBUTE],
            ).get("Messages", [])
        if not received:
            break
        for index, raw in enumerate(received):
            try:
                handle(decode(raw["Body"]), raw["MessageId"], REJECTED_ATTRIBUTE in raw.get("MessageAttributes", {}))
            except Exception:
                show_again(client, url, [r["ReceiptHandle"] for r in received[index:]])
                raise
            with translated():
                client.delete_message(QueueUrl=url, ReceiptHandle=raw["ReceiptHandle"])
            taken += 1
    return taken
