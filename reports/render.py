"""Render a report from the versioned Jinja2 templates: pure, no I/O beyond reading templates."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from reports.activity import Summary
from reports.errors import UnknownTemplateVersion

_PARTS = ("subject.txt.j2", "report.txt.j2", "report.html.j2")


@dataclass(frozen=True)
class RenderedReport:
    subject: str
    text: str
    html: str


def money(cents: int) -> str:
    """``123456`` → ``1,234.56``; negative amounts keep their sign."""
    sign = "-" if cents < 0 else ""
    whole, rest = divmod(abs(cents), 100)
    return f"{sign}{whole:,}.{rest:02d}"


def signed_money(cents: int) -> str:
    return ("+" if cents > 0 else "") + money(cents)


@lru_cache(maxsize=16)
def _environment(templates_dir: Path, version: str) -> jinja2.Environment:
    folder = templates_dir / version
    if not all((folder / part).is_file() for part in _PARTS):
        raise UnknownTemplateVersion(f"Template version {version!r} does not exist.")
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default_for_string=False),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    environment.filters["money"] = money
    environment.filters["signed_money"] = signed_money
    return environment


def render(templates_dir: Path, version: str, *, name: str | None, summary: Summary) -> RenderedReport:
    environment = _environment(templates_dir, version)
    context = {"name": name or "there", "period": summary.period, "summary": summary}
    subject = environment.get_template("subject.txt.j2").render(context)
    return RenderedReport(
        # A subject is one line whatever the template or the data do.
        subject=" ".join(subject.split()),
        text=environment.get_template("report.txt.j2").render(context),
        html=environment.get_template("report.html.j2").render(context),
    )
