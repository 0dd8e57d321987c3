"""Settings read once from an explicit environment mapping, and URLs made safe to print."""

from __future__ import annotations

import base64
from datetime import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from sqlalchemy.engine import make_url

from reports import tokens
from reports.endpoints import default_helo_name, redact_url
from reports.errors import ConfigurationError
from reports.local_time import SendSchedule
from reports.settings import DEFAULT_TEMPLATES_DIR, ENVIRONMENT, Settings

#: A templates folder named otherwise than the default (start-up looks for the version's folder in it).
ELSEWHERE_TEMPLATES = DEFAULT_TEMPLATES_DIR / ".." / DEFAULT_TEMPLATES_DIR.name


def test_an_empty_environment_gives_the_documented_defaults() -> None:
    settings = Settings.from_env({})
    assert settings.var_dir == Path("var")
    assert settings.broker_url == "redis://localhost:6379/0"
    assert settings.smtp_url is None
    assert settings.outbox_dir == Path("var") / "outbox"
    assert settings.templates_dir == DEFAULT_TEMPLATES_DIR
    assert settings.template_version == "v2"
    assert (settings.report_locale, settings.report_currency, settings.report_empty_month) == ("en", "USD", "send")
    assert settings.report_logo_url is None
    assert settings.plan_page_size == 1000
    assert settings.max_retries == 25
    assert (settings.web_read_timeout_seconds, settings.web_max_connections) == (10.0, 200)
    assert "@" in settings.mail_from


def test_the_default_templates_folder_holds_the_default_version() -> None:
    settings = Settings.from_env({})
    assert (settings.templates_dir / settings.template_version / "report.html.j2").is_file()


@pytest.mark.parametrize("var_dir", ["var", "/srv/reports/var", "relative/dir"])
def test_the_default_database_is_a_sqlite_file_under_var_dir(var_dir: str) -> None:
    url = make_url(Settings.from_env({"VAR_DIR": var_dir}).database_url)
    assert url.get_backend_name() == "sqlite"
    assert Path(url.database or "") == Path(var_dir) / "reports.db"


def test_an_explicit_database_url_wins_over_the_var_dir_default() -> None:
    settings = Settings.from_env({"VAR_DIR": "/srv/var", "DATABASE_URL": "postgresql+psycopg://db/reports"})
    assert settings.database_url == "postgresql+psycopg://db/reports"
    assert settings.var_dir == Path("/srv/var")


@pytest.mark.parametrize(
    ("variable", "raw", "attribute", "expected"),
    [
        ("BROKER_URL", "redis://queue:6380/2", "broker_url", "redis://queue:6380/2"),
        ("BROKER_NAMESPACE", "reports-prod", "broker_namespace", "reports-prod"),
        (
            "SMTP_URL",
            "smtp://mail.example.com:587?starttls=true",
            "smtp_url",
            "smtp://mail.example.com:587?starttls=true",
        ),
        ("MAIL_FROM", "Reports <reports@example.com>", "mail_from", "Reports <reports@example.com>"),
        ("SMTP_TIMEOUT_SECONDS", "2.5", "smtp_timeout_seconds", 2.5),
        ("SMTP_TIMEOUT_SECONDS", "3", "smtp_timeout_seconds", 3.0),
        ("TEMPLATES_DIR", str(ELSEWHERE_TEMPLATES), "templates_dir", ELSEWHERE_TEMPLATES),
        ("REPORT_TEMPLATE_VERSION", "v1", "template_version", "v1"),
        ("REPORT_LOCALE", "de_DE", "report_locale", "de_DE"),
        # BCP 47, as users.locale is written.
        ("REPORT_LOCALE", "tr-TR", "report_locale", "tr-TR"),
        ("REPORT_LOCALE", "uz-Latn", "report_locale", "uz-Latn"),
        ("REPORT_CURRENCY", "EUR", "report_currency", "EUR"),
        ("REPORT_EMPTY_MONTH", "skip", "report_empty_month", "skip"),
        ("REPORT_PRODUCT_NAME", "Acme Ledger", "report_product_name", "Acme Ledger"),
        ("REPORT_BRAND_COLOR", "#0f766e", "report_brand_color", "#0f766e"),
        ("REPORT_ACCENT_COLOR", "#f59e0b", "report_accent_color", "#f59e0b"),
        ("REPORT_LOGO_URL", "https://cdn.example.com/logo.png", "report_logo_url", "https://cdn.example.com/logo.png"),
        (
            "REPORT_POSTAL_ADDRESS",
            "Acme Inc., 1 Main St, Springfield",
            "report_postal_address",
            "Acme Inc., 1 Main St, Springfield",
        ),
        ("PLAN_PAGE_SIZE", "50", "plan_page_size", 50),
        ("PLAN_SLICE_SECONDS", "0.5", "plan_slice_seconds", 0.5),
        ("CLAIM_LEASE_SECONDS", "45", "claim_lease_seconds", 45.0),
        ("HEARTBEAT_TIMEOUT_MS", "60000", "heartbeat_timeout_ms", 60_000),
        ("MAINTENANCE_CHANCE", "0", "maintenance_chance", 0),
        ("MAX_RETRIES", "0", "max_retries", 0),
        ("MIN_BACKOFF_MS", "10", "min_backoff_ms", 10),
        ("MAX_BACKOFF_MS", "20000", "max_backoff_ms", 20_000),
        ("LOG_LEVEL", "DEBUG", "log_level", "DEBUG"),
        ("SEND_RATE_PER_SECOND", "2.5", "send_rate_per_second", 2.5),
        ("SEND_RATE_PER_SECOND", "200", "send_rate_per_second", 200.0),
        ("SEND_RATE_BURST", "20", "send_rate_burst", 20),
        ("RETENTION_MONTHS", "13", "retention_months", 13),
        ("WEB_READ_TIMEOUT_SECONDS", "0.5", "web_read_timeout_seconds", 0.5),
        ("WEB_MAX_CONNECTIONS", "1000", "web_max_connections", 1000),
        ("FORWARDED_ALLOW_IPS", "*", "forwarded_allow_ips", "*"),
        ("FORWARDED_ALLOW_IPS", "10.0.0.0/8, fd00::1", "forwarded_allow_ips", "10.0.0.0/8, fd00::1"),
    ],
)
def test_a_variable_overrides_its_setting_with_the_settings_type(
    variable: str, raw: str, attribute: str, expected: object
) -> None:
    value = getattr(Settings.from_env({variable: raw}), attribute)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    "variable", ["SMTP_URL", "PLAN_PAGE_SIZE", "BROKER_URL", "VAR_DIR", "SEND_RATE_PER_SECOND", "RETENTION_MONTHS"]
)
def test_an_empty_variable_means_the_default(variable: str) -> None:
    assert Settings.from_env({variable: ""}) == Settings.from_env({})


