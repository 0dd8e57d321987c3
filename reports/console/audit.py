"""The console's audit trail: every login and action, with who did it, in ``console_audit``."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from reports.models import ConsoleAudit

logger = logging.getLogger(__name__)

#: Longest target or outcome kept, in characters.
TEXT_LIMIT = 2000


def record(session: Session, *, actor: str, action: str, target: str, outcome: str, now: datetime) -> None:
    """Add one entry, in the caller's transaction: an action and its record commit together."""
    session.add(
        ConsoleAudit(at=now, actor=actor, action=action, target=target[:TEXT_LIMIT], outcome=outcome[:TEXT_LIMIT])
    )
    logger.info("Console: %s by %s on %s.", action, actor, target, extra={"console_user": actor, "action": action})


def page(session: Session, *, before: int | None, limit: int) -> list[ConsoleAudit]:
    """Up to ``limit`` entries, newest first, with an id below ``before`` when given (a keyset page)."""
    statement = select(ConsoleAudit)
    if before is not None:
        statement = statement.where(ConsoleAudit.id < before)
    return list(session.scalars(statement.order_by(ConsoleAudit.id.desc()).limit(limit)))
