"""Every URL setting parsed and checked, and every URL redacted before it reaches a log.

A URL that would fail, or silently mean something else, once a process uses it is refused at
start-up in one line that names its variable, with its secrets masked.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import parse_qs, unquote, urlsplit

import sqlalchemy.exc
from sqlalchemy.engine import make_url

from reports.errors import ConfigurationError

#: Query parameters whose value is a secret, matched case-insensitively anywhere in the name:
#: ``password``, ``sslpassword``, ``pass``, ``secret``, ``token``, ``api_key``, ``auth``…
_SECRET_PARAMETER = re.compile(r"pass|pwd|secret|token|key|auth|credential", re.IGNORECASE)
#: One ``name=value`` of a query; the value runs to the next ``&`` or ``;`` (``#`` and ``@`` too
#: may be part of a password nobody encoded).
_PARAMETER = re.compile(r"([?&;])([^=&;?]*)=([^&;]*)")
_DIGITS = re.compile(r"[0-9]+")
BLANK_OR_CONTROL = re.compile(r"[\x00-\x20\x7f]")

#: The secret used when UNSUBSCRIBE_SECRET is unset and PUBLIC_BASE_URL is loopback (the demo,
#: a developer's machine): links that only this machine can open need no secret of their own.
DEV_SECRET = "dev-only-unsubscribe-secret-not-for-production"

#: Shortest secret accepted, in characters: a short one could be guessed offline from one link.
MIN_SECRET_CHARS = 16


def parse_secrets(raw: str) -> tuple[str, ...]:
    """The comma-separated secrets of UNSUBSCRIBE_SECRET, newest first, blanks around commas dropped."""
    return tuple(part.strip() for part in raw.split(",") if part.strip())


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

#: The query options SMTP_URL takes. ``insecure_auth`` lets credentials go over a connection
#: without TLS: only for a relay on the same host or network, never across the internet.
SMTP_OPTIONS = ("starttls", "insecure_auth")


@dataclass(frozen=True)
class SmtpTarget:
    host: str
    port: int
    implicit_tls: bool
    starttls: bool
    username: str | None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def from_url(cls, url: str) -> SmtpTarget:
        # _host_of first: urlsplit raises on a host or a port it cannot read (an unclosed "[::1").
        host = _host_of(url)
        if host is None or urlsplit(url).scheme not in ("smtp", "smtps"):
            raise ConfigurationError(f"SMTP_URL must be smtp://host:port or smtps://host:port, got {redact_url(url)}.")
        parts = urlsplit(url)
        implicit_tls = parts.scheme == "smtps"
        port = parts.port or (465 if implicit_tls else 25)
        options = _options(parts.query, url)
        target = cls(
            host=host,
            port=port,
            implicit_tls=implicit_tls,
            starttls=options.get("starttls", False),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
        )
        # Over loopback they never leave the machine.
        in_clear = not (target.implicit_tls or target.starttls or is_loopback(target.host))
        if target.username and in_clear and not options.get("insecure_auth", False):
            raise ConfigurationError(
                "SMTP_URL has credentials but no TLS, so they would cross the network in clear: use smtps://, "
                f"or ?starttls=true (or ?insecure_auth=true for a relay on this host), got {redact_url(url)}."
            )
        return target


#: An AWS region's name: ``us-east-1``, ``eu-central-1``, ``us-gov-west-1``, ``ap-southeast-4``.
_AWS_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]{1,2}")
#: Longest queue-name prefix: an SQS queue name is at most 80 characters, and the longest one the
#: workers make is ``PREFIX_critical_dlq``.
MAX_SQS_PREFIX_CHARS = 60
_SQS_PREFIX = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_SQS_PREFIX_CHARS}}}")
_SQS_FORM = "sqs://REGION[/PREFIX][?endpoint_url=https://…]"


@dataclass(frozen=True)
class SqsTarget:
    """Where the SQS broker is: ``sqs://REGION[/PREFIX][?endpoint_url=…]``.

    Credentials are never in the URL: boto3 takes them from the AWS chain (the environment's
    ``AWS_ACCESS_KEY_ID``…, a profile, an instance or task role).
    """

    region: str
    #: Prefix of every queue's name (``PREFIX_bulk``); empty: the queues are named as Dramatiq's.
    prefix: str
    #: Another endpoint than the region's (a VPC endpoint, or a local SQS in tests); ``None``: AWS's.
    endpoint_url: str | None

    @classmethod
    def from_url(cls, url: str) -> SqsTarget:
        try:
            parts = urlsplit(url)
            _port = parts.port
        except ValueError:
            raise ConfigurationError(f"BROKER_URL must be {_SQS_FORM}, got {redact_url(url)}.") from None
        if parts.username is not None or parts.password is not None:
            raise ConfigurationError(
                "BROKER_URL must not carry credentials for SQS: they come from the AWS chain (AWS_ACCESS_KEY_ID "
                f"and AWS_SECRET_ACCESS_KEY, a profile, an instance or task role), got {redact_url(url)}."
            )
        prefix = parts.path.removeprefix("/")
        if (
            parts.scheme != "sqs"
            or _port is not None
            or not _AWS_REGION.fullmatch(parts.netloc)
            or (prefix and not _SQS_PREFIX.fullmatch(prefix))
            or parts.fragment
        ):
            raise ConfigurationError(
                f"BROKER_URL must be {_SQS_FORM}: an AWS region such as us-east-1, and a prefix of letters, digits, "
                f"'-' and '_' (at most {MAX_SQS_PREFIX_CHARS}), got {redact_url(url)}."
            )
        query = parse_qs(parts.query, keep_blank_values=True)
        endpoints = query.pop("endpoint_url", [])
        if query or len(endpoints) > 1:
            raise ConfigurationError(f"BROKER_URL takes only ?endpoint_url= for SQS, got {redact_url(url)}.")
        endpoint = endpoints[0] if endpoints else None
        if endpoint is not None:
            _check_sqs_endpoint(endpoint, url)
        return cls(region=parts.netloc, prefix=prefix, endpoint_url=endpoint)


def _check_sqs_endpoint(endpoint: str, url: str) -> None:
    host = _host_of(endpoint)
    scheme = urlsplit(endpoint).scheme if host else ""
    if scheme not in ("https", "http") or BLANK_OR_CONTROL.search(endpoint):
        raise ConfigurationError(f"BROKER_URL's endpoint_url must be an https:// URL, got {redact_url(url)}.")
    if scheme == "http" and not is_loopback(host or ""):
        raise ConfigurationError(
            "BROKER_URL's endpoint_url must use https:// (plain http:// only to 127.0.0.1, ::1 or localhost),"
            f" got {redact_url(url)}."
        )


def _options(query: str, url: str) -> dict[str, bool]:
    """The URL's options; a misspelled one must not be ignored (``?startls=true`` would send in clear)."""
    options: dict[str, bool] = {}
    for name, values in parse_qs(query, keep_blank_values=True).items():
        value = values[-1].lower()
        if name not in SMTP_OPTIONS or value not in _TRUE | _FALSE:
            raise ConfigurationError(
                f"SMTP_URL takes only {', '.join(f'{option}=true|false' for option in SMTP_OPTIONS)}, "
                f"got {redact_url(url)}."
            )
        options[name] = value in _TRUE
    return options