def test_an_explicit_mapping_is_read_instead_of_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BROKER_URL", "redis://from-process-env:6379/9")
    monkeypatch.setenv("PLAN_PAGE_SIZE", "not a number")
    settings = Settings.from_env({"MAX_RETRIES": "2"})
    assert settings.broker_url == "redis://localhost:6379/0"
    assert settings.max_retries == 2


@pytest.mark.parametrize(
    "environ",
    [{"REPORT_TEMPLATE_VERSION": "v9"}, {"TEMPLATES_DIR": "/nonexistent"}, {"REPORT_TEMPLATE_VERSION": "render.py"}],
)
def test_a_template_version_with_no_folder_is_refused_at_start(environ: dict[str, str]) -> None:
    # A trigger would pin it on the month's run: every report of the month would die, and so would a replay.
    with pytest.raises(ConfigurationError, match="REPORT_TEMPLATE_VERSION .* is not a folder in TEMPLATES_DIR"):
        Settings.from_env(environ)


def test_a_template_version_with_dots_and_dashes_is_taken_when_its_folder_is_there(tmp_path: Path) -> None:
    (tmp_path / "v2.1-beta").mkdir()
    settings = Settings.from_env({"TEMPLATES_DIR": str(tmp_path), "REPORT_TEMPLATE_VERSION": "v2.1-beta"})
    assert settings.template_version == "v2.1-beta"


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("PLAN_PAGE_SIZE", "abc"),
        ("PLAN_PAGE_SIZE", "1.5"),
        ("MAX_RETRIES", "five"),
        ("MAX_RETRIES", "5.0"),
        ("HEARTBEAT_TIMEOUT_MS", "15s"),
        ("MIN_BACKOFF_MS", "1e3"),
        ("SMTP_TIMEOUT_SECONDS", "ten"),
        ("CLAIM_LEASE_SECONDS", "30s"),
        ("PLAN_SLICE_SECONDS", "1,5"),
        ("SEND_RATE_PER_SECOND", "fast"),
        ("SEND_RATE_BURST", "2.5"),
        ("RETENTION_MONTHS", "1.5"),
        ("RETENTION_MONTHS", "a year"),
    ],
)
def test_a_bad_number_is_a_configuration_error_naming_the_variable(variable: str, raw: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({variable: raw})
    assert variable in str(caught.value)
    assert repr(raw) in str(caught.value)


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("PLAN_PAGE_SIZE", "0"),
        ("PLAN_PAGE_SIZE", "-1"),
        ("PLAN_PAGE_SIZE", "100001"),
        ("MAX_RETRIES", "-1"),
        ("MAX_RETRIES", "1000001"),
        ("HEARTBEAT_TIMEOUT_MS", "0"),
        ("HEARTBEAT_TIMEOUT_MS", "-5"),
        ("HEARTBEAT_TIMEOUT_MS", "999"),
        ("PLAN_HIGH_WATER", "0"),
        ("PLAN_HIGH_WATER", "-100"),
        ("MIN_BACKOFF_MS", "0"),
        ("MIN_BACKOFF_MS", "-1"),
        ("MAX_BACKOFF_MS", "0"),
        ("MAX_BACKOFF_MS", "10"),  # below the default MIN_BACKOFF_MS
        ("BREAKER_FAILURE_THRESHOLD", "0"),
        ("BREAKER_FAILURE_THRESHOLD", "-3"),
        ("MAINTENANCE_CHANCE", "-1"),
        ("MAINTENANCE_CHANCE", "1000001"),
        ("CLAIM_LEASE_SECONDS", "0"),
        ("CLAIM_LEASE_SECONDS", "-30"),
        ("SMTP_TIMEOUT_SECONDS", "0"),
        ("SMTP_TIMEOUT_SECONDS", "nan"),
        ("SMTP_TIMEOUT_SECONDS", "inf"),
        ("BREAKER_COOLDOWN_SECONDS", "0"),
        ("PLAN_SLICE_SECONDS", "0"),
        ("PLAN_SLICE_SECONDS", "1e12"),
        ("RECONCILE_STUCK_AFTER_SECONDS", "-1"),
        ("SCHEDULE_LOOKBACK_MONTHS", "0"),
        ("SEND_AT_LOCAL_TIME", "9am"),
        ("SEND_AT_LOCAL_TIME", "9:00"),
        ("SEND_AT_LOCAL_TIME", "24:00"),
        ("DEFAULT_TIME_ZONE", "Mars/Olympus"),
        ("DEFAULT_TIME_ZONE", "../../etc/localtime"),
        ("DEFAULT_TIME_ZONE", "utc"),
        ("REPORT_TEMPLATE_VERSION", ".."),
        ("REPORT_TEMPLATE_VERSION", "../../etc"),
        ("REPORT_TEMPLATE_VERSION", "v1/../v2"),
        ("REPORT_TEMPLATE_VERSION", "/etc"),
        ("LOG_LEVEL", "LOUD"),
        ("LOG_LEVEL", "10"),
        ("SEND_RATE_PER_SECOND", "0"),
        ("SEND_RATE_PER_SECOND", "-1"),
        ("SEND_RATE_PER_SECOND", "nan"),
        ("SEND_RATE_PER_SECOND", "inf"),
        ("SEND_RATE_PER_SECOND", "1000001"),
        ("SEND_RATE_BURST", "0"),
        ("RETENTION_MONTHS", "0"),
        ("RETENTION_MONTHS", "1201"),
        ("REPORT_LOCALE", "xx_YY"),
        ("REPORT_LOCALE", "english"),
        ("REPORT_CURRENCY", "usd"),
        ("REPORT_CURRENCY", "DOLLARS"),
        ("REPORT_EMPTY_MONTH", "never"),
        ("REPORT_BRAND_COLOR", "red"),
        ("REPORT_BRAND_COLOR", "#12345"),
        ("REPORT_ACCENT_COLOR", "#fff;background:url(x)"),
        ("REPORT_LOGO_URL", "http://cdn.example.com/logo.png"),
        ("REPORT_LOGO_URL", 'https://cdn.example.com/a.png" onerror="x'),
        ("REPORT_PRODUCT_NAME", " "),
        ("REPORT_PRODUCT_NAME", "x" * 61),
        ("REPORT_POSTAL_ADDRESS", "1 Main St\r\nBcc: x@evil.test"),
        ("WEB_READ_TIMEOUT_SECONDS", "0"),
        ("WEB_READ_TIMEOUT_SECONDS", "nan"),
        ("WEB_MAX_CONNECTIONS", "0"),
        ("FORWARDED_ALLOW_IPS", "router.internal"),
        ("FORWARDED_ALLOW_IPS", "10.0.0.1/8"),
        ("FORWARDED_ALLOW_IPS", "*, 10.0.0.1"),
    ],
)
def test_a_value_out_of_range_is_a_configuration_error_naming_the_variable(variable: str, raw: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({variable: raw})
    assert variable in str(caught.value)


def test_a_shortest_backoff_above_the_longest_names_both_variables() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"MIN_BACKOFF_MS": "5000", "MAX_BACKOFF_MS": "4000"})
    assert "MIN_BACKOFF_MS" in str(caught.value) and "MAX_BACKOFF_MS" in str(caught.value)


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("MAX_RETRIES", "0"),  # never retry
        ("MAINTENANCE_CHANCE", "0"),
        ("MAINTENANCE_CHANCE", "1000000"),
        ("HEARTBEAT_TIMEOUT_MS", "1000"),
        ("PLAN_PAGE_SIZE", "1"),
        ("PLAN_PAGE_SIZE", "100000"),
        ("SCHEDULE_RECONCILE_INTERVAL_SECONDS", "0"),  # reconcile never
        ("RECONCILE_STUCK_AFTER_SECONDS", "0"),
        ("SMTP_TIMEOUT_SECONDS", "0.5"),
        ("LOG_LEVEL", "warning"),
    ],
)
def test_the_edges_of_each_range_are_accepted(variable: str, raw: str) -> None:
    Settings.from_env({variable: raw})


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param(Settings(), id="defaults"),
        pytest.param(
            Settings(
                var_dir=Path("/tmp/reports-var"),
                broker_url="redis://queue:6380/2",
                broker_namespace="ns",
                smtp_url="smtps://user:p%40ss@mail.example.com:465",
                mail_from="Reports <reports@example.com>",
                smtp_timeout_seconds=2.5,
                templates_dir=ELSEWHERE_TEMPLATES,
                template_version="v2",
                plan_page_size=7,
                plan_slice_seconds=0.25,
                claim_lease_seconds=5,
                heartbeat_timeout_ms=60_000,
                maintenance_chance=0,
                max_retries=0,
                min_backoff_ms=200,
                max_backoff_ms=2_000,
                log_level="DEBUG",
            ),
            id="everything-set",
        ),
        pytest.param(Settings(var_dir=Path("elsewhere")), id="var-dir-only"),
    ],
)
def test_as_environ_rebuilds_the_same_settings_through_from_env(settings: Settings) -> None:
    environ = settings.as_environ()
    assert all(isinstance(value, str) for value in environ.values())
    assert set(environ) <= set(ENVIRONMENT.values())
    assert Settings.from_env(environ) == settings


