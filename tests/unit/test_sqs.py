"""The SQS broker's pure parts: BROKER_URL=sqs://… read and refused, the settings it needs, delays
beyond SQS's 15 minutes cut in steps, message bodies, and which errors are worth trying again."""

from __future__ import annotations

import base64

import botocore.exceptions
import dramatiq
import pytest

from reports.endpoints import SqsTarget
from reports.errors import ConfigurationError, ReportsError
from reports.settings import Settings
from reports.worker import sqs

SHARED = {"REDIS_URL": "redis://127.0.0.1:6379/0"}


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("sqs://us-east-1", SqsTarget("us-east-1", "", None)),
        ("sqs://eu-central-1/", SqsTarget("eu-central-1", "", None)),
        ("sqs://us-gov-west-1/reports_prod-2", SqsTarget("us-gov-west-1", "reports_prod-2", None)),
        (
            "sqs://ap-southeast-4/r?endpoint_url=https://vpce-1.sqs.ap-southeast-4.vpce.amazonaws.com",
            SqsTarget("ap-southeast-4", "r", "https://vpce-1.sqs.ap-southeast-4.vpce.amazonaws.com"),
        ),
        (
            "sqs://us-east-1/t?endpoint_url=http://127.0.0.1:4566",
            SqsTarget("us-east-1", "t", "http://127.0.0.1:4566"),
        ),
    ],
)
def test_an_sqs_broker_url_names_the_region_the_prefix_and_the_endpoint(url: str, target: SqsTarget) -> None:
    assert SqsTarget.from_url(url) == target
    settings = Settings.from_env({"BROKER_URL": url, **SHARED})
    assert settings.broker_is_sqs and not settings.broker_is_rabbitmq


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sqs://", "an AWS region"),
        ("sqs://US-EAST-1", "an AWS region"),
        ("sqs://useast1", "an AWS region"),
        ("sqs://us-east-1:443", "an AWS region"),
        ("sqs://us-east-1/a/b", "a prefix of letters"),
        ("sqs://us-east-1/a.b", "a prefix of letters"),
        (f"sqs://us-east-1/{'p' * 61}", "at most 60"),
        ("sqs://AKIA:s3cret@us-east-1", "must not carry credentials"),
        ("sqs://us-east-1?region=eu-west-1", "takes only ?endpoint_url="),
        ("sqs://us-east-1?endpoint_url=https://a&endpoint_url=https://b", "takes only ?endpoint_url="),
        ("sqs://us-east-1?endpoint_url=sqs.us-east-1.amazonaws.com", "must be an https:// URL"),
        ("sqs://us-east-1?endpoint_url=http://sqs.internal.example", "plain http:// only to"),
    ],
)
def test_a_malformed_sqs_broker_url_is_refused_in_one_line_without_its_secret(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        Settings.from_env({"BROKER_URL": url, **SHARED})
    message = str(refused.value)
    assert message.startswith("BROKER_URL") and says in message and "\n" not in message
    assert "s3cret" not in message


def test_sqs_needs_a_redis_for_the_shared_state() -> None:
    with pytest.raises(ConfigurationError, match="REDIS_URL is required when BROKER_URL is RabbitMQ or SQS"):
        Settings.from_env({"BROKER_URL": "sqs://us-east-1"})


def test_on_sqs_the_visibility_timeout_must_outlast_the_claims_lease() -> None:
    environment = {"BROKER_URL": "sqs://us-east-1", **SHARED, "CLAIM_LEASE_SECONDS": "30"}
    assert Settings.from_env({**environment, "SQS_VISIBILITY_TIMEOUT_SECONDS": "30"}).claim_lease_seconds == 30
    with pytest.raises(ConfigurationError, match=r"SQS_VISIBILITY_TIMEOUT_SECONDS \(29\) must be at least CLAIM_LEASE"):
        Settings.from_env({**environment, "SQS_VISIBILITY_TIMEOUT_SECONDS": "29"})
    # Another broker has no visibility timeout to compare.
    assert Settings.from_env({"CLAIM_LEASE_SECONDS": "120"}).sqs_visibility_timeout_seconds == 60


NOW_MS = 1_800_000_000_000


def _message(**options: object) -> dramatiq.Message[object]:
    return dramatiq.Message(queue_name="bulk", actor_name="build_report", args=(), kwargs={}, options=dict(options))


@pytest.mark.parametrize(
    ("delay_ms", "seconds", "due_ms"),
    [
        (None, 0, None),
        (0, 0, None),
        # Rounded up: a message deferred until a lease ends never runs before it.
        (1, 1, None),
        (1_001, 2, None),
        (900_000, 900, None),
        # Beyond 15 minutes: 15 minutes now, and the rest when it comes back.
        (900_001, 900, NOW_MS + 900_001),
        (3_600_000, 900, NOW_MS + 3_600_000),
    ],
)
def test_a_delay_is_sent_whole_up_to_15_minutes_and_in_steps_beyond(
    delay_ms: int | None, seconds: int, due_ms: int | None
) -> None:
    message = _message(retries=3)
    sent, delay_seconds = sqs.stepped(message, delay_ms, now_ms=NOW_MS, step_seconds=sqs.MAX_DELAY_SECONDS)
    assert delay_seconds == seconds
    assert sent.options.get(sqs.DUE_OPTION) == due_ms
    assert sent.options["retries"] == 3 and sent.message_id == message.message_id
    assert sqs.DUE_OPTION not in message.options, "the caller's message is left as it was"


def test_an_hour_long_retry_arrives_after_an_hour_in_steps_not_after_15_minutes() -> None:
    """What the retry budget rests on: every step but the last is sent on for what is left."""
    now, steps, due = NOW_MS, [], NOW_MS + 3_600_000
    message, seconds = sqs.stepped(_message(), 3_600_000, now_ms=now, step_seconds=sqs.MAX_DELAY_SECONDS)
    while True:
        steps.append(seconds)
        now += seconds * 1000
        left = sqs.remaining_ms(message, now_ms=now)
        if left == 0:
            break
        message, seconds = sqs.stepped(message, left, now_ms=now, step_seconds=sqs.MAX_DELAY_SECONDS)
    assert steps == [900, 900, 900, 900] and now == due


def test_a_step_sent_on_for_a_short_rest_carries_no_due_time() -> None:
    stepped, _ = sqs.stepped(_message(), 2_000_000, now_ms=NOW_MS, step_seconds=900)
    again, seconds = sqs.stepped(stepped, 500, now_ms=NOW_MS, step_seconds=900)
    assert (seconds, sqs.DUE_OPTION in again.options) == (1, False)
    assert sqs.remaining_ms(again, now_ms=NOW_MS) == 0


def test_a_body_is_the_message_in_base64_as_dramatiq_sqs_sends_it_and_any_other_body_is_its_own_bytes() -> None:
    message = _message()
    assert dramatiq.Message.decode(sqs.decode(sqs.encode(message))) == message
    assert sqs.decode(base64.b64encode(b"\xff\xfe{").decode()) == b"\xff\xfe{"
    assert sqs.decode("not json") == b"not json"


def _client_error(code: str, status: int) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": "…"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "SendMessage"
    )


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (botocore.exceptions.EndpointConnectionError(endpoint_url="https://sqs"), True),
        (botocore.exceptions.ReadTimeoutError(endpoint_url="https://sqs"), True),
        (_client_error("InternalError", 500), True),
        (_client_error("ServiceUnavailable", 503), True),
        (_client_error("RequestThrottled", 400), True),
        (_client_error("AccessDenied", 403), False),
        (_client_error("InvalidParameterValue", 400), False),
        (_client_error("QueueDoesNotExist", 400), False),
        (ValueError("not an SQS error"), False),
    ],
)
def test_only_an_unreachable_or_busy_sqs_is_tried_again(error: Exception, transient: bool) -> None:
    assert sqs.is_transient(error) is transient


def test_an_unreachable_sqs_is_dramatiqs_connection_error_and_a_refusal_says_what_to_check() -> None:
    unreachable = pytest.raises(dramatiq.errors.ConnectionClosed, match=r"EndpointConnectionError\): is BROKER_URL")
    with unreachable, sqs.translated():
        raise botocore.exceptions.EndpointConnectionError(endpoint_url="https://sqs")
    refused = pytest.raises(sqs.SqsRefused, match=r"SQS refused SendMessage \(AccessDenied\): check the IAM policy")
    with refused, sqs.translated():
        raise _client_error("AccessDenied", 403)
    # Both are this project's errors, which a command prints in one line.
    assert issubclass(sqs.SqsUnreachable, ReportsError) and issubclass(sqs.SqsRefused, ReportsError)


def test_the_queues_are_named_as_dramatiq_sqs_names_them() -> None:
    assert (sqs.sqs_name("prod", "bulk"), sqs.dead_letter_name("prod", "bulk")) == ("prod_bulk", "prod_bulk_dlq")
    assert (sqs.sqs_name("", "bulk"), sqs.dead_letter_name("", "bulk")) == ("bulk", "bulk_dlq")
