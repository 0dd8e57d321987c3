"""A message that died: everything known about it at that moment, as the dead-letter store keeps it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reports.models import DeadLetterReason


@dataclass(frozen=True)
class DeadMessage:
    """Everything known about a message at the moment it died."""

    message_id: str
    actor: str
    queue: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    attempts: int
    reason: DeadLetterReason
    error_class: str
    error_message: str
    traceback: str
    first_failed_ms: int
    died_ms: int