def test_as_environ_leaves_out_an_unset_smtp_url() -> None:
    assert "SMTP_URL" not in Settings().as_environ()
    assert Settings(smtp_url="smtp://mail:25").as_environ()["SMTP_URL"] == "smtp://mail:25"


@pytest.mark.parametrize(
    ("mail_from", "domain"),
    [
        ("Monthly Reports <reports@localhost>", "localhost"),
        ("Reports <reports@example.com>", "example.com"),
        ("reports@mail.example.org", "mail.example.org"),
        ("<reports@example.net>", "example.net"),
        ("Reports <reports@Example.com >", "Example.com"),
        # SMTP and the headers carry ASCII: the domain in its IDNA form, as mail servers resolve it.
        ("Reports <reports@exämple.com>", "xn--exmple-cua.com"),
        ("Отчёты <reports@пример.рф>", "xn--e1afmkfd.xn--p1ai"),
    ],
)
def test_the_mail_domain_is_the_senders_domain(mail_from: str, domain: str) -> None:
    assert Settings(mail_from=mail_from).mail_domain == domain


@pytest.mark.parametrize(
    "mail_from",
    [
        "reports",
        "Monthly Reports",
        "Reports <>",
        "Reports <rép@example.com>",
        "Reports <reports@example..com>",
        "Reports <reports@-example.com>",
        "Reports <reports@example>",
        "Reports <reports@exa_mple.com>",
        "a@example.com, b@example.com",
        "Reports <reports@example.com",
        "Reports\r\nBcc: x@evil.test <reports@example.com>",
        "Reports <reports@xn--a.com>",
    ],
)
def test_a_sender_no_email_could_carry_is_refused_in_one_line(mail_from: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"MAIL_FROM": mail_from})
    assert str(caught.value).startswith("MAIL_FROM must be") and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("smtp://user:secret@host:25", "smtp://user:***@host:25"),
        ("smtps://user:secret@mail.example.com", "smtps://user:***@mail.example.com"),
        ("smtp://user:secret@host:587?starttls=true", "smtp://user:***@host:587?starttls=true"),
        ("smtp://us%40er:se%40cret@host:25", "smtp://us%40er:***@host:25"),
        ("redis://:secret@localhost:6379/0", "redis://***@localhost:6379/0"),
        ("postgresql+psycopg://app:secret@db:5432/reports", "postgresql+psycopg://app:***@db:5432/reports"),
        ("smtp://user:secret@[::1]:25", "smtp://user:***@[::1]:25"),
        # Postmark's SMTP credentials: its server token as both user name and password.
        ("smtp://secret:secret@smtp.postmarkapp.com:587", "smtp://***:***@smtp.postmarkapp.com:587"),
    ],
)
def test_redact_url_hides_the_password(url: str, redacted: str) -> None:
    result = redact_url(url)
    assert "secret" not in result
    assert result == redacted


