"""RabbitMQ: a vhost of one's own, deleted after; how many messages wait in a queue.

Dramatiq's RabbitMQ broker names its queues plainly (``bulk``, ``bulk.DQ``, ``bulk.XQ``) with no
namespace, so tests that share one RabbitMQ node are kept apart by a vhost each instead.

Vhosts are made and deleted with ``rabbitmqctl``, which manages the node on this machine (the one
``RABBITMQ_NODENAME`` names, by default ``rabbit@<host>``), not necessarily the host in the URL:
``TEST_RABBITMQ_URL`` should point at that same node. Each call takes about half a second, so a
vhost costs three of them (add, permit, delete) and nothing more.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import pika
import pika.exceptions

from tests.support.environment import RABBITMQ_URL, missing, unavailable

#: Seconds one ``rabbitmqctl`` call may take; it answers in well under one on a running node.
RABBITMQCTL_TIMEOUT = 30
#: Seconds a connection to RabbitMQ may take to open before the node counts as unreachable.
CONNECT_TIMEOUT = 5


def _rabbitmqctl(*args: str) -> str:
    """Run one ``rabbitmqctl`` command and return its output; a failure raises ``RuntimeError``
    with what it printed."""
    try:
        return subprocess.run(
            ["rabbitmqctl", *args], check=True, capture_output=True, text=True, timeout=RABBITMQCTL_TIMEOUT
        ).stdout
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)} took over {RABBITMQCTL_TIMEOUT} s") from e
    except subprocess.CalledProcessError as e:
        output = (e.stderr or e.stdout or "").strip()
        raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed (exit {e.returncode}): {output}") from e


def _parameters(url: str) -> pika.URLParameters:
    parameters = pika.URLParameters(url)
    parameters.socket_timeout = CONNECT_TIMEOUT
    parameters.blocked_connection_timeout = CONNECT_TIMEOUT
    parameters.connection_attempts = 1
    return parameters


def _check_reachable(url: str) -> None:
    """Open and close one connection, so a stopped node is told apart (and told fast)."""
    try:
        pika.BlockingConnection(_parameters(url)).close()
    except pika.exceptions.AMQPError as e:
        # pika's AMQPConnectionError prints as nothing; its repr names the error it carries.
        reason = e if str(e) else ConnectionError(repr(e))
        unavailable(f"RabbitMQ at {urlsplit(url).hostname}:{urlsplit(url).port or 5672}", reason)


@contextlib.contextmanager
def temporary_vhost(admin_url: str = RABBITMQ_URL) -> Iterator[str]:
    """Create an empty vhost ``test-<12 hex>`` that the URL's user may use; yield its amqp URL
    (same scheme, user, host and port as ``admin_url``); delete it, with its queues, after.

    An unreachable node, a missing ``rabbitmqctl`` or one that cannot make the vhost skips the test
    locally and fails it in CI. Once the vhost is made, a ``rabbitmqctl`` failure is an error.
    """
    _check_reachable(admin_url)
    if shutil.which("rabbitmqctl") is None:
        missing("rabbitmqctl is not installed (Debian package rabbitmq-server)")
    parts = urlsplit(admin_url)
    user = unquote(parts.username or "guest")
    vhost = f"test-{uuid.uuid4().hex[:12]}"
    try:
        _rabbitmqctl("add_vhost", vhost)
    except RuntimeError as e:
        # The node answers AMQP but not this CLI (another node, or no access to its Erlang cookie).
        unavailable("RabbitMQ through rabbitmqctl", e)
    try:
        _rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
        yield urlunsplit(parts._replace(path="/" + quote(vhost, safe="")))
    finally:
        _rabbitmqctl("delete_vhost", vhost)


def queue_depths(url: str, queue: str) -> tuple[int, int, int]:
    """Messages ready in ``queue``, in its delay queue ``queue.DQ`` and in its dead-letter queue
    ``queue.XQ`` (Dramatiq's names), in the vhost of ``url``; 0 for a queue that does not exist.

    Ready only: messages a consumer holds unacknowledged are not counted.
    """
    connection = pika.BlockingConnection(_parameters(url))
    try:
        channel = connection.channel()
        depths = []
        for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
            try:
                depths.append(channel.queue_declare(name, passive=True).method.message_count)
            except pika.exceptions.ChannelClosedByBroker as e:
                if e.reply_code != 404:
                    raise
                # The broker closes the channel on a passive declare of a missing queue.
                depths.append(0)
                channel = connection.channel()
        return depths[0], depths[1], depths[2]
    finally:
        connection.close()


def purge(url: str, queue: str) -> int:
    """Drop every ready message of ``queue`` (not those a consumer holds), as a lost node or an
    operator's mistake would; how many were dropped."""
    connection = pika.BlockingConnection(_parameters(url))
    try:
        return int(connection.channel().queue_purge(queue).method.message_count)
    finally:
        connection.close()


def queue_types(url: str) -> dict[str, str]:
    """Every queue of the vhost of ``url`` and its type (``classic``, ``quorum``), as RabbitMQ lists them."""
    vhost = unquote(urlsplit(url).path[1:]) or "/"
    listed = _rabbitmqctl("list_queues", "-q", "-p", vhost, "name", "type", "--formatter", "json")
    return {row["name"]: row["type"] for row in json.loads(listed)}


def set_policy(url: str, pattern: str, definition: str) -> None:
    """A policy named ``test`` on the vhost of ``url``: ``definition`` (JSON) for the queues ``pattern`` matches."""
    vhost = unquote(urlsplit(url).path[1:]) or "/"
    _rabbitmqctl("set_policy", "-p", vhost, "--apply-to", "queues", "test", pattern, definition)
