"""Reading an SMTP provider's URL: ports, TLS modes, credentials, and secrets kept out of errors."""

from __future__ import annotations

import pytest

from reports.endpoints import SmtpTarget
from reports.errors import ConfigurationError


@pytest.mark.parametrize(
    ("url", "host", "port", "implicit_tls", "starttls"),
    [
        pytest.param("smtp://mail.example.com", "mail.example.com", 25, False, False, id="smtp-default-port"),
        pytest.param("smtp://mail.example.com:2525", "mail.example.com", 2525, False, False, id="smtp-own-port"),
        pytest.param("smtps://mail.example.com", "mail.example.com", 465, True, False, id="smtps-default-port"),
        pytest.param("smtps://mail.example.com:1465", "mail.example.com", 1465, True, False, id="smtps-own-port"),
        pytest.param("smtp://mail.example.com:587?starttls=true", "mail.example.com", 587, False, True, id="starttls"),
        pytest.param("smtp://mail.example.com:587?starttls=TRUE", "mail.example.com", 587, False, True, id="upper"),
        pytest.param("smtp://mail.example.com:587?starttls=1", "mail.example.com", 587, False, True, id="one"),
        pytest.param("smtp://mail.example.com:587?starttls=yes", "mail.example.com", 587, False, True, id="yes"),
        pytest.param("smtp://mail.example.com?starttls=false", "mail.example.com", 25, False, False, id="false"),
        pytest.param("smtp://mail.example.com?starttls=0", "mail.example.com", 25, False, False, id="zero"),
        pytest.param("smtp://127.0.0.1:1025", "127.0.0.1", 1025, False, False, id="ip-address"),
    ],
)
def test_the_url_gives_host_port_and_tls_mode(
    url: str, host: str, port: int, implicit_tls: bool, starttls: bool
) -> None:
    target = SmtpTarget.from_url(url)
    assert (target.host, target.port, target.implicit_tls, target.starttls) == (
        host,
        port,
        implicit_tls,
        starttls,
    )
    assert target.username is None and target.password is None


@pytest.mark.parametrize(
    ("url", "username", "password"),
    [
        ("smtp://user:secret@mail.example.com:25?starttls=true", "user", "secret"),
        ("smtps://us%40er:p%40ss%3Aw%2Fo%23rd@mail.example.com", "us@er", "p@ss:w/o#rd"),
        ("smtps://apikey:a%20b%25c@mail.example.com", "apikey", "a b%c"),
        ("smtp://user@mail.example.com?insecure_auth=true", "user", None),
    ],
)
def test_credentials_are_percent_decoded(url: str, username: str, password: str | None) -> None:
    target = SmtpTarget.from_url(url)
    assert (target.username, target.password) == (username, password)
    assert target.host == "mail.example.com"


@pytest.mark.parametrize(
    "url",
    ["ftp://mail.example.com", "smtp://", "smtp://mail.example.com:99999", "smtp://mail.example.com:abc"],
)
def test_a_bad_url_without_credentials_is_a_configuration_error_naming_smtp_url(url: str) -> None:
    with pytest.raises(ConfigurationError, match="SMTP_URL"):
        SmtpTarget.from_url(url)


def test_the_password_is_not_shown_in_the_targets_repr() -> None:
    # A target may end up in a log line or a traceback's locals.
    assert "s3cret" not in repr(SmtpTarget.from_url("smtps://user:s3cret@mail.example.com"))


@pytest.mark.parametrize(
    "url",
    [
        "smtp://user:s3cret@mail.example.com:587",
        "smtp://user:s3cret@mail.example.com:587?starttls=false",
        "smtp://user@mail.example.com:25",
    ],
)
def test_credentials_without_tls_are_refused(url: str) -> None:
    with pytest.raises(ConfigurationError, match="no TLS") as caught:
        SmtpTarget.from_url(url)
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        # Over loopback the credentials never leave the machine.
        "smtp://user:s3cret@127.0.0.1:2525",
        "smtp://user:s3cret@localhost:25",
        "smtp://user:s3cret@[::1]:25",
        # Elsewhere only when the URL says the relay is on this host.
        "smtp://user:s3cret@relay.internal:25?insecure_auth=true",
    ],
)
def test_credentials_without_tls_are_taken_for_a_relay_on_this_machine(url: str) -> None:
    target = SmtpTarget.from_url(url)
    assert (target.username, target.password, target.starttls, target.implicit_tls) == ("user", "s3cret", False, False)


@pytest.mark.parametrize("query", ["startls=true", "starttls=maybe", "tls=true", "starttls=true&debug=1", "ssl"])
def test_an_unknown_or_misspelled_option_is_refused_not_ignored(query: str) -> None:
    with pytest.raises(ConfigurationError, match="SMTP_URL takes only") as caught:
        SmtpTarget.from_url(f"smtp://user:s3cret@mail.example.com:587?{query}")
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("http://user:s3cret@mail.example.com:25", id="http"),
        pytest.param("smtpx://user:s3cret@mail.example.com:25", id="unknown-scheme"),
        pytest.param("SMTP_URL=smtp://user:s3cret@mail.example.com", id="not-a-url"),
        pytest.param("user:s3cret@mail.example.com:25", id="no-scheme"),
        pytest.param("smtp://user:s3cret@", id="no-host"),
        pytest.param("smtp://user:s3cret@mail.example.com:99999", id="port-out-of-range"),
        pytest.param("smtp://user:s3cret@mail.example.com:abc", id="port-not-a-number"),
        pytest.param("smtp://user:s3cr/et@mail.example.com:25", id="unencoded-slash-in-password"),
        pytest.param("smtp://user:s3cr#et@mail.example.com:25", id="unencoded-hash-in-password"),
        pytest.param("smtp://user:s3cr?et@mail.example.com:25", id="unencoded-question-mark-in-password"),
    ],
)
def test_a_bad_url_is_a_configuration_error_that_does_not_reveal_the_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        SmtpTarget.from_url(url)
    message = str(caught.value)
    assert "SMTP_URL" in message
    assert "s3cr" not in message