@pytest.mark.parametrize(
    "url",
    [
        "smtp://host:25",
        "smtp://user@host:25",
        "redis://localhost:6379/0",
        "sqlite:///var/reports.db",
        "postgresql+psycopg://db/reports",
        "unix:///run/redis.sock?db=0",
    ],
)
def test_redact_url_leaves_a_url_without_a_password_alone(url: str) -> None:
    assert redact_url(url) == url


def test_a_redacted_url_keeps_its_host_and_port_readable() -> None:
    parts = urlsplit(redact_url("smtp://user:secret@[::1]:2525"))
    assert (parts.hostname, parts.port, parts.username) == ("::1", 2525, "user")


@pytest.mark.parametrize(
    "url",
    [
        "smtp://user:secret@mail.example.com:abc",
        "smtp://user:secret@mail.example.com:99999",
        "smtp://user:secret@[::1",
    ],
)
def test_redact_url_never_raises_and_never_shows_the_password(url: str) -> None:
    assert "secret" not in redact_url(url)


def test_a_token_that_is_user_and_password_is_not_in_the_smtp_url_error() -> None:
    token = "8d5e1f3a-0c2b-4f6e-9a7d-1b2c3d4e5f60"
    with pytest.raises(ConfigurationError, match="SMTP_URL") as raised:
        Settings.from_env({"SMTP_URL": f"smtp://{token}:{token}@smtp.postmarkapp.com:587"})
    assert token not in str(raised.value)
    assert "smtp.postmarkapp.com:587" in str(raised.value)


