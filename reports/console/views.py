"""The console's pages: periods, one period (live), dead letters, suppressions, the fleet, a report's
preview and the audit trail. Each reads what its ``reports`` command reads, by index or keyset."""

from __future__ import annotations

import html
import json
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route

from reports import suppressions
from reports.clock import utcnow
from reports.console import audit, fleet, inputs
from reports.console.app import Console, viewing
from reports.console.pace import describe_eta
from reports.console_settings import ConsoleUser
from reports.errors import BadInput, PermanentError
from reports.failures import dead_letters
from reports.fanout import progress
from reports.jobs import BUILD_REPORT, COORDINATOR, SEND_NOW
from reports.models import DeadLetterReason, PeriodRun, SuppressionReason, User
from reports.ops import preview
from reports.periods import Period, previous_month

#: Rows per page of the dead-letter, suppression and audit lists.
PAGE_SIZE = 50

#: Sent with the preview frame: the report's own inline styles and its images, no script, and a
#: sandbox even when the frame is opened on its own.
FRAME_POLICY = "sandbox; default-src 'none'; style-src 'unsafe-inline'; img-src https: data:; frame-ancestors 'self'"


def routes(console: Console) -> list[BaseRoute]:
    return [
        Route("/periods", viewing(console, periods_page), methods=["GET"]),
        Route("/periods/{period}", viewing(console, period_page), methods=["GET"]),
        Route("/periods/{period}/progress", viewing(console, period_progress), methods=["GET"]),
        Route("/dead-letters", viewing(console, dead_letters_page), methods=["GET"]),
        Route("/dead-letters/{id}", viewing(console, dead_letter_page), methods=["GET"]),
        Route("/suppressions", viewing(console, suppressions_page), methods=["GET"]),
        Route("/fleet", viewing(console, fleet_page), methods=["GET"]),
        Route("/preview", viewing(console, preview_page), methods=["GET"]),
        Route("/preview/frame", viewing(console, preview_frame), methods=["GET"]),
        Route("/audit", viewing(console, audit_page), methods=["GET"]),
    ]


def periods_page(request: Request, _user: ConsoleUser, console: Console) -> Response:
    with console.sessions.begin() as session:
        summaries = progress.every_period(session, utcnow())
    rows = [_row(console, summary.progress) for summary in summaries]
    return console.render(request, "periods.html", rows=rows, last_month=str(previous_month(utcnow())))


def period_page(request: Request, _user: ConsoleUser, console: Console) -> Response:
    found = _period_progress(request, console)
    if isinstance(found, Response):
        return found
    run, counts = found
    return console.render(request, "period.html", run=run, row=_row(console, counts), live=not counts.complete)


def period_progress(request: Request, _user: ConsoleUser, console: Console) -> Response:
    """The period's counts as JSON, which the period page's script reads every few seconds."""
    found = _period_progress(request, console)
    if isinstance(found, Response):
        return found
    run, counts = found
    return JSONResponse(_row(console, counts))


def _period_progress(request: Request, console: Console) -> tuple[PeriodRun, progress.Progress] | Response:
    try:
        period = Period.parse(request.path_params["period"])
        with console.sessions.begin() as session:
            counts = progress.count(session, period, utcnow())
            run = session.get(PeriodRun, str(period))
            assert run is not None
            session.expunge(run)
    except BadInput as e:
        return console.render(request, "error.html", status=404, message=str(e))
    return run, counts


def _row(console: Console, counts: progress.Progress) -> dict[str, Any]:
    pace = console.sampler.add(counts.period, time.monotonic(), counts.finished, counts.pending)
    return {
        **counts.as_dict(),
        "status": counts.status,
        "finished": counts.finished,
        "percent": round(100 * counts.finished / counts.total) if counts.total else 0,
        "rate": f"{pace.per_second:.1f}/s" if pace.per_second is not None else "—",
        "eta": describe_eta(pace.eta_seconds) if not counts.complete else "done",
    }


def dead_letters_page(request: Request, _user: ConsoleUser, console: Console) -> Response:
    fields = dict(request.query_params)
    try:
        where = inputs.dead_letter_filter(fields)
        before = inputs.cursor(fields.get("before"))
    except BadInput as e:
        return _dead_letters(request, console, fields, [], error=str(e))
    with console.sessions.begin() as session:
        letters = dead_letters.page(session, where, before=before, limit=PAGE_SIZE + 1)
    return _dead_letters(request, console, fields, letters)


