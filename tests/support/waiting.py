"""Waiting for what another thread or process does."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_until(
    predicate: Callable[[], object], *, timeout: float, interval: float = 0.1, what: str = "condition"
) -> object:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"Timed out after {timeout}s waiting for {what}.")
        time.sleep(interval)