@pytest.mark.parametrize("url", ["amqp://guest:s3cret@127.0.0.1:5672/", "http://redis", "localhost:6379"])
def test_a_broker_url_the_redis_broker_cannot_use_is_a_configuration_error_without_its_password(url: str) -> None:
    with pytest.raises(ConfigurationError, match="BROKER_URL") as raised:
        Settings.from_env({"BROKER_URL": url})
    assert "s3cret" not in str(raised.value)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "rediss://h:6380/1", "unix:///tmp/redis.sock"])
def test_redis_tls_and_unix_socket_broker_urls_are_accepted(url: str) -> None:
    assert Settings.from_env({"BROKER_URL": url}).broker_url == url


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("postgresql+psycopg://db/reports?password=s3cret", "postgresql+psycopg://db/reports?password=***"),
        (
            "postgresql+psycopg://app@db/reports?sslmode=require&sslpassword=s3cret",
            "postgresql+psycopg://app@db/reports?sslmode=require&sslpassword=***",
        ),
        ("redis://localhost:6379/0?PASSWORD=s3cret", "redis://localhost:6379/0?PASSWORD=***"),
        ("redis://localhost:6379/0?pass=s3cret&db=1", "redis://localhost:6379/0?pass=***&db=1"),
        ("https://api.example.com/v1?token=s3cret", "https://api.example.com/v1?token=***"),
        ("https://api.example.com/v1?Api_Key=s3cret", "https://api.example.com/v1?Api_Key=***"),
        ("smtp://mail:25?secret=s3cret;starttls=true", "smtp://mail:25?secret=***;starttls=true"),
        ("postgresql://db/r?pass%77ord=s3cret", "postgresql://db/r?pass%77ord=***"),
        ("postgresql://db/r?password=s3c@ret#x", "postgresql://db/r?password=***"),
        ("postgresql://app:s3cret@db/r?password=s3cret", "postgresql://app:***@db/r?password=***"),
    ],
)
def test_redact_url_hides_a_secret_query_parameter(url: str, redacted: str) -> None:
    result = redact_url(url)
    assert "s3c" not in result
    assert result == redacted


def test_redact_url_leaves_other_query_parameters_alone() -> None:
    url = "postgresql+psycopg://db/reports?sslmode=require&application_name=reports&connect_timeout=5"
    assert redact_url(url) == url


