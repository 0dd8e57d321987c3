"""MkDocs hook: the reference pages' tables, generated from the code at every build so they cannot drift.

A page asks for a table with a marker line, ``<!-- generated: NAME -->``, which this hook replaces:

* ``settings``: every field of :class:`reports.settings.Settings`, with its environment variable
  (``ENVIRONMENT``), its default, what it accepts (``_RANGES``, the choice lists) and the ``#:``
  comment above the field;
* ``metrics``: every metric family ``reports/ops/metrics.py`` builds (name, type, labels, help),
  read from that module's source, so a family added there appears here;
* ``schema``: every table of :mod:`reports.models` (columns, types as PostgreSQL spells them,
  nullability, keys, indexes, the ``#:`` comments and the class docstrings), and the values of
  its enumerations.

The command reference is mkdocs-click's (``::: mkdocs-click`` in ``reference/cli.md``).
"""

from __future__ import annotations

import ast
import enum
import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

from sqlalchemy.dialects import postgresql

REPO = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- generated: ([a-z]+) -->$", re.MULTILINE)


def on_page_markdown(markdown: str, **_kwargs: Any) -> str:
    """MkDocs calls this for every page: expand its markers (an unknown one fails the build)."""

    def expand(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"Unknown generated table {name!r}; known: {', '.join(GENERATORS)}.")
        return GENERATORS[name]()

    return MARKER.sub(expand, markdown)


# --- the #: comments -------------------------------------------------------------------------


def attribute_docs(cls: type) -> dict[str, str]:
    """The ``#:`` comment lines directly above each attribute of ``cls`` (and of its bases), joined."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("reports"):
            continue
        lines, _first = inspect.getsourcelines(klass)
        tree = ast.parse("".join(lines))
        [node] = [n for n in tree.body if isinstance(n, ast.ClassDef)]
        for statement in node.body:
            target = _target(statement)
            if target is None:
                continue
            comment: list[str] = []
            row = statement.lineno - 2
            while row >= 0 and lines[row].strip().startswith("#:"):
                comment.insert(0, lines[row].strip().removeprefix("#:").strip())
                row -= 1
            if comment:
                docs[target] = " ".join(comment)
    return docs


def _target(statement: ast.stmt) -> str | None:
    if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
        return statement.target.id
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
        return statement.targets[0].id
    return None


def _rst_to_markdown(text: str) -> str:
    """Docstrings and comments write code as ``x`` and cross-references as :class:`x`: Markdown wants `x`."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _cell(text: str) -> str:
    return _rst_to_markdown(text).replace("|", "\\|").replace("\n", " ")


# --- settings --------------------------------------------------------------------------------


def settings_sections() -> str:
    from reports import settings as module

    docs = attribute_docs(module.Settings)
    choices = {
        "report_empty_month": module.EMPTY_MONTH_CHOICES,
        "log_level": module.LOG_LEVELS,
        "rabbitmq_queue_type": module.QUEUE_TYPES,
        "worker_cpu_affinity": module.CPU_AFFINITY_CHOICES,
    }
    sections = []
    # The defaults as a process sees them: DATABASE_URL's is worked out from VAR_DIR's.
    defaults = module.Settings()
    for field in fields(module.Settings):
        variable = module.ENVIRONMENT[field.name]
        if field.name in module._RANGES:
            accepts = module._RANGES[field.name].describe()
        elif field.name in choices:
            accepts = "one of " + ", ".join(f"`{c}`" for c in choices[field.name])
        else:
            accepts = _kind(field.type)
        default = getattr(defaults, field.name)
        doc = _as_variables(_rst_to_markdown(docs.get(field.name, "")), module.ENVIRONMENT)
        sections.append(
            f"### `{variable}` {{ #{variable} }}\n\n{doc}\n\n"
            f"Default: {_default(default)}. Accepts: {_rst_to_markdown(accepts)}.\n"
        )
    return "\n".join(sections)


def _as_variables(text: str, environment: dict[str, str]) -> str:
    """The comments name fields (`var_dir`) and Python's `None`: the reader sets VAR_DIR, or leaves it unset."""
    text = re.sub(r"`([a-z_]+)`", lambda m: f"`{environment.get(m.group(1), m.group(1))}`", text)
    return text.replace("`None`", "unset")


def _anchor(name: str) -> str:
    """An id to link to one row from elsewhere: ``metrics.md#reports_queue_messages``."""
    return f'<span id="{name}"></span>'


def _kind(annotation: object) -> str:
    text = str(annotation)
    optional = " (or unset)" if "None" in text else ""
    for name, kind in (("Path", "a path"), ("float", "a number"), ("int", "a whole number"), ("str", "text")):
        if name in text:
            return kind + optional
    return text


