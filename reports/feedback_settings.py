"""The provider webhooks' settings parsed and checked: a value that would leave an endpoint open,
or never verify a request, stops start-up in one line that does not show the secret."""

from __future__ import annotations

import base64
import binascii
import re
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from reports.endpoints import BLANK_OR_CONTROL, MIN_SECRET_CHARS, is_loopback
from reports.errors import ConfigurationError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey

#: An SNS topic ARN, in any AWS partition (``aws``, ``aws-cn``, ``aws-us-gov``).
_TOPIC_ARN = re.compile(r"arn:aws(?:-[a-z]+)*:sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_.-]{1,256}")


class FeedbackSettings(Protocol):
    """What the webhooks' checks read of the settings (:class:`reports.settings.Settings` has it)."""

    @property
    def ses_topic_arns(self) -> str: ...
    @property
    def sendgrid_webhook_public_key(self) -> str: ...
    @property
    def postmark_webhook_auth(self) -> str: ...
    @property
    def mailgun_webhook_signing_key(self) -> str: ...
    @property
    def public_base_url(self) -> str: ...
    @property
    def sns_test_ca_file(self) -> str | None: ...


def check_feedback(settings: FeedbackSettings) -> None:
    """Parse every webhook setting that is set; raise :class:`ConfigurationError` for the first bad one."""
    topic_arns(settings)
    if settings.sendgrid_webhook_public_key:
        sendgrid_key(settings)
    if settings.postmark_webhook_auth:
        postmark_credentials(settings)
    key = settings.mailgun_webhook_signing_key
    if key and (len(key) < MIN_SECRET_CHARS or BLANK_OR_CONTROL.search(key)):
        raise ConfigurationError(
            f"MAILGUN_WEBHOOK_SIGNING_KEY must be the key Mailgun shows (at least {MIN_SECRET_CHARS} "
            "characters, no spaces)."
        )
    if settings.sns_test_ca_file is not None and not is_loopback(urlsplit(settings.public_base_url).hostname or ""):
        raise ConfigurationError(
            "SNS_TEST_CA_FILE is for tests only: it is refused unless PUBLIC_BASE_URL is on this machine. "
            "Unset it in production."
        )


def topic_arns(settings: FeedbackSettings) -> frozenset[str]:
    """The SNS topics ``/hooks/ses`` accepts; empty when SES_TOPIC_ARNS is unset."""
    arns = frozenset(part.strip() for part in settings.ses_topic_arns.split(",") if part.strip())
    bad = sorted(arn for arn in arns if not _TOPIC_ARN.fullmatch(arn))
    if bad:
        raise ConfigurationError(
            "SES_TOPIC_ARNS must be comma-separated SNS topic ARNs such as "
            f"arn:aws:sns:us-east-1:123456789012:ses-feedback, got {bad[0]!r}."
        )
    return arns


def sendgrid_key(settings: FeedbackSettings) -> EllipticCurvePublicKey:
    """SENDGRID_WEBHOOK_PUBLIC_KEY as the P-256 public key it must be."""
    # Imported here: only the processes that check or verify a SendGrid request load cryptography.
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_der_public_key

    try:
        key = load_der_public_key(base64.b64decode(settings.sendgrid_webhook_public_key.strip(), validate=True))
    except (ValueError, binascii.Error):
        key = None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ConfigurationError(
            "SENDGRID_WEBHOOK_PUBLIC_KEY must be the Event Webhook's verification key as SendGrid shows it "
            "(base64 of an ECDSA P-256 public key, starting MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE)."
        )
    return key


def postmark_credentials(settings: FeedbackSettings) -> tuple[str, str]:
    """POSTMARK_WEBHOOK_AUTH as (user, password)."""
    user, colon, password = settings.postmark_webhook_auth.partition(":")
    if (
        not colon
        or not user
        or len(password) < MIN_SECRET_CHARS
        or BLANK_OR_CONTROL.search(settings.postmark_webhook_auth)
    ):
        raise ConfigurationError(
            "POSTMARK_WEBHOOK_AUTH must be user:password, the password at least "
            f"{MIN_SECRET_CHARS} characters without spaces (the pair set as the webhook's basic auth credentials in Postmark)."
        )
    return user, password
