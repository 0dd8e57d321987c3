"""Amazon SQS in the tests: moto's server on a loopback port, a queue-name prefix of a test's own
(its queues deleted after), and what a queue holds.

The tests start moto themselves (``moto[server]``, in the test extra): one server per test
process, each test's queues kept apart by a prefix of its own in ``BROKER_URL``.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import dramatiq

from reports.endpoints import SqsTarget
from reports.settings import Settings
from reports.worker import sqs
from reports.worker.broker import build_broker
from tests.support.environment import missing

#: The region every test's BROKER_URL names; moto accepts any.
REGION = "us-east-1"

#: What boto3 needs to sign a call: moto takes any credentials. Set for every test on SQS (and so
#: for the processes it starts), so real ones in the environment never reach the loopback server.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    # Nothing to ask an instance for its role: the credentials above are all there is.
    "AWS_EC2_METADATA_DISABLED": "true",
}


@contextlib.contextmanager
def moto_server(requests: Counter[str] | None = None) -> Iterator[str]:
    """moto's SQS (and the rest of AWS) on a free loopback port, in a thread; yields its endpoint URL.

    :param requests: counts each request it answers by SQS action (``SendMessageBatch``…), as SQS
        would bill them (the benchmarks').
    """
    try:
        from moto.moto_server.threaded_moto_server import ThreadedMotoServer
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server
    except ImportError as error:
        missing(f"moto[server] is not installed ({error}): pip install -r requirements.lock")
    # One line per request on stderr otherwise.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    _fit_moto()

    class Server(ThreadedMotoServer):  # type: ignore[misc]
        def _server_entry(self) -> None:
            # ThreadedMotoServer's own, with the application wrapped in the count.
            app = DomainDispatcherApplication(create_backend_app)

            def counted(environ: dict[str, Any], start_response: Any) -> Any:
                if requests is not None:
                    requests[environ.get("HTTP_X_AMZ_TARGET", "other").rpartition(".")[2]] += 1
                return app(environ, start_response)

            self._server = make_server(self._ip_address, self._port, counted, True, request_handler=MotoRequestHandler)
            self._server_ready_event.set()
            self._server.serve_forever()

    server = Server(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def _fit_moto() -> None:
    """Make moto's SQS answer in time independent of a queue's length, as SQS does, and lose no
    message sent while another is deleted; what it answers is unchanged.

    moto 5 builds every attribute of a queue, three counts over all its messages among them, on
    each message sent (to read one flag), and reads the clock through ``datetime`` arithmetic
    twice per message and count: a 50,000-message backlog would take hours to send. Here a
    queue's attributes are read one by one when asked for, and the clock is ``time.time()``.
    And its delete rebuilds the queue's list of messages without the lock its send appends under,
    so a message sent meanwhile is lost (seen: ten of 2,000 in a benchmark); here the delete
    takes that lock.
    """
    import moto.sqs.models as models

    if getattr(models, "_reports_fitted", False):
        return
    _unix_time, _delete = models.unix_time, models.Queue.delete_message

    def unix_time(dt: datetime.datetime | None = None) -> float:
        return time.time() if dt is None else _unix_time(dt)

    def unix_time_millis(dt: datetime.datetime | None = None) -> float:
        return unix_time(dt) * 1000.0

    def delete_message(queue: Any, receipt_handle: str) -> None:
        with queue._messages_lock:
            _delete(queue, receipt_handle)

    models.unix_time, models.unix_time_millis = unix_time, unix_time_millis
    models.Queue.attributes = property(_LazyAttributes)
    models.Queue.delete_message = delete_message
    models._reports_fitted = True


class _LazyAttributes(Mapping[str, Any]):
    """moto's ``Queue.attributes`` with each value read when asked for (the same names and values)."""

    def __init__(self, queue: Any) -> None:
        self._queue = queue
        self._names = list(queue.BASE_ATTRIBUTES)
        if queue.fifo_queue:
            self._names += queue.FIFO_ATTRIBUTES
        if queue.kms_master_key_id:
            self._names += queue.KMS_ATTRIBUTES

    def __getitem__(self, name: str) -> Any:
        if name not in self._names:
            raise KeyError(name)
        from moto.core.utils import camelcase_to_underscores

        value = getattr(self._queue, camelcase_to_underscores(name))
        if name == "RedrivePolicy" and value:
            return json.dumps(value)
        return str(value).lower() if isinstance(value, bool) else value

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


@contextlib.contextmanager
def temporary_prefix(endpoint: str) -> Iterator[str]:
    """A BROKER_URL on ``endpoint`` with a queue-name prefix ``test-<12 hex>``; every queue of that
    prefix is deleted after."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    url = f"sqs://{REGION}/{prefix}?endpoint_url={endpoint}"
    try:
        yield url
    finally:
        client = sqs.client_for(SqsTarget.from_url(url))
        for queue_url in client.list_queues(QueueNamePrefix=prefix).get("QueueUrls", []):
            client.delete_queue(QueueUrl=queue_url)
        client.close()


@contextlib.contextmanager
def _client(broker_url: str) -> Iterator[Any]:
    client = sqs.client_for(SqsTarget.from_url(broker_url))
    try:
        yield client
    finally:
        client.close()


def _url(client: Any, name: str) -> str | None:
    urls = client.list_queues(QueueNamePrefix=name).get("QueueUrls", [])
    return next((url for url in urls if url.rsplit("/", 1)[-1] == name), None)


def queue_depths(broker_url: str, queue: str) -> tuple[int, int, int, int]:
    """Messages of ``queue`` ready, delayed, in flight (received, not deleted) and in its
    dead-letter queue; 0 for a queue that does not exist (yet)."""
    target = SqsTarget.from_url(broker_url)
    with _client(broker_url) as client:
        url = _url(client, sqs.sqs_name(target.prefix, queue))
        dead_url = _url(client, sqs.dead_letter_name(target.prefix, queue))
        ready, delayed, in_flight = sqs.depths(client, url) if url else (0, 0, 0)
        dead = sum(sqs.depths(client, dead_url)) if dead_url else 0
    return ready, delayed, in_flight, dead


def send_raw(settings: Settings, queue: str, body: str) -> str:
    """Put ``body`` on ``queue`` past the broker's enqueue and middleware, as another producer
    would (the queue made as the workers make it); its SQS message id."""
    broker = build_broker(settings)
    try:
        answer = broker.client.send_message(QueueUrl=broker.url_of(queue), MessageBody=body)
    finally:
        broker.close()
    return str(answer["MessageId"])


def take_all(broker_url: str, queue: str) -> list[dramatiq.Message[Any]]:
    """Receive and delete every ready message of ``queue``, as consumers would; the messages, decoded."""
    target, taken = SqsTarget.from_url(broker_url), []
    with _client(broker_url) as client:
        url = _url(client, sqs.sqs_name(target.prefix, queue))
        while url and (received := client.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages")):
            taken += [dramatiq.Message.decode(sqs.decode(raw["Body"])) for raw in received]
            entries = [{"Id": str(i), "ReceiptHandle": raw["ReceiptHandle"]} for i, raw in enumerate(received)]
            client.delete_message_batch(QueueUrl=url, Entries=entries)
    return taken


def purge(broker_url: str, queue: str) -> int:
    """Drop every message of ``queue``, as an operator's PurgeQueue would; how many were ready."""
    target = SqsTarget.from_url(broker_url)
    with _client(broker_url) as client:
        url = _url(client, sqs.sqs_name(target.prefix, queue))
        if url is None:
            return 0
        ready, _delayed, _in_flight = sqs.depths(client, url)
        client.purge_queue(QueueUrl=url)
        return ready
