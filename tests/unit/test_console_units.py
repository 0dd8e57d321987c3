"""The console's pure parts: CONSOLE_USERS parsing, passwords, the pace of a run, and
`reports console hash-password`."""

from __future__ import annotations

import pytest
from argon2 import PasswordHasher, extract_parameters
from click.testing import CliRunner

from reports.cli import cli
from reports.console import inputs, passwords
from reports.console.pace import Sampler, describe_eta, pace
from reports.console_settings import ConsoleUser, Role, users
from reports.errors import BadInput, ConfigurationError
from reports.settings import Settings

_CHEAP = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)
HASH = _CHEAP.hash("a long enough password")


def test_console_users_parse_names_roles_and_hashes_that_hold_commas():
    assert "," in HASH  # m=8,t=1,p=1
    found = users(Settings(console_users=f"ada:admin:{HASH}, vic:viewer:{HASH}"))
    assert list(found) == ["ada", "vic"]
    assert found["ada"] == ConsoleUser("ada", Role.ADMIN, HASH) and found["vic"].role == Role.VIEWER
    assert users(Settings()) == {}


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("ada:admin", "the entry for 'ada' is not"),
        (f"ada:root:{HASH}", "roles are admin and viewer"),
        (f"ada:admin:{HASH},ada:viewer:{HASH}", "names 'ada' twice"),
        ("ada:admin:plaintext-password", "the entry for 'ada' is not"),
        (f"a:b:c:admin:{HASH}", "is not"),
    ],
)
def test_a_malformed_console_users_stops_start_up_in_one_line_without_the_hash(raw, says):
    with pytest.raises(ConfigurationError) as error:
        Settings(console_users=raw)
    assert says in str(error.value) and HASH not in str(error.value) and "\n" not in str(error.value)


def test_a_short_console_secret_is_refused():
    with pytest.raises(ConfigurationError, match="CONSOLE_SECRET must be at least 32"):
        Settings(console_secret="short")


def test_settings_repr_shows_no_console_hash_or_secret():
    shown = repr(Settings(console_users=f"ada:admin:{HASH}", console_secret="s" * 40))
    assert HASH not in shown and "s" * 40 not in shown and "ada" not in shown


def test_a_password_verifies_only_for_its_user_and_an_unknown_name_costs_the_same():
    ada = ConsoleUser("ada", Role.ADMIN, HASH)
    decoy = passwords.decoy([ada])
    assert extract_parameters(decoy) == extract_parameters(HASH)
    assert passwords.verify(ada, "a long enough password", decoy=decoy)
    assert not passwords.verify(ada, "a wrong password", decoy=decoy)
    assert not passwords.verify(None, "a long enough password", decoy=decoy)
    assert not passwords.verify(ConsoleUser("bob", Role.ADMIN, "$argon2id$broken"), "x", decoy=decoy)


@pytest.mark.parametrize(
    ("samples", "pending", "rate", "eta"),
    [
        ([], 10, None, None),
        ([(0.0, 0)], 10, None, None),
        ([(0.0, 0), (0.5, 5)], 10, None, None),  # too short a span
        ([(0.0, 0), (2.0, 10)], 30, 5.0, 6.0),
        ([(0.0, 4), (10.0, 4)], 3, 0.0, None),  # stalled: no ETA
        ([(0.0, 0), (2.0, 10)], 0, 5.0, 0.0),
    ],
)
def test_the_pace_is_the_recent_rate_and_the_time_left_at_it(samples, pending, rate, eta):
    assert (pace(samples, pending).per_second, pace(samples, pending).eta_seconds) == (rate, eta)


def test_the_sampler_forgets_old_reads_and_starts_over_when_items_go_back_to_pending():
    sampler = Sampler()
    sampler.add("2026-10", 0.0, 0, 100)
    assert sampler.add("2026-10", 10.0, 20, 80).per_second == 2.0
    assert sampler.add("2026-10", 65.0, 130, 0).per_second == 2.0  # the first read is past the window
    assert sampler.add("2026-10", 66.0, 50, 70).per_second is None  # a replay reset items


@pytest.mark.parametrize(("seconds", "text"), [(None, "—"), (12, "12 s"), (240, "4 min"), (7500, "2 h 5 min")])
def test_an_eta_reads_in_the_largest_sensible_unit(seconds, text):
    assert describe_eta(seconds) == text


def test_hash_password_reads_one_password_per_line_from_standard_input_and_prints_one_hash_each():
    result = CliRunner().invoke(cli, ["console", "hash-password"], input="first password one\nsecond password two\n")
    assert result.exit_code == 0, result.output
    first, second = result.output.splitlines()
    assert PasswordHasher().verify(first, "first password one") and PasswordHasher().verify(
        second, "second password two"
    )
    assert first.startswith("$argon2id$") and extract_parameters(first) == extract_parameters(
        PasswordHasher().hash("x")
    )
    # The hash works as a CONSOLE_USERS entry.
    assert users(Settings(console_users=f"ada:admin:{first}"))["ada"].password_hash == first


@pytest.mark.parametrize(
    ("given", "says"), [("", "No password"), ("short\n", "12 to 1024"), ("long enough pass\n\n", "line 2")]
)
def test_hash_password_rejects_bad_input_and_prints_no_hash(given, says):
    result = CliRunner().invoke(cli, ["console", "hash-password"], input=given)
    assert result.exit_code != 0 and "$argon2" not in result.output
    assert says in str(result.exception) or says in result.output


@pytest.mark.parametrize("text", ["-5", "0", "1", "-2147483648", "2147483647", " 7 "])
def test_the_consoles_user_field_takes_any_32_bit_id(text: str) -> None:
    assert inputs.user_id(text) == int(text)


@pytest.mark.parametrize("text", ["", "x", "-0", "07", "1.5", "2147483648", "-2147483649", "+3"])
def test_the_consoles_user_field_refuses_what_is_not_a_32_bit_id(text: str) -> None:
    with pytest.raises(BadInput, match="from -2147483648 to 2147483647"):
        inputs.user_id(text)