class EndpointSettings(Protocol):
    """What :func:`check_endpoints` reads of the settings (:class:`reports.settings.Settings` has it)."""

    @property
    def database_url(self) -> str: ...
    @property
    def broker_url(self) -> str: ...
    @property
    def broker_is_rabbitmq(self) -> bool: ...
    @property
    def broker_is_sqs(self) -> bool: ...
    @property
    def shared_redis_url(self) -> str: ...
    @property
    def smtp_url(self) -> str | None: ...
    @property
    def smtp_helo_name(self) -> str: ...
    @property
    def alert_webhook_url(self) -> str | None: ...
    @property
    def exporter_host(self) -> str: ...
    @property
    def public_base_url(self) -> str: ...
    @property
    def unsubscribe_secret(self) -> str: ...


def check_endpoints(settings: EndpointSettings) -> None:
    """Reject a URL that would fail, or silently mean something else, once a process uses it, and
    an exporter that could not serve. Kept out of ``__post_init__`` so its own checks stay short."""
    _check_database_url(settings.database_url)
    if settings.broker_is_rabbitmq:
        _check_amqp_url(settings.broker_url)
    elif settings.broker_is_sqs:
        SqsTarget.from_url(settings.broker_url)
    else:
        _check_redis_url(settings.broker_url, "BROKER_URL")
    if settings.shared_redis_url != settings.broker_url:
        _check_redis_url(settings.shared_redis_url, "REDIS_URL")
    if settings.smtp_url is not None:
        SmtpTarget.from_url(settings.smtp_url)
    if settings.smtp_helo_name and not _HELO_NAME.fullmatch(settings.smtp_helo_name):
        raise ConfigurationError(
            "SMTP_HELO_NAME must be a host name (mail.example.com) or an address literal ([192.0.2.1]), "
            f"got {settings.smtp_helo_name!r}."
        )
    if settings.alert_webhook_url is not None:
        _check_webhook_url(settings.alert_webhook_url)
    if not settings.exporter_host or BLANK_OR_CONTROL.search(settings.exporter_host):
        raise ConfigurationError(f"EXPORTER_HOST must be an address or a host name, got {settings.exporter_host!r}.")
    _check_unsubscribe(settings.public_base_url, settings.unsubscribe_secret)


