"""Where the tests run: the repository, the services' addresses, and what a missing service does.

Services are found at the usual local addresses (override with TEST_POSTGRES_URL, TEST_REDIS_URL
and TEST_RABBITMQ_URL). Locally a missing service skips its tests; in CI (``CI`` set) it fails them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

POSTGRES_ADMIN_URL = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
#: The RabbitMQ node's default vhost: tests never use it, each makes a vhost of its own there.
RABBITMQ_URL = os.environ.get("TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672")
IN_CI = bool(os.environ.get("CI"))
#: Every `reports` command a test runs starts a new interpreter, as an operator's does, rather than
#: forking from the test process's command server (tests/support/command_server.py).
NEW_INTERPRETER_PER_COMMAND = bool(os.environ.get("TEST_NEW_INTERPRETER_PER_COMMAND"))
REPO = Path(__file__).resolve().parent.parent.parent


def missing(message: str) -> NoReturn:
    """A service or tool the test needs is not there: skip locally, fail in CI (which installs it)."""
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def unavailable(what: str, error: Exception) -> NoReturn:
    missing(f"{what} is not reachable ({type(error).__name__}: {error})")
