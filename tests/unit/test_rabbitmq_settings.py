"""RabbitMQ's settings: the queue type, a cluster's nodes in BROKER_URL, and their redaction; how
a refusal of RabbitMQ's names a queue's type."""

from __future__ import annotations

import pytest

from reports.endpoints import redact_url
from reports.errors import ConfigurationError
from reports.settings import Settings
from reports.worker.queue_types import current_type

REDIS = {"REDIS_URL": "redis://127.0.0.1:6379/0"}
NODES = "amqp://app:s3cret-a@rabbit-a:5672/reports;amqp://app:s3cret-b@rabbit-b:5672/reports"


def test_queues_are_classic_unless_told_otherwise() -> None:
    assert Settings.from_env({}).rabbitmq_queue_type == "classic"
    assert Settings.from_env({"RABBITMQ_QUEUE_TYPE": "quorum"}).rabbitmq_queue_type == "quorum"


@pytest.mark.parametrize("value", ["Quorum", "stream", "mirrored", " quorum"])
def test_a_queue_type_rabbitmq_has_no_such_queue_for_is_refused_in_one_line(value: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        Settings.from_env({"RABBITMQ_QUEUE_TYPE": value})
    assert str(refused.value) == f"RABBITMQ_QUEUE_TYPE must be one of classic, quorum, got {value!r}."


@pytest.mark.parametrize(
    "url",
    [
        NODES,
        "amqps://app:pw@a.example.com:5671/reports;amqps://app:pw@b.example.com:5671/reports;amqp://app:pw@c:5672/reports",
        # The default vhost, written three ways.
        "amqp://guest:guest@a:5672;amqp://guest:guest@b:5672/;amqp://guest:guest@c:5672/%2F",
    ],
)
def test_a_clusters_nodes_separated_by_semicolons_are_accepted(url: str) -> None:
    assert Settings.from_env({"BROKER_URL": url, **REDIS}).broker_url == url


@pytest.mark.parametrize(
    "url",
    [
        "amqp://app:s3cret-a@rabbit-a:5672/reports;redis://:s3cret-b@rabbit-b:6379/0",
        "amqp://app:s3cret-a@rabbit-a:5672/reports;amqp:///reports",
        "amqp://app:s3cret-a@rabbit-a:5672/reports;",
    ],
)
def test_a_node_that_is_not_an_amqp_url_with_a_host_is_refused_without_any_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        Settings.from_env({"BROKER_URL": url, **REDIS})
    assert str(refused.value).startswith("BROKER_URL must name each RabbitMQ node as amqp://")
    assert "s3cret" not in str(refused.value)


def test_nodes_naming_different_vhosts_are_refused() -> None:
    url = "amqp://app:s3cret@rabbit-a:5672/reports;amqp://app:s3cret@rabbit-b:5672/other"
    with pytest.raises(ConfigurationError, match="must all name the same vhost") as refused:
        Settings.from_env({"BROKER_URL": url, **REDIS})
    assert "s3cret" not in str(refused.value)


def test_every_nodes_password_is_redacted_and_every_host_kept() -> None:
    assert redact_url(NODES) == "amqp://app:***@rabbit-a:5672/reports;amqp://app:***@rabbit-b:5672/reports"
    settings = Settings.from_env({"BROKER_URL": NODES, **REDIS})
    assert "s3cret" not in repr(settings)


@pytest.mark.parametrize(
    ("reply_text", "existing"),
    [
        # What RabbitMQ 3.10 answers, from tests/integration/test_rabbitmq_queue_types.py's cases.
        (
            "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'bulk' in vhost 'v': "
            "received the value 'quorum' of type 'longstr' but current is none",
            "classic",
        ),
        (
            "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'bulk' in vhost 'v': "
            "received none but current is the value 'quorum' of type 'longstr'",
            "quorum",
        ),
        (
            "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'bulk' in vhost 'v': "
            "received 'classic' but current is 'quorum'",
            "quorum",
        ),
        (
            "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'bulk' in vhost 'v': "
            "received 'quorum' but current is 'stream'",
            "stream",
        ),
    ],
)
def test_the_type_a_queue_has_is_read_from_rabbitmqs_refusal(reply_text: str, existing: str) -> None:
    assert current_type(reply_text) == existing