#: What EHLO accepts as the client's name (RFC 5321 section 4.1.4): a domain, or an address in brackets.
_HELO_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f.:IPv6]+\]"
)


def default_helo_name(fqdn: str, mail_domain: str) -> str:
    """The name to give in EHLO when SMTP_HELO_NAME is unset: the machine's fully qualified name
    if it has a dot (a bare host name, or ``localhost``, says nothing a server can check), else
    the sender's domain."""
    return fqdn if "." in fqdn and fqdn != "localhost.localdomain" else mail_domain


#: Longest PUBLIC_BASE_URL accepted: the List-Unsubscribe header stays one short line.
MAX_PUBLIC_BASE_URL_CHARS = 200

_PUBLIC_BASE_URL = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*)?")


#: What a List-Unsubscribe URL may hold: printable ASCII without space, ``<``, ``>`` or ``,``
#: (RFC 2369 lists URLs in angle brackets, separated by commas).
_HEADER_URL = re.compile(r"https?://[!-+\--;=?-~]+")


def is_header_url(url: str) -> bool:
    """Whether ``url`` can go into the List-Unsubscribe header as it is. The composer checks every
    link with it, and the start-up check PUBLIC_BASE_URL, which every link starts with (the rest
    of a link is its token, in URL-safe characters): a base URL that passes makes links that do."""
    return _HEADER_URL.fullmatch(url) is not None


def _check_unsubscribe(base_url: str, secret: str) -> None:
    # The URL goes into a mail header and every report's footer: plain ASCII URL characters only.
    try:
        parts = urlsplit(base_url)
        host, _port = parts.hostname, parts.port
    except ValueError:
        host = None
    if (
        not host
        or len(base_url) > MAX_PUBLIC_BASE_URL_CHARS
        or not _PUBLIC_BASE_URL.fullmatch(base_url)
        or not is_header_url(base_url)
        or parts.query
        or parts.fragment
    ):
        raise ConfigurationError(
            "PUBLIC_BASE_URL must be the https:// address reports web is reached at, such as "
            f"https://reports.example.com (no query and no comma, at most {MAX_PUBLIC_BASE_URL_CHARS} characters), "
            f"got {redact_url(base_url)!r}."
        )
    if parts.scheme == "http" and not is_loopback(host):
        raise ConfigurationError(
            "PUBLIC_BASE_URL must use https:// (mailbox providers expect it of a one-click unsubscribe link; "
            f"plain http:// only to 127.0.0.1, ::1 or localhost), got {redact_url(base_url)!r}."
        )
    secrets = parse_secrets(secret)
    if not secrets and not is_loopback(host):
        raise ConfigurationError(
            "UNSUBSCRIBE_SECRET is required when PUBLIC_BASE_URL is not on this machine: set it to a long random "
            "string (python -c 'import secrets; print(secrets.token_urlsafe(32))')."
        )
    if any(len(s) < MIN_SECRET_CHARS or BLANK_OR_CONTROL.search(s) for s in secrets):
        raise ConfigurationError(
            f"UNSUBSCRIBE_SECRET must be comma-separated secrets of at least {MIN_SECRET_CHARS} "
            "characters each, without spaces (newest first)."
        )


def _check_database_url(url: str) -> None:
    # SQLAlchemy's own parser, so that what passes here is what create_engine accepts. Its error
    # text is not shown: some releases put the URL, password included, into it.
    unusable = ConfigurationError(
        "DATABASE_URL must be a SQLAlchemy URL such as postgresql+psycopg://user:password@host:5432/reports"
        f" or sqlite:///var/reports.db, got {redact_url(url)}."
    )
    try:
        parsed = make_url(url)
        port = parsed.port
        dialect = parsed.get_dialect()
    except (sqlalchemy.exc.ArgumentError, ValueError):
        raise unusable from None
    # sqlite://var/reports.db (two slashes) names a host, which SQLite's engine refuses.
    if (port is not None and not 1 <= port <= 65535) or (parsed.get_backend_name() == "sqlite" and parsed.host):
        raise unusable
    try:
        dialect.import_dbapi()
    except ImportError as error:
        # Here, not at the first message: a worker would take every message and retry it for hours.
        raise ConfigurationError(
            f"DATABASE_URL must name an installed driver: {parsed.drivername!r} needs the module {error.name!r}, "
            "which is not installed; use postgresql+psycopg:// (psycopg 3) or sqlite:///."
        ) from None