def test_the_settings_repr_shows_no_secret_of_any_url() -> None:
    settings = Settings(
        database_url="postgresql+psycopg://app:db-s3cret@db:5432/reports?sslpassword=ssl-s3cret",
        broker_url="rediss://:broker-s3cret@queue:6380/2",
        smtp_url="smtps://mailer:smtp-s3cret@mail.example.com:465",
        alert_webhook_url="https://hooks.example.com/services/T000/hook-s3cret",
    )
    shown = repr(settings)
    assert "s3cret" not in shown and "s3cret" not in str(settings)
    assert "db:5432/reports" in shown and "queue:6380/2" in shown and "hooks.example.com" in shown
    assert "plan_page_size=1000" in shown


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://app:s3cret@db:notaport/reports",
        "postgresql+psycopg://app:s3cret@db:99999/reports",
        "://x",
        "postgresql+psycopg//app:s3cret@db/reports",
        "nosuchdialect://app:s3cret@db/reports",
    ],
)
def test_a_malformed_database_url_is_a_configuration_error_without_its_password(url: str) -> None:
    with pytest.raises(ConfigurationError, match="DATABASE_URL") as raised:
        Settings.from_env({"DATABASE_URL": url})
    assert "s3cret" not in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://:s3cret@queue:6379/notadb",
        "redis://queue:6379/0x1",
        "rediss://queue:6380/1?db=two",
        "unix:///run/redis.sock?db=zero",
        "redis://:s3cret@queue:port/0",
    ],
)
def test_a_broker_url_with_a_database_that_is_not_a_number_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError, match="BROKER_URL") as raised:
        Settings.from_env({"BROKER_URL": url})
    assert "s3cret" not in str(raised.value)


@pytest.mark.parametrize(
    "url", ["redis://queue:6379", "redis://queue:6379/", "redis://queue:6379/15", "unix:///run/redis.sock?db=3"]
)
def test_a_broker_url_with_a_numbered_or_no_database_is_accepted(url: str) -> None:
    assert Settings.from_env({"BROKER_URL": url}).broker_url == url


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/services/T000/SECRET",
        "https://hooks.example.com:8443/x",
        "http://127.0.0.1:9999/hooks/SECRET",
        "http://localhost/hooks/SECRET",
        "http://[::1]:8080/hooks/SECRET",
    ],
)
def test_an_https_or_loopback_webhook_url_is_accepted(url: str) -> None:
    assert Settings.from_env({"ALERT_WEBHOOK_URL": url}).alert_webhook_url == url


@pytest.mark.parametrize(
    "url",
    [
        "http://hooks.example.com/services/T000/SECRET",
        "http://10.0.0.5/hooks/SECRET",
        "ftp://hooks.example.com/SECRET",
        "hooks.example.com/services/SECRET",
        "https:///SECRET",
        "https://hooks.example.com:notaport/SECRET",
        "https://hooks.example.com/SECRET\r\nX-Injected: 1",
    ],
)
def test_a_webhook_url_that_is_not_https_or_cannot_be_posted_to_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError, match="ALERT_WEBHOOK_URL") as raised:
        Settings.from_env({"ALERT_WEBHOOK_URL": url})
    assert "SECRET" not in str(raised.value)


@pytest.mark.parametrize(
    ("variable", "url"),
    [
        ("ALERT_WEBHOOK_URL", "http://alerts:S3cret/PW@hooks.example.com/services/T0/B0"),
        ("ALERT_WEBHOOK_URL", "http://alerts:S3c#retPW@hooks.example.com/services/T0/B0"),
        ("PUBLIC_BASE_URL", "https://staging:S3cretPW@reports.example.com/?a=1"),
        ("PUBLIC_BASE_URL", "http://staging:S3cretPW@reports.example.com"),
        ("SMTP_URL", "smtps://user:S3cretPW@[::1"),
        ("BROKER_URL", "amqp://user:S3cretPW@[rabbit:5672/vh"),
        ("BROKER_URL", "redis://:S3cretPW@:6379/0"),
        ("BROKER_URL", "redis:///12"),
        ("REDIS_URL", "redis://:S3cretPW@/0"),
    ],
)
def test_a_url_that_cannot_work_is_refused_in_one_line_that_shows_none_of_its_password(variable: str, url: str) -> None:
    environment = {"REDIS_URL": "redis://127.0.0.1:6379/0", "UNSUBSCRIBE_SECRET": "x" * 32, variable: url}
    with pytest.raises(ConfigurationError, match=variable) as raised:
        Settings.from_env(environment)
    assert "S3c" not in str(raised.value) and "PW" not in str(raised.value)
    assert len(str(raised.value).splitlines()) == 1


