"""Only the store's adapters, the engine, the dialect-aware statements and the migrations name a database."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[2] / "reports"

#: Where a database's dialect may be named: the engine, the statements compiled per dialect, the
#: migrations, the store's adapters, PostgreSQL's monthly partitions, and the check that
#: DATABASE_URL names a known one.
ALLOWED = ("database.py", "sql.py", "migrations/", "delivery/store/", "partitions.py", "endpoints.py")


def _names_a_dialect(source: str) -> list[str]:
    """The code (not comments or docs) that asks for a dialect or compares with a dialect's name."""
    return [
        f"{token.start[0]}: {token.line.strip()}"
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if (token.type == tokenize.NAME and "dialect" in token.string)
        or (token.type == tokenize.STRING and token.string.strip("'\"") in {"sqlite", "postgresql"})
    ]


def test_no_flow_branches_on_the_database() -> None:
    offenders = {
        str(path.relative_to(LIBRARY)): lines
        for path in sorted(LIBRARY.rglob("*.py"))
        if not str(path.relative_to(LIBRARY)).startswith(ALLOWED)
        if (lines := _names_a_dialect(path.read_text()))
    }
    assert offenders == {}


def test_the_check_sees_a_branch() -> None:
    assert _names_a_dialect('if engine.dialect.name == "sqlite":\n    pass\n')
    assert not _names_a_dialect("# On SQLite, each step is a statement.\nx = 1\n")
