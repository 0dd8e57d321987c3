"""A process that finds a queue of the other type than RABBITMQ_QUEUE_TYPE refuses at start in one
line, exit code 2, and declares nothing: the workers and the scheduler before their first
declaration, a command at its first."""

from __future__ import annotations

import sys
from dataclasses import replace

import pika
import pytest

from tests.support.processes import run_process
from tests.support.rabbitmq import queue_types

pytestmark = [pytest.mark.acceptance, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "dramatiq", "actors", "--processes", "1", "--threads", "1"],
        [sys.executable, "-m", "scheduler"],
        [sys.executable, "-m", "reports", "trigger", "2026-10"],
    ],
    ids=["workers", "scheduler", "trigger"],
)
def test_a_process_refuses_a_queue_of_the_other_type_in_one_line_and_declares_nothing(
    settings, sessions, rabbitmq_url, command
):
    # The coordinator's queue, as a release before RABBITMQ_QUEUE_TYPE declared it: classic.
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    connection.channel().queue_declare(
        "default", durable=True, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "default.XQ"}
    )
    connection.close()
    settings = replace(
        settings, broker_url=rabbitmq_url, redis_url=settings.shared_redis_url, rabbitmq_queue_type="quorum"
    )

    result = run_process(settings, command)

    described = f"exit {result.returncode}\nstdout: {result.stdout!r}\nstderr: {result.stderr!r}"
    assert result.returncode == 2, described
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert errors == [
        "error: RABBITMQ_QUEUE_TYPE is quorum, but RabbitMQ already has the queue 'default' (vhost "
        f"'{rabbitmq_url.rsplit('/', 1)[1]}') as a classic queue, and a queue's type is fixed when it is declared: "
        "set RABBITMQ_QUEUE_TYPE=classic, or drain and delete the queue first (Run on RabbitMQ, 'Change the queue type')."
    ], described
    assert "Traceback" not in result.stderr, described
    assert queue_types(rabbitmq_url) == {"default": "classic"}