def test_the_exporter_listens_everywhere_and_caches_five_seconds_unless_told_otherwise() -> None:
    assert (Settings.from_env({}).exporter_host, Settings.from_env({}).exporter_cache_seconds) == ("0.0.0.0", 5.0)
    settings = Settings.from_env({"EXPORTER_HOST": "127.0.0.1", "EXPORTER_CACHE_SECONDS": "0"})
    assert (settings.exporter_host, settings.exporter_cache_seconds) == ("127.0.0.1", 0.0)


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("EXPORTER_CACHE_SECONDS", "-1"),
        ("EXPORTER_CACHE_SECONDS", "nan"),
        ("EXPORTER_CACHE_SECONDS", "5s"),
        ("EXPORTER_HOST", "127.0.0.1 9300"),
    ],
)
def test_a_bad_exporter_setting_is_a_configuration_error_naming_the_variable(variable: str, raw: str) -> None:
    with pytest.raises(ConfigurationError, match=variable):
        Settings.from_env({variable: raw})


def test_the_default_public_base_url_is_loopback_and_needs_no_secret() -> None:
    settings = Settings.from_env({})
    assert settings.public_base_url == "http://127.0.0.1:8000"
    assert tokens.links(settings).url(1).startswith("http://127.0.0.1:8000/u/1.")


@pytest.mark.parametrize(
    "environment",
    [
        {"PUBLIC_BASE_URL": "https://reports.example.com"},  # a real deployment without its secret
        {"PUBLIC_BASE_URL": "http://reports.example.com", "UNSUBSCRIBE_SECRET": "x" * 32},  # plain http off-machine
        {"PUBLIC_BASE_URL": "ftp://reports.example.com", "UNSUBSCRIBE_SECRET": "x" * 32},
        {"PUBLIC_BASE_URL": "https://reports.example.com/?a=1", "UNSUBSCRIBE_SECRET": "x" * 32},
        {"PUBLIC_BASE_URL": "https://reports.example.com/\r\nBcc: x", "UNSUBSCRIBE_SECRET": "x" * 32},
        {"PUBLIC_BASE_URL": "https://réports.example.com", "UNSUBSCRIBE_SECRET": "x" * 32},
        {"PUBLIC_BASE_URL": "https://reports.example.com", "UNSUBSCRIBE_SECRET": "short"},
        {"PUBLIC_BASE_URL": "https://reports.example.com", "UNSUBSCRIBE_SECRET": "x" * 32 + ",short"},
    ],
)
def test_a_public_base_url_or_secret_unfit_for_production_is_refused(environment: dict[str, str]) -> None:
    with pytest.raises(ConfigurationError, match="PUBLIC_BASE_URL|UNSUBSCRIBE_SECRET"):
        Settings.from_env(environment)


def test_several_secrets_sign_with_the_first_and_the_repr_shows_none() -> None:
    settings = Settings.from_env(
        {
            "PUBLIC_BASE_URL": "https://reports.example.com/mail/",
            "UNSUBSCRIBE_SECRET": "new-s3cret-0123456789, old-s3cret-0123456789",
        }
    )
    links = tokens.links(settings)
    assert links.url(5).startswith("https://reports.example.com/mail/u/5.")
    assert len(links.signer.keys) == 2
    assert "s3cret" not in repr(settings)


# --- Provider webhooks ------------------------------------------------------------------------

_PUBLIC = {"PUBLIC_BASE_URL": "https://reports.example.com", "UNSUBSCRIBE_SECRET": "x" * 32}


def test_the_provider_webhooks_are_unset_by_default() -> None:
    settings = Settings.from_env({})
    assert (
        settings.ses_topic_arns,
        settings.sendgrid_webhook_public_key,
        settings.postmark_webhook_auth,
        settings.mailgun_webhook_signing_key,
        settings.sns_test_ca_file,
    ) == ("", "", "", "", None)
    assert (settings.soft_bounce_limit, settings.soft_bounce_window_days) == (3, 90)


def test_well_formed_provider_webhook_settings_are_accepted_and_the_secrets_not_shown() -> None:
    from tests.support.feedback import sendgrid_public_key

    settings = Settings.from_env(
        {
            **_PUBLIC,
            "SES_TOPIC_ARNS": "arn:aws:sns:us-east-1:123456789012:a, arn:aws-cn:sns:cn-north-1:123456789012:b.fifo",
            "SENDGRID_WEBHOOK_PUBLIC_KEY": sendgrid_public_key(),
            "POSTMARK_WEBHOOK_AUTH": "postmark:pm-password-0123456789",
            "MAILGUN_WEBHOOK_SIGNING_KEY": "mailgun-signing-key-0123456789",
        }
    )
    shown = repr(settings)
    assert "pm-password-0123456789" not in shown and "mailgun-signing-key-0123456789" not in shown
    assert "postmark_webhook_auth='***'" in shown and "mailgun_webhook_signing_key='***'" in shown
    assert Settings.from_env(settings.as_environ()) == settings


