"""The web process's pages: one-click unsubscribe (RFC 8058), its confirm and done pages, and health.

* ``POST /u/<token>`` with the form body ``List-Unsubscribe=One-Click`` (what a mailbox provider
  sends, and what the confirm page's button sends) suppresses the user and answers 200: idempotent,
  no login, no cookie; the token in the URL is the only credential.
* ``GET /u/<token>`` shows a page with one button, and changes nothing: link scanners and
  previewers open every URL in a mail, and must not unsubscribe anyone.
* ``POST /u/<token>/resubscribe`` lifts an unsubscribe (never a bounce or a complaint).
* ``GET /healthz``: 200 when the database answers, 503 otherwise.

A forged, altered or malformed token answers 404 with no detail, the same for every way it is wrong.
The web process's guards and server (``reports.web``) bound every request and add the headers every
answer carries; the pages add their content policy.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable, Sequence
from gettext import NullTranslations
from pathlib import Path
from typing import Any

import sqlalchemy.exc
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from reports import suppressions
from reports.clock import utcnow
from reports.content import language
from reports.models import SuppressionReason
from reports.tokens import Signer

logger = logging.getLogger(__name__)

#: The form field and value of RFC 8058's one-click POST.
ONE_CLICK = ("List-Unsubscribe", "One-Click")

#: The pages' words in each shipped language: ``locale/<catalog>/LC_MESSAGES/pages.mo``.
LOCALE_DIR = Path(__file__).resolve().parent / "locale"
PAGES_DOMAIN = "pages"

#: The health check's path: answered whatever the Host, since a platform calls it by address.
HEALTH_PATH = "/healthz"

#: Sent with every page: it loads nothing from anywhere, posts only here, and is never framed.
PAGE_POLICY = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
    "frame-ancestors 'none'",
}

_STYLE = (
    "body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:32rem;margin:4rem auto;"
    "padding:0 1rem;color:#111;line-height:1.5}button{font:inherit;padding:.6rem 1.2rem;border:0;"
    "border-radius:.4rem;background:#1d4ed8;color:#fff;cursor:pointer}"
)


def build_app(
    sessions: sessionmaker[Session],
    signer: Signer,
    *,
    product_name: str,
    default_locale: str = "en_US",
    mounted: Sequence[BaseRoute] = (),
) -> Starlette:
    """The ASGI application; ``sessions`` are used from Starlette's thread pool.

    :param default_locale: ``REPORT_LOCALE``: the pages' language when the browser asks for none that ships.
    :param mounted: routes of other flows served by the same process (the provider webhooks).
    """

    def pages(request: Request) -> _Pages:
        # The browser's language, not the stored user's: the page then needs no database read.
        chosen = language.from_accept_language(request.headers.get("accept-language"), default_locale)
        return _Pages(product_name, chosen.tag, language.translations(LOCALE_DIR, chosen.catalog, PAGES_DOMAIN))

    def verified(request: Request) -> int | None:
        return signer.user_id(request.path_params["token"])

    async def show(request: Request) -> Response:
        if verified(request) is None:
            return _not_found()
        return pages(request).confirm()

    async def unsubscribe(request: Request) -> Response:
        user_id = verified(request)
        if user_id is None:
            return _not_found()
        if not await _is_one_click(request):
            return _plain("Bad request.", 400)
        await run_in_threadpool(
            _in_transaction,
            sessions,
            lambda session: suppressions.add(
                session, user_id, SuppressionReason.UNSUBSCRIBED, now=utcnow(), source="web"
            ),
        )
        logger.info("Unsubscribed by its link.", extra={"user_id": user_id})
        return pages(request).done(request.path_params["token"])

    async def resubscribe(request: Request) -> Response:
        user_id = verified(request)
        if user_id is None:
            return _not_found()

        def lift(session: Session) -> bool:
            suppressions.remove(session, user_id, reason=SuppressionReason.UNSUBSCRIBED)
            return suppressions.get(session, user_id) is None

        lifted = await run_in_threadpool(_in_transaction, sessions, lift)
        return pages(request).resubscribed(request.path_params["token"], lifted=lifted)

    async def healthz(_request: Request) -> Response:
        try:
            await run_in_threadpool(_in_transaction, sessions, lambda session: session.execute(text("SELECT 1")))
        except sqlalchemy.exc.SQLAlchemyError as e:
            logger.warning("Health check: the database did not answer (%s).", type(e).__name__)
            return _plain("database unavailable", 503)
        return _plain("ok", 200)

    app = Starlette(
        routes=[
            Route("/u/{token}", show, methods=["GET"]),
            Route("/u/{token}", unsubscribe, methods=["POST"]),
            Route("/u/{token}/resubscribe", resubscribe, methods=["POST"]),
            Route(HEALTH_PATH, healthz, methods=["GET"]),
            *mounted,
        ]
    )
    # Off: the redirect is built from the request's own scheme and Host, which behind a proxy are
    # not the public ones; every link this app hands out is exact anyway.
    app.router.redirect_slashes = False
    return app


def _in_transaction(sessions: sessionmaker[Session], work: Callable[[Session], Any]) -> Any:
    with sessions.begin() as session:
        return work(session)


async def _is_one_click(request: Request) -> bool:
    """Whether the body is RFC 8058's ``List-Unsubscribe=One-Click``, url-encoded or multipart, with or
    without Content-Length (the web process's guards bound its size and time)."""
    async with request.form(max_files=0, max_fields=8) as form:
        return form.get(ONE_CLICK[0]) == ONE_CLICK[1]


def _plain(message: str, status: int) -> Response:
    return PlainTextResponse(message, status_code=status)


def _not_found() -> Response:
    # The same answer for every way a token is wrong: nothing to learn by trying.
    return _plain("Not found.", 404)


class _Pages:
    """The three pages a person sees, each a small HTML document with at most one form, in one language."""

    def __init__(self, product_name: str, lang: str, words: NullTranslations) -> None:
        self.product = html.escape(product_name)
        self.lang = lang
        self.words = words

    def _(self, text: str) -> str:
        """``text`` in the page's language, the product named, escaped for HTML."""
        return html.escape(self.words.gettext(text)).replace("%(product)s", self.product)

    def confirm(self) -> Response:
        _ = self._
        heading, text, button = (
            _("Unsubscribe from %(product)s?"),
            _("You will no longer receive the monthly report by email."),
            _("Unsubscribe"),
        )
        return self._page(_("Unsubscribe"), f"<h1>{heading}</h1><p>{text}</p>{_form('', button, one_click=True)}")

    def done(self, token: str) -> Response:
        _ = self._
        heading, text, question, button = (
            _("You are unsubscribed"),
            _("You will receive no more monthly reports from %(product)s."),
            _("Changed your mind?"),
            _("Resubscribe"),
        )
        return self._page(
            _("Unsubscribed"),
            f"<h1>{heading}</h1><p>{text}</p><p>{question}</p>{_form(f'{token}/resubscribe', button)}",
        )

    def resubscribed(self, token: str, *, lifted: bool) -> Response:
        _ = self._
        if not lifted:
            heading, text = (
                _("Your reports stay paused"),
                _(
                    "Your mail provider refused our reports, or a complaint was recorded."
                    " Please contact us to have them restored."
                ),
            )
            return self._page(_("Still paused"), f"<h1>{heading}</h1><p>{text}</p>")
        heading, text, button = (
            _("You are subscribed again"),
            _("You will receive the monthly report from %(product)s again."),
            _("Unsubscribe"),
        )
        return self._page(
            _("Subscribed again"), f"<h1>{heading}</h1><p>{text}</p>{_form(f'../{token}', button, one_click=True)}"
        )

    def _page(self, title: str, body: str) -> Response:
        document = (
            f'<!doctype html><html lang="{self.lang}"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{title} · {self.product}</title><style>{_STYLE}</style></head>"
            f"<body><main>{body}</main></body></html>"
        )
        return HTMLResponse(document, headers=PAGE_POLICY)


def _form(action: str, label: str, *, one_click: bool = False) -> str:
    # A relative action: the page works under whatever PUBLIC_BASE_URL (and proxy path) serves it.
    field = f'<input type="hidden" name="{ONE_CLICK[0]}" value="{ONE_CLICK[1]}">' if one_click else ""
    return (
        f'<form method="post" action="{html.escape(action or "")}">{field}<button type="submit">{label}</button></form>'
    )
