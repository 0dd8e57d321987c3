"""Every numeric setting's edges: the lowest and highest values accepted, and the nearest refused.

The table is written out rather than derived from the settings module, so that moving an edge is
a change a reviewer sees here. Each edge is where the code that uses the setting stops working:
a window of 0 ms that Redis refuses as an expiry or that forgets each failure as it counts it, a
send or a coordinator slice longer than the time limit every message runs under, a pause longer
than the broker's delay queue keeps a message.
"""

from __future__ import annotations

from dataclasses import fields

import pytest

from reports.errors import ConfigurationError
from reports.settings import ENVIRONMENT, Settings

#: variable: (lowest accepted, highest accepted, just below, just above, other variables each needs).
EDGES: dict[str, tuple[str, str, str, str, dict[str, str]]] = {
    "PLAN_PAGE_SIZE": ("1", "100000", "0", "100001", {}),
    "PLAN_HIGH_WATER": ("1", "1000000000", "0", "1000000001", {}),
    "HEARTBEAT_TIMEOUT_MS": ("1000", "316224000000", "999", "316224000001", {}),
    "MAINTENANCE_CHANCE": ("0", "1000000", "-1", "1000001", {}),
    "MAX_RETRIES": ("0", "1000", "-1", "1001", {}),
    # SQS's own limits: a visibility timeout of 12 hours at most, a maxReceiveCount of 1 to 1,000.
    "SQS_VISIBILITY_TIMEOUT_SECONDS": ("1", "43200", "0", "43201", {}),
    "SQS_MAX_RECEIVE_COUNT": ("1", "1000", "0", "1001", {}),
    "MIN_BACKOFF_MS": ("1", "518400000", "0", "518400001", {"MAX_BACKOFF_MS": "518400000"}),
    "MAX_BACKOFF_MS": ("1", "518400000", "0", "518400001", {"MIN_BACKOFF_MS": "1"}),
    "BREAKER_FAILURE_THRESHOLD": ("1", "1000000000", "0", "1000000001", {}),
    "BRAKE_FAILURE_THRESHOLD": ("1", "1000000000", "0", "1000000001", {}),
    "SCHEDULE_LOOKBACK_MONTHS": ("1", "120", "0", "121", {}),
    "SEND_RATE_PER_SECOND": ("0.001", "100000", "0", "100000.5", {}),
    "SEND_RATE_BURST": ("1", "1000000000", "0", "1000000001", {}),
    "RETENTION_MONTHS": ("1", "1200", "0", "1201", {}),
    "WEB_MAX_CONNECTIONS": ("1", "1000000000", "0", "1000000001", {}),
    "SOFT_BOUNCE_LIMIT": ("1", "1000000000", "0", "1000000001", {}),
    "SOFT_BOUNCE_WINDOW_DAYS": ("1", "3660", "0", "3661", {}),
    # The whole send runs inside one message: past half the time limit it could be killed mid-send.
    "SMTP_TIMEOUT_SECONDS": ("0.001", "300", "0.0009", "300.001", {"CLAIM_LEASE_SECONDS": "302"}),
    "PLAN_SLICE_SECONDS": ("0.001", "300", "0.0009", "300.001", {}),
    "CLAIM_LEASE_SECONDS": ("2.001", "316224000", "2", "316224000.5", {"SMTP_TIMEOUT_SECONDS": "0.001"}),
    "WEB_READ_TIMEOUT_SECONDS": ("0.001", "316224000", "0", "316224000.5", {}),
    # 0 made a breaker that never opens: the window forgot each failure as it counted it.
    "BREAKER_WINDOW_SECONDS": ("0.001", "316224000", "0", "316224000.5", {}),
    "BRAKE_WINDOW_SECONDS": ("0.001", "316224000", "0", "316224000.5", {}),
    # A report waits out the cool-down as a delayed message.
    "BREAKER_COOLDOWN_SECONDS": ("0.001", "518400", "0.0009", "518400.5", {}),
    "DEAD_LETTER_SWEEP_SECONDS": ("1", "316224000", "0.999", "316224000.5", {}),
    # 0 sent SET … PX 0, which Redis refuses: no alert, and a thread that spun on the error.
    "ALERT_WINDOW_SECONDS": ("1", "316224000", "0", "316224000.5", {}),
    "SCHEDULE_RECONCILE_INTERVAL_SECONDS": ("1", "316224000", "0.999", "316224000.5", {}),
    "RECONCILE_STUCK_AFTER_SECONDS": ("0", "316224000", "-0.001", "316224000.5", {}),
    "PLAN_PAUSE_SECONDS": ("0", "518400", "-0.001", "518400.5", {}),
    "EXPORTER_CACHE_SECONDS": ("0", "316224000", "-0.001", "316224000.5", {}),
    # A login cookie's max-age is whole seconds.
    "CONSOLE_SESSION_SECONDS": ("1", "316224000", "0.999", "316224000.5", {}),
}


def _numeric(annotation: object) -> bool:
    return any(kind in str(annotation) for kind in ("int", "float"))


def test_every_numeric_setting_has_its_edges_in_this_table() -> None:
    numeric = {ENVIRONMENT[f.name] for f in fields(Settings) if _numeric(f.type)}
    assert numeric == set(EDGES)


@pytest.mark.parametrize("variable", EDGES)
def test_the_lowest_and_highest_values_of_each_setting_are_accepted(variable: str) -> None:
    lowest, highest, _below, _above, others = EDGES[variable]
    for raw in (lowest, highest):
        settings = Settings.from_env({**others, variable: raw})
        name = next(name for name, v in ENVIRONMENT.items() if v == variable)
        assert getattr(settings, name) == float(raw)


@pytest.mark.parametrize("variable", EDGES)
def test_a_value_just_outside_each_setting_is_refused_in_one_line_naming_it_and_its_range(variable: str) -> None:
    _lowest, _highest, below, above, others = EDGES[variable]
    for raw in (below, above):
        with pytest.raises(ConfigurationError) as caught:
            Settings.from_env({**others, variable: raw})
        message = str(caught.value)
        assert message.startswith(f"{variable} must be") and "\n" not in message, message


def test_a_zero_reconcile_interval_still_means_never() -> None:
    assert Settings.from_env({"SCHEDULE_RECONCILE_INTERVAL_SECONDS": "0"}).schedule_reconcile_interval_seconds == 0
