"""What every benchmark (and the test suite) sets up: a PostgreSQL database of its own, dropped after."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import psycopg

#: The server the benchmarks make their databases on (the test suite's variable).
ADMIN_URL = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextlib.contextmanager
def temporary_database(admin_url: str = ADMIN_URL, *, prefix: str = "reports_bench") -> Iterator[str]:
    """Create an empty database; yield its SQLAlchemy URL; drop it (and its connections) after."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    base = admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