def _dead_letters(
    request: Request, console: Console, fields: dict[str, str], letters: list[Any], *, error: str | None = None
) -> Response:
    more = len(letters) > PAGE_SIZE
    letters = letters[:PAGE_SIZE]
    query = {k: v for k, v in fields.items() if k in ("period", "reason", "actor", "text", "replayed") and v}
    return console.render(
        request,
        "dead_letters.html",
        letters=letters,
        fields=query,
        older={**query, "before": letters[-1].id} if more else None,
        reasons=[r.value for r in DeadLetterReason],
        actors=[spec.name for spec in (BUILD_REPORT, SEND_NOW, COORDINATOR)],
        error=error,
    )


def dead_letter_page(request: Request, _user: ConsoleUser, console: Console) -> Response:
    try:
        letter_id = inputs.dead_letter_id(request.path_params["id"])
    except BadInput as e:
        return console.render(request, "error.html", status=404, message=str(e))
    with console.sessions.begin() as session:
        letter = dead_letters.get(session, letter_id)
        if letter is not None:
            session.expunge(letter)
    if letter is None:
        return console.render(request, "error.html", status=404, message=f"No dead letter with id {letter_id}.")
    payload = json.dumps(json.loads(letter.payload), indent=2)
    return console.render(request, "dead_letter.html", letter=letter, payload=payload)


def suppressions_page(request: Request, _user: ConsoleUser, console: Console) -> Response:
    query = request.query_params.get("q", "")
    error = None
    try:
        text = inputs.search_text(query)
        after = inputs.user_cursor(request.query_params.get("after"))
    except BadInput as e:
        text, after, error = None, None, str(e)
    by_id = inputs.user_id_searched(text)
    address = text if text and by_id is None else None
    with console.sessions.begin() as session:
        found = suppressions.search(session, user_id=by_id, address=address, after=after, limit=PAGE_SIZE + 1)
        entries = [
            (entry.user_id, entry.reason, entry.source, entry.provider, entry.created_at, email)
            for entry, email in found
        ]
    more = len(entries) > PAGE_SIZE
    entries = entries[:PAGE_SIZE]
    return console.render(
        request,
        "suppressions.html",
        entries=entries,
        q=query,
        later={"q": query, "after": entries[-1][0]} if more else None,
        reasons=[r.value for r in SuppressionReason],
        error=error,
    )


def fleet_page(request: Request, _user: ConsoleUser, console: Console) -> Response:
    figures = fleet.read(console.fleet.collect())
    return console.render(request, "fleet.html", fleet=figures, send_rate=console.settings.send_rate_per_second)


def preview_page(request: Request, _user: ConsoleUser, console: Console) -> Response:
    fields = dict(request.query_params)
    error = None
    chosen = None
    if fields.get("user") or fields.get("period"):
        try:
            period, user_id = inputs.period(fields.get("period")), inputs.user_id(fields.get("user"))
            if period is None:
                raise BadInput("Choose a period (YYYY-MM).")
            chosen = {"period": str(period), "user": user_id}
        except BadInput as e:
            error = str(e)
    return console.render(
        request,
        "preview.html",
        chosen=chosen,
        fields={"period": fields.get("period") or str(previous_month(utcnow())), "user": fields.get("user", "")},
        error=error,
    )


def preview_frame(request: Request, _user: ConsoleUser, console: Console) -> Response:
    """The report's HTML as ``reports preview`` writes it: built by the pipeline's read path, and
    nothing claimed, recorded or sent (the session is never committed)."""
    settings = console.settings
    try:
        period = inputs.period(request.query_params.get("period"))
        user_id = inputs.user_id(request.query_params.get("user"))
        if period is None:
            raise BadInput("Choose a period (YYYY-MM).")
        with console.sessions() as session:
            try:
                user = session.get(User, user_id)
                if user is None:
                    raise BadInput(f"No user with id {user_id}.")
                version = preview.template_version_for(session, settings, period, None)
                preview.check_version(settings, version)
                built = preview.build(session, settings, user, period, version, utcnow(), working_link=False)
                page = built.rendered.html
            finally:
                session.rollback()
    except (BadInput, PermanentError) as e:
        return HTMLResponse(
            f"<p>{html.escape(str(e))}</p>", status_code=404, headers={"Content-Security-Policy": FRAME_POLICY}
        )
    return HTMLResponse(page, headers={"Content-Security-Policy": FRAME_POLICY, "X-Frame-Options": "SAMEORIGIN"})


def audit_page(request: Request, _user: ConsoleUser, console: Console) -> Response:
    try:
        before = inputs.cursor(request.query_params.get("before"))
    except BadInput:
        before = None
    with console.sessions.begin() as session:
        entries = audit.page(session, before=before, limit=PAGE_SIZE + 1)
        session.expunge_all()
    more = len(entries) > PAGE_SIZE
    entries = entries[:PAGE_SIZE]
    return console.render(request, "audit.html", entries=entries, older=entries[-1].id if more else None)
