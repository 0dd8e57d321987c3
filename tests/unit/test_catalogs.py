"""The shipped catalogs: every worded text of each template version's report (v2 on) and of the
unsubscribe pages translated in each language, with the same placeholders, and compiled
(`scripts/catalogs`) into the .mo files the processes read; and `scripts/catalogs` itself, which
finds a new version folder by itself."""

from __future__ import annotations

import filecmp
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from babel.messages.extract import DEFAULT_KEYWORDS, check_and_call_extract_file
from babel.messages.frontend import parse_mapping_cfg
from babel.messages.mofile import read_mo
from babel.messages.pofile import read_po

from reports.content.language import CATALOGS
from reports.content.render import STYLESHEET, render
from tests.unit.test_render import summary_factory

ROOT = Path(__file__).resolve().parents[2]
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")

#: The template versions with catalogs: those with a stylesheet (v2 on); v1 is English only.
VERSIONS = sorted(folder.name for folder in (ROOT / "templates").iterdir() if (folder / STYLESHEET).is_file())


def _report(version: str) -> tuple[Path, tuple[str, ...]]:
    """The version's catalogs' folder, and the files `scripts/catalogs` extracts its words from."""
    folder = ROOT / "templates" / version
    return folder / "locale", (
        "reports/content/view.py",
        *sorted(str(p.relative_to(ROOT)) for p in folder.rglob("*.j2")),
    )


#: (domain, its catalogs' folder, the files `scripts/catalogs` extracts its words from), by name
DOMAINS = {
    **{f"report-{version}": ("report", *_report(version)) for version in VERSIONS},
    "pages": ("pages", ROOT / "reports" / "unsubscribe" / "locale", ("reports/unsubscribe/web.py",)),
}
EACH = [pytest.param(name, catalog, id=f"{name}-{catalog}") for name in DOMAINS for catalog in CATALOGS]


def source_words(name: str) -> set[str]:
    """The English texts of ``name``, as `scripts/catalogs` extracts them: the report's read as
    babel.cfg says, the pages' as pybabel reads Python by default."""
    method_map: list[tuple[str, str]] = [("**.py", "python")]
    options_map: dict[str, dict[str, object]] = {}
    if DOMAINS[name][0] == "report":
        with (ROOT / "babel.cfg").open() as config:
            method_map, options_map = parse_mapping_cfg(config)
    words = set()
    for path in DOMAINS[name][2]:
        for _file, _line, message, _comments, _context in check_and_call_extract_file(
            ROOT / path, method_map, options_map, None, DEFAULT_KEYWORDS, (), False, dirpath=ROOT
        ):
            words.add(message[0] if isinstance(message, tuple) else message)
    return words


def _key(message_id: str | tuple[str, ...] | list[str]) -> str:
    return message_id if isinstance(message_id, str) else message_id[0]


def _strings(string: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return (string,) if isinstance(string, str) else tuple(string)


def test_the_shipped_version_has_catalogs() -> None:
    assert "v2" in VERSIONS


@pytest.mark.parametrize(("name", "catalog"), EACH)
def test_every_worded_text_is_translated_with_the_same_placeholders(name: str, catalog: str) -> None:
    domain, folder, _sources = DOMAINS[name]
    with (folder / catalog / "LC_MESSAGES" / f"{domain}.po").open("rb") as po:
        messages = {_key(m.id): m for m in read_po(po) if m.id}
    words = source_words(name)
    assert words, f"babel.cfg reads no words from {name}'s files"
    assert set(messages) == words, "run scripts/catalogs, then translate what it added"
    for word, message in messages.items():
        assert not message.fuzzy, word
        for translation in _strings(message.string):
            assert translation, f"{catalog} has no translation of {word!r}"
            assert set(_PLACEHOLDER.findall(translation)) == set(_PLACEHOLDER.findall(word)), (catalog, word)


@pytest.mark.parametrize(("name", "catalog"), EACH)
def test_the_compiled_catalog_holds_what_the_po_file_says(name: str, catalog: str) -> None:
    domain, folder, _sources = DOMAINS[name]
    folder = folder / catalog / "LC_MESSAGES"
    with (folder / f"{domain}.po").open("rb") as po, (folder / f"{domain}.mo").open("rb") as mo:
        written = {_key(m.id): _strings(m.string) for m in read_po(po) if m.id}
        compiled = {_key(m.id): _strings(m.string) for m in read_mo(mo) if m.id}
    assert compiled == written, "run scripts/catalogs to compile the catalogs"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """What `scripts/catalogs` reads and writes, copied from the repository, with its virtualenv."""
    copy = tmp_path / "checkout"
    for path in ("babel.cfg", "scripts/catalogs", "reports/content/view.py", "reports/unsubscribe/web.py"):
        (copy / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, copy / path)
    shutil.copytree(ROOT / "reports" / "unsubscribe" / "locale", copy / "reports" / "unsubscribe" / "locale")
    shutil.copytree(ROOT / "templates", copy / "templates")
    (copy / ".venv").symlink_to((ROOT / ".venv").resolve())
    return copy


def run_catalogs(checkout: Path) -> str:
    result = subprocess.run(
        [str(checkout / "scripts" / "catalogs")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_scripts_catalogs_extracts_and_compiles_a_new_version_folder_and_leaves_the_shipped_ones(checkout):
    v3 = checkout / "templates" / "v3"
    v3.mkdir()
    for part in ("subject.txt.j2", "report.txt.j2", "report.html.j2", STYLESHEET):
        shutil.copy2(checkout / "templates" / "v2" / part, v3 / part)
    html = v3 / "report.html.j2"
    html.write_text(
        html.read_text().replace("</h1>", "</h1>\n  <p>{% trans %}Thank you for reading{% endtrans %}</p>", 1)
    )

    output = run_catalogs(checkout)

    assert "templates/v3/locale/tr/LC_MESSAGES/report.po: copied from templates/v2" in output
    assert "Thank you for reading" in (v3 / "locale" / "report.pot").read_text()
    for catalog in CATALOGS:
        folder = v3 / "locale" / catalog / "LC_MESSAGES"
        with (folder / "report.po").open("rb") as po:
            messages = {_key(m.id): _strings(m.string) for m in read_po(po) if m.id}
        # The words v2 had keep their translation; the new one waits for a translator.
        assert messages.pop("Thank you for reading") == ("",)
        with (checkout / "templates" / "v2" / "locale" / catalog / "LC_MESSAGES" / "report.po").open("rb") as po:
            assert messages == {_key(m.id): _strings(m.string) for m in read_po(po) if m.id}
        assert (folder / "report.mo").is_file()
    # v3 now writes Turkish as v2 does, its new words in English until translated.
    rendered = render(checkout / "templates", "v3", name="Ayşe", summary=summary_factory(), locale="tr")
    assert "Merhaba Ayşe," in rendered.text and "Thank you for reading" in rendered.html
    # The shipped catalogs come out of it as they went in.
    for folder in (ROOT / "templates" / "v2" / "locale", ROOT / "reports" / "unsubscribe" / "locale"):
        copied = checkout / folder.relative_to(ROOT)
        for original in folder.rglob("*.*"):
            assert filecmp.cmp(original, copied / original.relative_to(folder), shallow=False), original