def _default(value: object) -> str:
    if value is None or value == "":
        return "unset"
    if isinstance(value, Path):
        # Absolute defaults are this repository's folders: say so, not where the docs were built.
        return f"`{value.relative_to(REPO)}/` of the repository" if value.is_absolute() else f"`{value}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value:,}`" if isinstance(value, int) and not isinstance(value, bool) else f"`{value}`"


# --- metrics ---------------------------------------------------------------------------------

#: What prometheus_client appends to a family's name on the wire, by type.
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def metric_families() -> list[dict[str, Any]]:
    """Every ``*MetricFamily(name, help, labels=[…])`` that reports/ops/metrics.py builds, in order."""
    source = (REPO / "reports" / "ops" / "metrics.py").read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.endswith("MetricFamily")
        ):
            continue
        name, documentation = (ast.literal_eval(arg) for arg in node.args[:2])
        labels = next((ast.literal_eval(k.value) for k in node.keywords if k.arg == "labels"), [])
        kind = node.func.id.removesuffix("MetricFamily").lower()
        found.append({"name": name, "type": kind, "help": documentation, "labels": labels, "line": node.lineno})
    return sorted(found, key=lambda family: family["line"])


def metrics_table() -> str:
    rows = ["| metric | type | labels | what |", "|---|---|---|---|"]
    for family in metric_families():
        names = [family["name"] + suffix for suffix in _SUFFIXES.get(family["type"], ("",))]
        shown = "<br>".join(f"`{n}`" for n in names)
        labels = ", ".join(f"`{label}`" for label in family["labels"]) or "none"
        rows.append(f"| {_anchor(family['name'])}{shown} | {family['type']} | {labels} | {_cell(family['help'])} |")
    return "\n".join(rows)


# --- schema ----------------------------------------------------------------------------------


def schema_tables() -> str:
    from reports import models

    mapped = {m.class_.__tablename__: m.class_ for m in models.Base.registry.mappers}
    out: list[str] = []
    # In the order models.py declares them: the tables you load first, then the system's own.
    for table in models.Base.metadata.tables.values():
        cls = mapped[table.name]
        docs = attribute_docs(cls)
        out.append(f"## `{table.name}` {{ #{table.name} }}\n")
        if cls.__doc__:
            out.append(_rst_to_markdown(inspect.cleandoc(cls.__doc__)) + "\n")
        out.append("| column | type | null | key | what |\n|---|---|---|---|---|")
        for column in table.columns:
            keys = ["primary key"] if column.primary_key else []
            keys += [f"→ `{fk.target_fullname}`" for fk in column.foreign_keys]
            keys += ["unique"] if column.unique else []
            kind = column.type.compile(dialect=postgresql.dialect()).lower()
            nullable = "yes" if column.nullable else "no"
            doc = docs.get(column.key, "")
            default = getattr(column.default, "arg", None)
            if isinstance(default, enum.Enum) and type(default).__name__ not in doc:
                doc = f"{doc} One of [`{type(default).__name__}`](#{type(default).__name__.lower()}).".strip()
            out.append(f"| `{column.name}` | {kind} | {nullable} | {', '.join(keys)} | {_cell(doc)} |")
        indexes = sorted(table.indexes, key=lambda index: index.name or "")
        if indexes:
            out.append("\nIndexes: " + "; ".join(_index(index) for index in indexes) + ".")
        out.append("")
    out.append(_enumerations(models))
    return "\n".join(out)


def _index(index: Any) -> str:
    columns = ", ".join(c.name for c in index.columns)
    where = index.dialect_options["postgresql"].get("where")
    return f"`{index.name}` on ({columns})" + (f" where `{where}`" if where is not None else "")


def _enumerations(module: Any) -> str:
    out = ["## Values\n", "The text columns that hold a state or a reason take these values.\n"]
    for name, cls in inspect.getmembers(module, lambda m: inspect.isclass(m) and issubclass(m, enum.Enum)):
        if cls.__module__ != module.__name__:
            continue
        docs = attribute_docs(cls)
        out.append(f"### `{name}` {{ #{name.lower()} }}\n")
        out.extend(
            f"- `{member.value}`" + (f": {_rst_to_markdown(docs[member.name])}" if member.name in docs else "")
            for member in cls
        )
        out.append("")
    return "\n".join(out)


GENERATORS: dict[str, Callable[[], str]] = {
    "settings": settings_sections,
    "metrics": metrics_table,
    "schema": schema_tables,
}


def every_marker(docs_dir: Path) -> Iterator[tuple[Path, str]]:
    """The markers of every page under ``docs_dir``: for the test that each one is known."""
    for page in sorted(docs_dir.rglob("*.md")):
        for match in MARKER.finditer(page.read_text()):
            yield page, match.group(1)
