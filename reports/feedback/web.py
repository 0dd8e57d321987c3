"""The provider webhooks' routes: ``POST /hooks/ses``, ``/hooks/sendgrid``, ``/hooks/postmark``,
``/hooks/mailgun``, each mounted only when its setting is set (otherwise, like any unknown path, 404).

Each request is read up to :data:`MAX_BODY_BYTES`, verified, and its events stored and applied in
one transaction before the 2xx. A refused request is one log line (provider and reason, never the
body) and a 4xx that changes nothing.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.body_limit import RequestBodyLimitMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route, Router

from reports import feedback_settings
from reports.clock import utcnow
from reports.feedback import mailgun, postmark, sendgrid, ses, store
from reports.feedback.events import Event, Provider, Rejected, whole_number
from reports.feedback.fetch import SnsFetcher
from reports.settings import Settings

logger = logging.getLogger(__name__)

#: Largest webhook body read, in bytes: SendGrid posts batches of up to 768 KiB.
MAX_BODY_BYTES = 2 * 1024 * 1024

_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}

#: What a verified request leads to, run in one transaction: the events, and work after the commit.
Intake = Callable[[Request, bytes], "Accepted"]


@dataclass(frozen=True)
class Accepted:
    """A verified request: its events, what makes it one of a kind, a subscription to confirm."""

    found: list[Event]
    #: What no other request carries (a signature token, a signature, a notification's id): seen
    #: again, the request is a replay. ``None``: the provider signs nothing (Postmark), and a
    #: request whose events were all stored before is the replay.
    token: str | None = None
    #: How long the token is remembered: as long as a request carrying it could still be fresh.
    token_kept: timedelta = timedelta(0)
    confirm: Callable[[], None] | None = None


def routes(
    settings: Settings, sessions: sessionmaker[Session], *, fetcher: SnsFetcher | None = None
) -> list[BaseRoute]:
    """``Mount("/hooks", …)`` with a route per configured provider; none when no provider is configured."""
    policy = store.Policy(
        soft_bounce_limit=settings.soft_bounce_limit,
        soft_bounce_window=settings.soft_bounce_window,
    )
    intakes: dict[Provider, Intake] = {}
    if topics := feedback_settings.topic_arns(settings):
        intakes[Provider.SES] = _ses(topics, fetcher or SnsFetcher(ca_file=settings.sns_test_ca_file))
    if settings.sendgrid_webhook_public_key:
        intakes[Provider.SENDGRID] = _sendgrid(feedback_settings.sendgrid_key(settings))
    if settings.postmark_webhook_auth:
        intakes[Provider.POSTMARK] = _postmark(*feedback_settings.postmark_credentials(settings))
    if settings.mailgun_webhook_signing_key:
        intakes[Provider.MAILGUN] = _mailgun(settings.mailgun_webhook_signing_key)
    if not intakes:
        return []
    hooks = [
        Route(f"/{provider}", _endpoint(provider, intake, sessions, policy), methods=["POST"])
        for provider, intake in intakes.items()
    ]
    # The web process caps every body far below a webhook's (reports.web.guards); the mount raises it.
    # No slash redirect, as on the other routes: its Location would be built from the request's own
    # scheme and Host.
    return [
        Mount(
            "/hooks",
            app=Router(hooks, redirect_slashes=False),
            middleware=[Middleware(RequestBodyLimitMiddleware, max_body_size=MAX_BODY_BYTES)],
        )
    ]


def served(mounted: list[BaseRoute]) -> list[str]:
    """The paths :func:`routes` serves (``/hooks/ses`` …), for the start-up line."""
    return [
        f"{mount.path}{route.path}"
        for mount in mounted
        if isinstance(mount, Mount)
        for route in mount.routes
        if isinstance(route, Route)
    ]


def _endpoint(
    provider: Provider, intake: Intake, sessions: sessionmaker[Session], policy: store.Policy
) -> Callable[[Request], object]:
    async def receive(request: Request) -> Response:
        try:
            body = await _body(request)
            accepted = await run_in_threadpool(intake, request, body)
            recorded = await run_in_threadpool(_record, sessions, provider, accepted, policy)
            if accepted.confirm is not None:
                await run_in_threadpool(accepted.confirm)
        except Rejected as e:
            logger.warning(
                "Refused a %s webhook (%d): %s.", provider, e.status, e.reason, extra={"provider": str(provider)}
            )
            return _plain("Refused.", e.status, www_basic=provider == Provider.POSTMARK and e.status == 401)
        logger.info(
            "Took a %s webhook: %d stored, %d already stored, %d unmatched, %d user(s) suppressed.",
            provider,
            recorded.stored,
            recorded.duplicates,
            recorded.unmatched,
            len(recorded.suppressed),
            extra={"provider": str(provider), "suppressed": list(recorded.suppressed)},
        )
        return _plain("ok", 200)

    return receive


def _record(
    sessions: sessionmaker[Session], provider: Provider, accepted: Accepted, policy: store.Policy
) -> store.Recorded:
    now = utcnow()
    with sessions.begin() as session:
        if accepted.token is not None and not store.remember_token(
            session, provider, accepted.token, now=now, keep=accepted.token_kept
        ):
            raise Rejected(_REPLAYED.get(provider, 409), "the request was taken before (a replay)")
        recorded = store.record(session, accepted.found, now=now, policy=policy)
        if accepted.token is None and accepted.found and not recorded.stored:
            raise Rejected(_REPLAYED.get(provider, 409), "every event of the request was taken before (a replay)")
        return recorded


#: What a replay is answered, where not 409: Mailgun does not retry a request refused with 406.
_REPLAYED = {Provider.MAILGUN: 406}


async def _body(request: Request) -> bytes:
    """The raw body, refused with 413 past :data:`MAX_BODY_BYTES` (however it is framed)."""
    length = request.headers.get("content-length")
    announced = None if length is None else whole_number(length)
    if length is not None and (announced is None or announced > MAX_BODY_BYTES):
        raise Rejected(400 if announced is None else 413, "the body is over the size limit or its length unreadable")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise Rejected(413, "the body is over the size limit")
            chunks.append(chunk)
    except HTTPException as e:
        # The mount's body limit counted past MAX_BODY_BYTES first (a chunk that crossed it).
        if e.status_code != 413:
            raise
        raise Rejected(413, "the body is over the size limit") from None
    return b"".join(chunks)


def _ses(topics: frozenset[str], fetcher: SnsFetcher) -> Intake:
    def intake(request: Request, body: bytes) -> Accepted:
        message = ses.parse(body, message_type_header=request.headers.get("x-amz-sns-message-type"))
        ses.check_topic(message, topics)
        now = utcnow()
        ses.check_fresh(message, now)
        ses.verify(message, fetcher.certificate(message.signing_cert_url), now)
        if message.type == ses.SUBSCRIPTION_CONFIRMATION:
            # No token: its retry (after a visit to the SubscribeURL that failed, answered 503)
            # must visit again, and a replay only confirms what is confirmed.
            ses.check_sns_url(message.subscribe_url, allow_loopback=fetcher.allow_loopback)
            return Accepted([], confirm=lambda: fetcher.confirm(message.subscribe_url))
        if message.type == ses.UNSUBSCRIBE_CONFIRMATION:
            return Accepted([])
        # SNS signs its notification's id: the same id twice is a replay (a retry of SNS's carries it
        # too, after an answer it never got; the first was taken).
        return Accepted(ses.feedback(message, now), message.fields["MessageId"], ses.MAX_AGE + ses.MAX_SKEW)

    return intake


def _sendgrid(key: EllipticCurvePublicKey) -> Intake:
    def intake(request: Request, body: bytes) -> Accepted:
        timestamp = request.headers.get(sendgrid.TIMESTAMP_HEADER)
        sendgrid.verify(key, body, request.headers.get(sendgrid.SIGNATURE_HEADER), timestamp, time.time())
        # What the signature covers, not the signature: an ECDSA signature has a second form that
        # verifies as well. A retry of SendGrid's carries a new timestamp.
        signed = hashlib.sha256(f"{timestamp}\n".encode() + body).hexdigest()
        return Accepted(sendgrid.feedback(body, utcnow()), signed, timedelta(seconds=2 * sendgrid.TOLERANCE_SECONDS))

    return intake


def _postmark(user: str, password: str) -> Intake:
    def intake(request: Request, body: bytes) -> Accepted:
        postmark.verify(user, password, request.headers.get("authorization"))
        return Accepted(postmark.feedback(body, utcnow()))

    return intake


def _mailgun(key: str) -> Intake:
    def intake(_request: Request, body: bytes) -> Accepted:
        post = mailgun.verify(key, mailgun.parse(body), time.time())
        return Accepted(
            mailgun.feedback(post, utcnow()),
            token=post.token,
            token_kept=timedelta(seconds=2 * mailgun.TOLERANCE_SECONDS),
        )

    return intake


def _plain(message: str, status: int, *, www_basic: bool = False) -> Response:
    headers = {**_HEADERS, **({"WWW-Authenticate": 'Basic realm="postmark"'} if www_basic else {})}
    return PlainTextResponse(message, status_code=status, headers=headers)