@pytest.mark.parametrize(
    ("variable", "raw", "named"),
    [
        ("SES_TOPIC_ARNS", "ses-feedback", "SES_TOPIC_ARNS"),
        ("SES_TOPIC_ARNS", "arn:aws:sqs:us-east-1:123456789012:q", "SES_TOPIC_ARNS"),
        ("SENDGRID_WEBHOOK_PUBLIC_KEY", "not base64!", "SENDGRID_WEBHOOK_PUBLIC_KEY"),
        # A valid key, but RSA rather than P-256: it would never verify a SendGrid post.
        (
            "SENDGRID_WEBHOOK_PUBLIC_KEY",
            "<an RSA key>",
            "SENDGRID_WEBHOOK_PUBLIC_KEY",
        ),
        ("POSTMARK_WEBHOOK_AUTH", "no-colon-here-0123456789", "POSTMARK_WEBHOOK_AUTH"),
        ("POSTMARK_WEBHOOK_AUTH", "user:short", "POSTMARK_WEBHOOK_AUTH"),
        ("POSTMARK_WEBHOOK_AUTH", ":password-0123456789", "POSTMARK_WEBHOOK_AUTH"),
        ("MAILGUN_WEBHOOK_SIGNING_KEY", "short", "MAILGUN_WEBHOOK_SIGNING_KEY"),
        ("SOFT_BOUNCE_LIMIT", "0", "SOFT_BOUNCE_LIMIT"),
        ("SOFT_BOUNCE_WINDOW_DAYS", "0", "SOFT_BOUNCE_WINDOW_DAYS"),
        ("SNS_TEST_CA_FILE", "/tmp/ca.pem", "SNS_TEST_CA_FILE"),
    ],
)
def test_a_provider_webhook_setting_that_would_not_work_is_refused_naming_it_without_the_value(
    variable: str, raw: str, named: str
) -> None:
    if raw == "<an RSA key>":
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()
        der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        raw = base64.b64encode(der).decode()
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({**_PUBLIC, variable: raw})
    assert named in str(caught.value)
    if variable in ("POSTMARK_WEBHOOK_AUTH", "MAILGUN_WEBHOOK_SIGNING_KEY"):
        assert raw not in str(caught.value)


def test_the_tests_trust_file_is_honoured_only_with_a_loopback_public_base_url() -> None:
    settings = Settings.from_env({"SNS_TEST_CA_FILE": "/tmp/ca.pem"})
    assert settings.sns_test_ca_file == "/tmp/ca.pem"


@pytest.mark.parametrize(
    ("fqdn", "mail_domain", "expected"),
    [
        ("worker-1.eu.example.com", "example.com", "worker-1.eu.example.com"),
        ("worker-1", "example.com", "example.com"),
        ("localhost", "example.com", "example.com"),
        ("localhost.localdomain", "example.com", "example.com"),
    ],
)
def test_the_ehlo_name_defaults_to_a_dotted_fqdn_else_the_senders_domain(
    fqdn: str, mail_domain: str, expected: str
) -> None:
    assert default_helo_name(fqdn, mail_domain) == expected


def test_smtp_helo_name_wins_and_must_be_a_host_name_or_an_address_literal() -> None:
    assert Settings.from_env({"SMTP_HELO_NAME": "mail.example.com"}).helo_name == "mail.example.com"
    assert Settings.from_env({"SMTP_HELO_NAME": "[192.0.2.1]"}).helo_name == "[192.0.2.1]"
    for bad in ("mail example.com", "mail.example.com\r\nRSET", "-bad.example.com"):
        with pytest.raises(ConfigurationError, match="SMTP_HELO_NAME"):
            Settings.from_env({"SMTP_HELO_NAME": bad})


@pytest.mark.parametrize(
    ("variable", "value"),
    [("BRAKE_FAILURE_THRESHOLD", "0"), ("BRAKE_WINDOW_SECONDS", "0"), ("BRAKE_WINDOW_SECONDS", "1e12")],
)
def test_the_brakes_settings_are_held_to_their_ranges(variable: str, value: str) -> None:
    with pytest.raises(ConfigurationError, match=variable):
        Settings.from_env({variable: value})


def test_a_send_time_and_a_default_zone_make_the_schedule_a_run_is_triggered_with() -> None:
    settings = Settings.from_env({"SEND_AT_LOCAL_TIME": "09:00", "DEFAULT_TIME_ZONE": "Asia/Tashkent"})
    assert settings.send_schedule == SendSchedule(time(9, 0), "Asia/Tashkent")
    assert Settings.from_env({}).send_schedule is None
