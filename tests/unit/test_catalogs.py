"""The shipped catalogs: every worded text of the v2 report and of the unsubscribe pages translated
in each language, with the same placeholders, and compiled (`scripts/catalogs`) into the .mo files
the processes read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from babel.messages.extract import extract_from_dir
from babel.messages.mofile import read_mo
from babel.messages.pofile import read_po

from reports.content.language import CATALOGS

ROOT = Path(__file__).resolve().parents[2]
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")

#: (domain, its catalogs' folder, where `scripts/catalogs` extracts its words from)
DOMAINS = {
    "report": (
        ROOT / "templates" / "v2" / "locale",
        (("reports/content/view.py", "python"), ("templates/v2/**.j2", "jinja2")),
    ),
    "pages": (ROOT / "reports" / "unsubscribe" / "locale", (("reports/unsubscribe/web.py", "python"),)),
}
EACH = [pytest.param(domain, catalog, id=f"{domain}-{catalog}") for domain in DOMAINS for catalog in CATALOGS]


def source_words(domain: str) -> set[str]:
    """The English texts of ``domain``, as `scripts/catalogs` extracts them."""
    method_map = list(DOMAINS[domain][1])
    words = set()
    for _file, _line, message, _comments, _context in extract_from_dir(str(ROOT), method_map=method_map):
        words.add(message[0] if isinstance(message, tuple) else message)
    return words


def _key(message_id: str | tuple[str, ...] | list[str]) -> str:
    return message_id if isinstance(message_id, str) else message_id[0]


def _strings(string: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return (string,) if isinstance(string, str) else tuple(string)


@pytest.mark.parametrize(("domain", "catalog"), EACH)
def test_every_worded_text_is_translated_with_the_same_placeholders(domain: str, catalog: str) -> None:
    with (DOMAINS[domain][0] / catalog / "LC_MESSAGES" / f"{domain}.po").open("rb") as po:
        messages = {_key(m.id): m for m in read_po(po) if m.id}
    assert set(messages) == source_words(domain), "run scripts/catalogs, then translate what it added"
    for word, message in messages.items():
        assert not message.fuzzy, word
        for translation in _strings(message.string):
            assert translation, f"{catalog} has no translation of {word!r}"
            assert set(_PLACEHOLDER.findall(translation)) == set(_PLACEHOLDER.findall(word)), (catalog, word)


@pytest.mark.parametrize(("domain", "catalog"), EACH)
def test_the_compiled_catalog_holds_what_the_po_file_says(domain: str, catalog: str) -> None:
    folder = DOMAINS[domain][0] / catalog / "LC_MESSAGES"
    with (folder / f"{domain}.po").open("rb") as po, (folder / f"{domain}.mo").open("rb") as mo:
        written = {_key(m.id): _strings(m.string) for m in read_po(po) if m.id}
        compiled = {_key(m.id): _strings(m.string) for m in read_mo(mo) if m.id}
    assert compiled == written, "run scripts/catalogs to compile the catalogs"
