"""The README and the docs site: no internal words, samples in step with what the commands print,
and a reference that names every command, setting, metric and table the code has.

The site is built once (``mkdocs build --strict``, as CI does) into a temporary folder, and the
built pages are read: what a reader of the site sees, not the Markdown before the hook ran.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import click
import pytest

from reports.cli import cli
from reports.models import Base
from reports.settings import ENVIRONMENT
from tests.support import docs
from tests.support.environment import REPO

DOCS = REPO / "docs"

#: Words that belong to how the project was made, not to what it is: a reader of the docs cannot
#: know what they mean. Each pattern is matched case-insensitively, and each was chosen so that the
#: same word in its ordinary technical sense passes (see the cases below):
#:
#: * issue numbers: "issue 14", "issues 5 and 19", "PR #3", "(#14)", "GH-14". A "#1" alone is
#:   allowed: `reports dlq list` prints dead-letter ids that way.
#: * "session" as a stretch of work: "this session", "an earlier session", "the session before".
#:   An SMTP session, a database session and `sessionmaker` are allowed.
#: * "the seeds" of the project ("the seeds' rules", "the seed's test"); the verb ("the demo seeds the
#:   users"), `reports seed` and "seeded" are allowed.
#: * "the contract" and CONTRACT.md; import-linter's "contracts" in pyproject.toml are allowed.
#: * "this branch", for the same reason as "this session".
INTERNAL_WORDS = {
    "an issue number": re.compile(r"\b(issues?|PRs?|pull requests?)\s+#?\d+|\(#\d+\)|\bGH-\d+", re.IGNORECASE),
    "a work session": re.compile(
        r"\b(this|that|earlier|previous|last|next|later|an earlier|a later|one) sessions?\b|\bsessions? (before|ago)\b",
        re.IGNORECASE,
    ),
    "the seeds": re.compile(r"\bthe seeds?\b|\bseeds'|\bseed's\b", re.IGNORECASE),
    "the contract": re.compile(r"\bthe contract\b|\bcontract's\b|CONTRACT\.md", re.IGNORECASE),
    "a branch": re.compile(r"\bthis branch\b", re.IGNORECASE),
}


def internal_words(text: str) -> list[str]:
    """Every internal word in ``text``, as "what: the words found"."""
    return [f"{what}: {m.group(0)!r}" for what, pattern in INTERNAL_WORDS.items() for m in pattern.finditer(text)]


@pytest.mark.parametrize(
    "text",
    [
        "As issue 14 asked, it is faster.",
        "Issues 5 and 19 are fixed.",
        "Fixed in PR #3.",
        "The walk is faster (#14).",
        "See GH-14.",
        "Measured in this session.",
        "An earlier session measured it.",
        "Before this session: 428 reports/s.",
        "The session before measured 166.",
        "The seeds' five rules.",
        "With the seed's six categories.",
        "Write the contract's tables.",
        "See CONTRACT.md.",
        "As the contract says.",
        "Before this branch it was slower.",
    ],
)
def test_an_internal_word_is_found(text: str) -> None:
    assert internal_words(text), text


@pytest.mark.parametrize(
    "text",
    [
        "#1  2026-12-01T06:00:00Z  2026-11  user 4  send_report_now  permanent after 1",
        "A 5xx to MAIL FROM says the SMTP session is wrong, not the address.",
        "Its one database session is never committed.",
        "from sqlalchemy.orm import Session, sessionmaker",
        "reports seed --users 10000 adds users; seeded by reports.ops.seed.seed.",
        "The demo seeds 2,000 users into SQLite.",
        "pyproject.toml's import-linter contracts hold the boundaries.",
        "An issue with your provider is not ours to fix.",
    ],
)
def test_an_ordinary_word_passes(text: str) -> None:
    assert internal_words(text) == [], text


def pages() -> Iterator[Path]:
    yield REPO / "README.md"
    yield from sorted(p for p in DOCS.rglob("*") if p.suffix in (".md", ".txt"))


def test_the_readme_and_the_docs_have_no_internal_words() -> None:
    found = {str(p.relative_to(REPO)): words for p in pages() if (words := internal_words(p.read_text()))}
    assert found == {}


def test_the_generated_reference_has_no_internal_words(hook: ModuleType) -> None:
    found = {name: words for name, make in hook.GENERATORS.items() if (words := internal_words(make()))}
    assert found == {}


def test_the_readme_fits_on_a_few_screens_and_keeps_its_two_commands_first() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    first_block = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    assert [line.split()[0] for line in first_block.splitlines()] == ["scripts/demo", "scripts/test"]


# --- samples ---------------------------------------------------------------------------------


def test_reports_h_prints_what_the_docs_show() -> None:
    """The one sample that depends on nothing but the code: it must be regenerated when it changes
    (scripts/docs-samples)."""
    result = subprocess.run(
        [sys.executable, "-m", "reports", "-h"],
        env={**os.environ, "COLUMNS": "80"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout == (DOCS / "samples" / "help.txt").read_text()


def test_the_readmes_sample_blocks_are_the_samples() -> None:
    samples = docs.load("scripts/docs_samples.py")
    readme = (REPO / "README.md").read_text()
    blocks = samples.README_BLOCK.findall(readme)
    assert {name for _indent, name in blocks} == {"demo", "procfile"}
    made = {name: (DOCS / "samples" / f"{name}.txt").read_text() for _indent, name in blocks}
    assert samples.README_BLOCK.sub(lambda m: samples._block(m[1], m[2], made[m[2]]), readme) == readme
    assert made["procfile"] == samples._procfile(), "the Procfile changed: run scripts/docs-samples"


# --- the built site --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hook() -> ModuleType:
    return docs.load("docs/hooks/reference.py")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--site-dir", str(folder)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return folder


def page_text(site: Path, page: str) -> str:
    return html.unescape((site / page / "index.html").read_text())


def ids(site: Path, page: str) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', (site / page / "index.html").read_text()))


def command_paths(group: click.Group, prefix: str = "reports") -> Iterator[str]:
    context = click.Context(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        yield f"{prefix} {name}"
        if isinstance(command, click.Group):
            yield from command_paths(command, f"{prefix} {name}")


def test_every_command_has_its_section_in_the_command_reference(site: Path) -> None:
    headings = {
        " ".join(re.sub(r"<[^>]+>", "", h).split()).removesuffix("¶")
        for h in re.findall(r"<h\d[^>]*>(.*?)</h\d>", page_text(site, "reference/cli"), re.DOTALL)
    }
    missing = [path for path in command_paths(cli) if path not in headings]
    assert len(list(command_paths(cli))) > 20
    assert missing == []


def test_every_setting_has_its_entry_in_the_settings_reference(site: Path) -> None:
    missing = [variable for variable in ENVIRONMENT.values() if variable not in ids(site, "reference/settings")]
    assert missing == []


def test_every_metric_the_exporter_builds_is_in_the_metrics_reference(site: Path, hook: ModuleType) -> None:
    families = [family["name"] for family in hook.metric_families()]
    assert len(families) > 10
    assert [name for name in families if name not in ids(site, "reference/metrics")] == []


def test_every_metric_named_in_the_code_the_docs_and_the_deploy_files_is_one_the_exporter_serves(
    hook: ModuleType,
) -> None:
    """A metric named in backticks in a docstring, a comment or a page, or in an alert rule or a
    panel, is one the exporter serves (with its counter or histogram suffix)."""
    served = {
        family["name"] + suffix
        for family in hook.metric_families()
        for suffix in ("", *hook._SUFFIXES.get(family["type"], ()))
    }
    sources = [
        *(path for folder in ("reports", "actors", "scheduler") for path in (REPO / folder).rglob("*.py")),
        *DOCS.rglob("*.md"),
        REPO / "README.md",
    ]
    named = {
        (path.relative_to(REPO).as_posix(), name)
        for path in sources
        for name in re.findall(r"`(reports_[a-z_]+)", path.read_text())
    }
    named |= {
        (path.relative_to(REPO).as_posix(), name)
        for path in (REPO / "deploy").rglob("*")
        if path.suffix in (".yml", ".json")
        for name in re.findall(r"\b(reports_[a-z_]+)", path.read_text())
    }
    assert len(named) > 20
    assert sorted((path, name) for path, name in named if name not in served) == []


def test_every_table_is_in_the_schema_reference(site: Path) -> None:
    tables = list(Base.metadata.tables)
    assert [table for table in tables if table not in ids(site, "reference/schema")] == []


def test_the_site_loads_nothing_from_elsewhere(site: Path) -> None:
    """No web fonts, scripts or styles from another host: the site reads offline."""
    external = {
        match
        for page in site.rglob("*.html")
        for match in re.findall(r'<(?:link|script|img)\b[^>]*\b(?:src|href)="((?:https?:)?//[^"]+)"', page.read_text())
    }
    assert external == set()
