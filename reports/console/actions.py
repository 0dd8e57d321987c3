"""The console's actions, admins only, each through the library call its ``reports`` command makes,
and each recorded in the audit trail with its outcome (a refusal or a failure too)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from reports.clock import utcnow
from reports.console import audit, inputs
from reports.console.app import Console, acting, back
from reports.console_settings import ConsoleUser
from reports.errors import BadInput, SendNowNotEnqueued
from reports.failures import dead_letters
from reports.fanout import runs
from reports.ops import send_now, suppressing
from reports.periods import parse_closed

#: Most dead letters one replay from the console takes: beyond it, narrow the filter (or use
#: ``reports dlq replay``, which shows its count with ``--dry-run`` first).
REPLAY_CAP = 10_000


def routes(console: Console) -> list[BaseRoute]:
    return [
        Route("/periods", acting(console, trigger), methods=["POST"]),
        Route("/periods/{period}/cancel", acting(console, cancel), methods=["POST"]),
        Route("/dead-letters/{id}/replay", acting(console, replay_one), methods=["POST"]),
        Route("/dead-letters/replay", acting(console, replay_matching), methods=["POST"]),
        Route("/send-now", acting(console, send_report_now), methods=["POST"]),
        Route("/suppressions", acting(console, suppress), methods=["POST"]),
        Route("/suppressions/{user_id}/remove", acting(console, unsuppress), methods=["POST"]),
    ]


def _audited(
    console: Console, user: ConsoleUser, action: str, target: str, work: Callable[[], str]
) -> tuple[str, bool]:
    """Run ``work`` and record its outcome line (or its refusal, or its failure); the line, and
    whether it ran."""
    try:
        outcome, done = work(), True
    except BadInput as e:
        outcome, done = f"refused: {e}", False
    except Exception as e:
        # Recorded, then raised (a 500, and its traceback in the log): work that failed half way,
        # such as a trigger committed before its enqueue found the broker down, may have changed
        # something. The class only: the message may carry an address or a URL.
        _record(console, user, action, target, f"failed: {type(e).__name__} (the web process's log has more)")
        raise
    _record(console, user, action, target, outcome)
    return outcome, done


def _record(console: Console, user: ConsoleUser, action: str, target: str, outcome: str) -> None:
    with console.sessions.begin() as session:
        audit.record(session, actor=user.name, action=action, target=target, outcome=outcome, now=utcnow())


def trigger(request: Request, user: ConsoleUser, console: Console, form: dict[str, str]) -> Response:
    """``reports trigger PERIOD``: start a period, or resume a cancelled one."""
    text = form.get("period", "").strip()[:16]

    def work() -> str:
        period = parse_closed(text, utcnow())
        return runs.trigger_and_enqueue(
            console.sessions,
            console.queue,
            period,
            template_version=console.settings.template_version,
            schedule=console.settings.send_schedule,
            now=utcnow(),
        ).describe()

    outcome, done = _audited(console, user, "trigger", f"period {text}", work)
    return back(request, f"/periods/{text}" if done else "/periods", outcome)


def cancel(request: Request, user: ConsoleUser, console: Console, form: dict[str, str]) -> Response:
    """``reports cancel PERIOD``."""
    text = request.path_params["period"]

    def work() -> str:
        period = inputs.period(text)
        assert period is not None
        with console.sessions.begin() as session:
            changed = runs.cancel(session, period, now=utcnow())
        return f"{period} cancelled; trigger it to resume." if changed else f"{period} was already cancelled."

    outcome, done = _audited(console, user, "cancel", f"period {text}", work)
    return back(request, f"/periods/{text}" if done else "/periods", outcome)


def replay_one(request: Request, user: ConsoleUser, console: Console, form: dict[str, str]) -> Response:
    """``reports dlq replay --id ID``."""
    text = request.path_params["id"]

    def work() -> str:
        letter_id = inputs.dead_letter_id(text)
        with console.sessions.begin() as session:
            if dead_letters.get(session, letter_id) is None:
                raise BadInput(f"No dead letter with id {letter_id}.")
        done = dead_letters.replay(
            console.sessions, console.queue, dead_letters.Filter(ids=(letter_id,)), now=utcnow(), dry_run=False
        )
        if not done.replayed:
            return f"Dead letter {letter_id} was replayed before (or has no message); nothing enqueued."
        return f"Replayed dead letter {letter_id}; {done.items_reset} report item(s) back to pending."

    outcome, _done = _audited(console, user, "replay", f"dead letter {text}", work)
    return back(request, f"/dead-letters/{text}", outcome)


def replay_matching(request: Request, user: ConsoleUser, console: Console, form: dict[str, str]) -> Response:
    """``reports dlq replay`` of every letter a filter shows: first the count is shown with a
    confirm button; the confirmed replay takes only the letters counted (none that died since)."""
    try:
        # Replayed letters never are again: counted, they would inflate the count shown and the cap.
        where = dataclasses.replace(inputs.dead_letter_filter(form), include_replayed=False)
    except BadInput as e:
        return back(request, "/dead-letters", str(e))
    with console.sessions.begin() as session:
        count, highest = dead_letters.count(session, where)
    if "confirm" not in form:
        return console.render(request, "replay_confirm.html", count=count, highest=highest, cap=REPLAY_CAP, fields=form)
    target = "dead letters " + (_describe(where) or "(all)")

    def work() -> str:
        confirmed = inputs.cursor(form.get("up_to"))
        if confirmed is None:
            raise BadInput("Nothing to replay.")
        shown = dataclasses.replace(where, up_to_id=confirmed)
        n, _ = _count(console, shown)
        if n > REPLAY_CAP:
            raise BadInput(f"{n} dead letters match, more than {REPLAY_CAP}: narrow the filter.")
        done = dead_letters.replay(console.sessions, console.queue, shown, now=utcnow(), dry_run=False)
        return f"Replayed {len(done.replayed)} dead letter(s); {done.items_reset} report item(s) back to pending."

    outcome, _done = _audited(console, user, "replay", target, work)
    return back(request, "/dead-letters", outcome)


def _count(console: Console, where: dead_letters.Filter) -> tuple[int, int]:
    with console.sessions.begin() as session:
        return dead_letters.count(session, where)


def _describe(where: dead_letters.Filter) -> str:
    parts = {"period": where.period, "reason": where.cause, "actor": where.actor, "text": where.reason}
    return " ".join(f"{k}={v}" for k, v in parts.items() if v)


def send_report_now(request: Request, user: ConsoleUser, console: Console, form: dict[str, str]) -> Response:
    """``reports send-now USER PERIOD``."""
    target = f"user {form.get('user', '')[:12]} period {form.get('period', '')[:16]}"

    def work() -> str:
        user_id = inputs.user_id(form.get("user"))
        period = parse_closed(form.get("period", "").strip(), utcnow())
        try:
            job = send_now.request(console.sessions, console.broker, console.settings, user_id, period, now=utcnow())
        except SendNowNotEnqueued as e:
            # Recorded, and reconcile sends it: an error page would read as "nothing done", and
            # the operator's second click would mail the user twice.
            return str(e)
        return f"Queued send-now request {job.request_id}: user {user_id}, period {period}, critical queue."

    outcome, _done = _audited(console, user, "send-now", target, work)
    return back(request, f"/preview?period={form.get('period', '')[:16]}&user={form.get('user', '')[:12]}", outcome)


def suppress(request: Request, user: ConsoleUser, console: Console, form: dict[str, str]) -> Response:
    """``reports suppress add USER --reason R``."""
    target = f"user {form.get('user', '')[:12]}"

    def work() -> str:
        user_id = inputs.user_id(form.get("user"))
        reason = inputs.suppression_reason(form.get("reason"))
        with console.sessions.begin() as session:
            existing = suppressing.suppress(session, user_id, reason, now=utcnow(), source=f"console {user.name}")
        if existing is not None:
            return f"User {user_id} was already suppressed ({existing}); nothing changed."
        return f"User {user_id} suppressed ({reason})."

    outcome, _done = _audited(console, user, "suppress", target, work)
    return back(request, f"/suppressions?q={form.get('user', '')[:12]}", outcome)


def unsuppress(request: Request, user: ConsoleUser, console: Console, form: dict[str, str]) -> Response:
    """``reports suppress remove USER``."""
    text = request.path_params["user_id"]

    def work() -> str:
        user_id = inputs.user_id(text)
        with console.sessions.begin() as session:
            lifted = suppressing.lift(session, user_id, now=utcnow())
        if not lifted.removed:
            return f"User {user_id} was not suppressed; nothing changed."
        return f"User {user_id} is no longer suppressed" + (
            f"; {lifted.dismissed} provider feedback event(s) dismissed." if lifted.dismissed else "."
        )

    outcome, _done = _audited(console, user, "unsuppress", f"user {text}", work)
    return back(request, "/suppressions", outcome)
