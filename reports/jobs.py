"""The messages this system sends: which actor and queue, and the payload each one carries.

Payloads carry IDs and small fixed facts, never objects. Parsing is strict, because a message
that does not parse will never parse: it is a permanent failure, not something to retry.

On the wire a payload's fields travel positionally, in the order its ``ActorSpec.fields`` names
them. The bulk queue holds up to ``PLAN_HIGH_WATER`` messages in Redis, and the field names would
push every message into the allocator's next size class (docs/explanation/architecture.md).
No release ever sent named fields, so a message that carries them is malformed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from reports.errors import BadInput, InvalidPayload
from reports.periods import Period

#: Queues by priority; each has its own worker pool in the Procfile.
CRITICAL_QUEUE = "critical"
DEFAULT_QUEUE = "default"
BULK_QUEUE = "bulk"
#: Every queue, highest priority first.
QUEUES = (CRITICAL_QUEUE, DEFAULT_QUEUE, BULK_QUEUE)

#: ``users.id`` is a 32-bit integer: no user has a smaller or a larger id. 0 and negative ids are
#: users like any other.
MIN_USER_ID = -(2**31)
MAX_USER_ID = 2**31 - 1
#: A user id written as text (in a token, a Message-ID, a header): digits, a ``-`` before a
#: negative one, no leading zeros. The range is checked apart.
USER_ID_PATTERN = r"(?:0|-?[1-9][0-9]{0,9})"

#: A plain folder name: no separators, and not "." or "..".
_TEMPLATE_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")


def is_version_name(value: object) -> TypeGuard[str]:
    """Whether ``value`` can name a template folder: one path segment that cannot climb out."""
    return isinstance(value, str) and _TEMPLATE_VERSION.fullmatch(value) is not None


@dataclass(frozen=True)
class ActorSpec:
    name: str
    queue: str
    #: The payload's fields, in the order they travel as positional arguments.
    fields: tuple[str, ...]

    def arguments(self, payload: Mapping[str, Any]) -> tuple[Any, ...]:
        """``payload``'s values as the positional arguments of a message to this actor."""
        if payload.keys() != set(self.fields):
            raise ValueError(f"A {self.name} payload has the fields {list(self.fields)}, got {sorted(payload)}.")
        return tuple(payload[field] for field in self.fields)


# Actor and queue names travel inside queued messages: renaming one strands the messages already
# in Redis during a deploy, hence the coordinator's older name.
COORDINATOR = ActorSpec("plan_period", DEFAULT_QUEUE, ("period",))
BUILD_REPORT = ActorSpec("build_report", BULK_QUEUE, ("period", "user_id", "template_version"))
SEND_NOW = ActorSpec("send_report_now", CRITICAL_QUEUE, ("period", "user_id", "request_id", "template_version"))

_REQUEST_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _fields(args: Sequence[Any], kwargs: Mapping[str, Any], spec: ActorSpec) -> Mapping[str, Any]:
    if kwargs:
        raise InvalidPayload(f"Fields travel positionally, got named fields {sorted(kwargs)}.")
    if len(args) != len(spec.fields):
        raise InvalidPayload(f"Expected {len(spec.fields)} positional fields {list(spec.fields)}, got {len(args)}.")
    return dict(zip(spec.fields, args, strict=True))


def _period(value: Any) -> Period:
    if not isinstance(value, str):
        raise InvalidPayload(f"period must be a string, got {type(value).__name__}.")
    try:
        return Period.parse(value)
    except BadInput as e:
        raise InvalidPayload(str(e)) from None


def _user_id(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not MIN_USER_ID <= value <= MAX_USER_ID:
        raise InvalidPayload(f"user_id must be an integer from {MIN_USER_ID} to {MAX_USER_ID}, got {value!r}.")
    return value


def _version(value: Any) -> str:
    if not is_version_name(value):
        raise InvalidPayload(f"template_version is not a version name: {value!r}.")
    return value


@dataclass(frozen=True)
class CoordinatorJob:
    """Walk the active users of ``period`` and enqueue one report job for each."""

    period: Period

    @classmethod
    def parse(cls, args: Sequence[Any], kwargs: Mapping[str, Any]) -> CoordinatorJob:
        fields = _fields(args, kwargs, COORDINATOR)
        return cls(_period(fields["period"]))

    def payload(self) -> dict[str, Any]:
        return {"period": str(self.period)}


@dataclass(frozen=True)
class ReportJob:
    """Build, store and mail one user's report for one period, at a pinned template version."""

    period: Period
    user_id: int
    template_version: str

    @classmethod
    def parse(cls, args: Sequence[Any], kwargs: Mapping[str, Any]) -> ReportJob:
        fields = _fields(args, kwargs, BUILD_REPORT)
        return cls(_period(fields["period"]), _user_id(fields["user_id"]), _version(fields["template_version"]))

    def payload(self) -> dict[str, Any]:
        return {"period": str(self.period), "user_id": self.user_id, "template_version": self.template_version}


@dataclass(frozen=True)
class SendNowJob:
    """Send one user's report for one period now, on request; one email per ``request_id``."""

    period: Period
    user_id: int
    request_id: str
    template_version: str

    @classmethod
    def parse(cls, args: Sequence[Any], kwargs: Mapping[str, Any]) -> SendNowJob:
        fields = _fields(args, kwargs, SEND_NOW)
        request_id = fields["request_id"]
        if not isinstance(request_id, str) or not _REQUEST_ID.fullmatch(request_id):
            raise InvalidPayload(f"request_id must be a lowercase UUID, got {request_id!r}.")
        return cls(
            _period(fields["period"]), _user_id(fields["user_id"]), request_id, _version(fields["template_version"])
        )

    def payload(self) -> dict[str, Any]:
        return {
            "period": str(self.period),
            "user_id": self.user_id,
            "request_id": self.request_id,
            "template_version": self.template_version,
        }
