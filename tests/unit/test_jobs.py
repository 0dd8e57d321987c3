"""Message payloads: strict parsing into jobs (a payload that does not parse never will)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reports.errors import InvalidPayload, PermanentError
from reports.jobs import BUILD_REPORT, CoordinatorJob, ReportJob
from reports.periods import Period


def report_payload(**overrides: Any) -> dict[str, Any]:
    return {"period": "2026-10", "user_id": 42, "template_version": "v1", **overrides}


def report_args(**overrides: Any) -> tuple[Any, ...]:
    """A report payload's fields as they travel: positionally, in the spec's order."""
    return tuple(report_payload(**overrides).values())


# --- ReportJob -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "period", "user_id", "version"),
    [
        (report_payload(), Period(2026, 10), 42, "v1"),
        (report_payload(user_id=1), Period(2026, 10), 1, "v1"),
        (report_payload(user_id=2**31 - 1), Period(2026, 10), 2**31 - 1, "v1"),
        (
            report_payload(period="2025-12", template_version="v2.1-beta_3"),
            Period(2025, 12),
            42,
            "v2.1-beta_3",
        ),
        (report_payload(template_version="x" * 32), Period(2026, 10), 42, "x" * 32),
    ],
)
def test_a_valid_report_payload_is_parsed(payload: dict[str, Any], period: Period, user_id: int, version: str) -> None:
    job = ReportJob.parse(tuple(payload.values()), {})
    assert job == ReportJob(period=period, user_id=user_id, template_version=version)


def test_a_payload_with_named_fields_is_rejected_as_malformed() -> None:
    with pytest.raises(InvalidPayload, match="Fields travel positionally, got named fields"):
        ReportJob.parse((), report_payload())


def test_a_user_id_beyond_the_users_id_column_is_rejected() -> None:
    with pytest.raises(InvalidPayload, match="user_id"):
        ReportJob.parse(report_args(user_id=2**31), {})


def test_an_empty_report_payload_is_rejected() -> None:
    with pytest.raises(InvalidPayload, match="Expected 3 positional fields"):
        ReportJob.parse((), {})


@pytest.mark.parametrize(
    "user_id",
    [
        pytest.param(True, id="true"),
        pytest.param(False, id="false"),
        pytest.param("42", id="numeric-string"),
        pytest.param(-(2**31) - 1, id="below-32-bits"),
        pytest.param(42.0, id="float"),
        pytest.param(None, id="none"),
        pytest.param([42], id="list"),
    ],
)
def test_a_user_id_that_is_not_a_32_bit_integer_is_rejected(user_id: object) -> None:
    with pytest.raises(InvalidPayload, match="user_id must be an integer from -2147483648 to 2147483647"):
        ReportJob.parse(report_args(user_id=user_id), {})


@pytest.mark.parametrize("user_id", [0, -5, -(2**31)])
def test_a_zero_or_negative_user_id_is_a_user_like_any_other(user_id: int) -> None:
    assert ReportJob.parse(report_args(user_id=user_id), {}).user_id == user_id


def test_positional_fields_parse_in_the_order_the_actor_spec_names() -> None:
    assert ReportJob.parse(("2026-10", 42, "v1"), {}) == ReportJob(Period(2026, 10), 42, "v1")


def test_fields_both_positional_and_named_are_rejected() -> None:
    with pytest.raises(InvalidPayload, match="named fields"):
        ReportJob.parse(("2026-10",), {"user_id": 42, "template_version": "v1"})


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("2026-10",), id="too-few"),
        pytest.param(("2026-10", 42, "v1", "extra"), id="too-many"),
    ],
)
def test_a_wrong_number_of_positional_fields_is_rejected(args: tuple[Any, ...]) -> None:
    with pytest.raises(InvalidPayload, match="Expected 3 positional fields"):
        ReportJob.parse(args, {})


def test_a_payload_travels_as_positional_arguments_and_parses_back() -> None:
    job = ReportJob(Period(2026, 10), 42, "v1")
    args = BUILD_REPORT.arguments(job.payload())
    assert args == ("2026-10", 42, "v1")
    assert ReportJob.parse(tuple(json.loads(json.dumps(args))), {}) == job


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param({"period": "2026-10", "user_id": 42}, id="missing-field"),
        pytest.param({**report_payload(), "email": "someone@example.com"}, id="extra-field"),
    ],
)
def test_a_payload_without_exactly_the_specs_fields_is_not_sent(payload: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="build_report payload has the fields"):
        BUILD_REPORT.arguments(payload)


@pytest.mark.parametrize("period", ["2026-13", "2026-1", "26-10", "", 202610, None, ["2026-10"]])
def test_a_report_payload_with_a_malformed_period_is_rejected(period: object) -> None:
    with pytest.raises(InvalidPayload):
        ReportJob.parse(report_args(period=period), {})


@pytest.mark.parametrize(
    "version",
    [
        pytest.param("../x", id="parent-then-name"),
        pytest.param("..", id="parent"),
        pytest.param(".", id="current-folder"),
        pytest.param("a/b", id="slash"),
        pytest.param("/etc", id="absolute"),
        pytest.param("a\\b", id="backslash"),
        pytest.param("v1/", id="trailing-slash"),
        pytest.param("v1\n", id="trailing-newline"),
        pytest.param("v 1", id="space"),
        pytest.param("", id="empty"),
        pytest.param("x" * 33, id="too-long"),
        pytest.param(None, id="none"),
        pytest.param(1, id="integer"),
    ],
)
def test_a_template_version_that_is_not_a_plain_folder_name_is_rejected(version: object) -> None:
    with pytest.raises(InvalidPayload, match="template_version"):
        ReportJob.parse(report_args(template_version=version), {})


def test_an_invalid_payload_is_a_permanent_failure() -> None:
    with pytest.raises(PermanentError):
        ReportJob.parse(report_args(user_id=2**31), {})


@pytest.mark.parametrize(
    "job",
    [
        ReportJob(period=Period(2026, 10), user_id=42, template_version="v1"),
        ReportJob(period=Period(1970, 1), user_id=1, template_version="v2.0"),
        ReportJob(period=Period(2026, 12), user_id=987654321, template_version="release_2026-10"),
    ],
)
def test_a_report_payload_round_trips_through_json_and_parse(job: ReportJob) -> None:
    payload = json.loads(json.dumps(job.payload()))
    assert payload == {
        "period": str(job.period),
        "user_id": job.user_id,
        "template_version": job.template_version,
    }
    assert ReportJob.parse(BUILD_REPORT.arguments(payload), {}) == job


# --- CoordinatorJob ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "period"), [("2026-10", Period(2026, 10)), ("1970-01", Period(1970, 1))])
def test_a_valid_plan_payload_is_parsed(text: str, period: Period) -> None:
    assert CoordinatorJob.parse((text,), {}) == CoordinatorJob(period)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        pytest.param((), {}, "Expected 1 positional", id="missing-period"),
        pytest.param((), {"period": "2026-10"}, "named fields \\['period'\\]", id="named"),
        pytest.param(("2026-10",), {"period": "2026-10"}, "named fields", id="positional-and-named"),
        pytest.param(("2026-10", 1), {}, "Expected 1 positional", id="too-many-positional"),
        pytest.param(("2026-13",), {}, "2026-13", id="month-13"),
        pytest.param(("2026/10",), {}, "2026/10", id="slash"),
        pytest.param((202610,), {}, "period must be a string", id="integer"),
        pytest.param((None,), {}, "period must be a string", id="none"),
    ],
)
def test_an_invalid_plan_payload_is_rejected(args: tuple[Any, ...], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidPayload, match=message):
        CoordinatorJob.parse(args, kwargs)


@pytest.mark.parametrize("period", [Period(2026, 10), Period(2026, 1), Period(1999, 12)])
def test_a_plan_payload_round_trips_through_json_and_parse(period: Period) -> None:
    job = CoordinatorJob(period)
    payload = json.loads(json.dumps(job.payload()))
    assert payload == {"period": str(period)}
    assert CoordinatorJob.parse((payload["period"],), {}) == job