def _check_redis_url(url: str, variable: str) -> None:
    # redis-py reads a database it cannot parse as database 0, without a word.
    try:
        parts = urlsplit(url)
        _port = parts.port
    except ValueError:
        raise ConfigurationError(f"{variable} has an invalid host or port: {redact_url(url)}.") from None
    if parts.scheme != "unix" and not parts.hostname:
        # redis-py reads a URL without a host as localhost: an unset ${REDIS_HOST} would be another Redis.
        raise ConfigurationError(f"{variable} names no host: {redact_url(url)}.")
    databases = parse_qs(parts.query).get("db", [])
    if parts.scheme != "unix" and parts.path.strip("/"):
        databases.append(unquote(parts.path).strip("/"))
    if not all(_DIGITS.fullmatch(db) for db in databases):
        raise ConfigurationError(
            f"{variable} must name its Redis database by number (redis://host:6379/0), got {redact_url(url)}."
        )


def _host_of(url: str) -> str | None:
    """The URL's host, or ``None`` when it has none or its host or port is malformed."""
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port
    except ValueError:
        return None
    return host or None


#: Separates the nodes of a RabbitMQ cluster in BROKER_URL: Dramatiq splits the URL there and pika
#: tries the nodes in turn.
AMQP_NODE_SEPARATOR = ";"


def _check_amqp_url(url: str) -> None:
    nodes = url.split(AMQP_NODE_SEPARATOR)
    # pika reads a URL without a host as localhost, without a word.
    # _host_of first: urlsplit raises on a host it cannot read (an unclosed "[::1").
    if not all(_host_of(node) and urlsplit(node).scheme in ("amqp", "amqps") for node in nodes):
        raise ConfigurationError(
            "BROKER_URL must name each RabbitMQ node as amqp://user:password@host:5672/vhost (amqps:// for TLS), "
            f"several separated by '{AMQP_NODE_SEPARATOR}', got {redact_url(url)}."
        )
    # A node naming another vhost would, once the first node is lost, be a different, empty broker.
    if len({_vhost(node) for node in nodes}) > 1:
        raise ConfigurationError(f"BROKER_URL's RabbitMQ nodes must all name the same vhost, got {redact_url(url)}.")


def _vhost(url: str) -> str:
    """The vhost an amqp URL names, as pika reads it (no path: ``/``)."""
    return unquote(urlsplit(url).path[1:]) or "/"


def _check_webhook_url(url: str) -> None:
    # The posts carry message ids and error classes; over plain http anyone on the path reads them
    # and the secret in the URL. http is fine where nothing leaves the machine.
    host = _host_of(url)  # a URL with a host is one urlsplit can read
    if not host or urlsplit(url).scheme not in ("https", "http") or BLANK_OR_CONTROL.search(url):
        raise ConfigurationError(
            f"ALERT_WEBHOOK_URL must be an https:// URL such as https://hooks.example.com/…,"
            f" got {redact_webhook_url(url)}."
        )
    if urlsplit(url).scheme == "http" and not is_loopback(host):
        raise ConfigurationError(
            "ALERT_WEBHOOK_URL must use https:// (plain http:// only to 127.0.0.1, ::1 or localhost),"
            f" got {redact_webhook_url(url)}."
        )


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def redact_webhook_url(url: str) -> str:
    """``url`` with everything but its scheme and host hidden: webhook URLs carry their secret in
    the path, and a password may hold a ``/`` or ``#``, which ends the host part early."""
    scheme, separator, _rest = url.partition("://")
    host = _host_of(url)
    return f"{scheme}{separator}{host}/***" if separator and host else "***"


def redact_url(url: str) -> str:
    """Return ``url`` with its secrets masked: the password (between the user name's ``:`` and the
    host's ``@``), the user name too when it is the password itself, and the value of every query
    parameter named like a secret (``?password=``, ``sslpassword``, ``token``, ``api_key``…, any case).

    Deliberately not built on ``urlsplit``: it must hide a password even in a malformed URL
    (no scheme, an unencoded ``/`` or ``#`` in the password, a bad port) and never raise. A list of
    URLs (a RabbitMQ cluster's nodes, separated by ``;``) has each one's secrets masked.
    """
    return ";".join(_redact_userinfo(_PARAMETER.sub(_redact_parameter, part)) for part in _NEXT_URL.split(url))


#: Where a list of URLs starts its next one: a ``;`` followed by a scheme (not a ``;`` inside a
#: password or between query parameters).
_NEXT_URL = re.compile(r";(?=[A-Za-z][A-Za-z0-9+.-]*://)")


def _redact_parameter(match: re.Match[str]) -> str:
    separator, name, value = match.groups()
    return f"{separator}{name}={'***' if _SECRET_PARAMETER.search(unquote(name)) else value}"


def _redact_userinfo(url: str) -> str:
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user, _, password = userinfo.partition(":")
    if user == password:
        # A token that is both user and password (Postmark's SMTP server token) is a secret twice.
        user = "***"
    return f"{scheme}{separator}{user}{':' if user else ''}***@{host}"
