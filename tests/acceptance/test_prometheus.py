"""The dashboard and the alert rules, proved: promtool checks and unit-tests the rules, and a real
Prometheus, scraping a real ``reports exporter`` during a real run, answers every PromQL expression
of the dashboard and of the rules with data of the expected shape."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from reports.fanout.progress import count
from reports.periods import Period
from tests.support.databases import load_users
from tests.support.environment import REPO, missing
from tests.support.processes import free_port, run_cli
from tests.support.waiting import wait_until

pytestmark = pytest.mark.acceptance

DASHBOARD = REPO / "deploy" / "grafana" / "reports-dashboard.json"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
ALERTS_TEST = REPO / "deploy" / "prometheus" / "alerts_test.yml"
EXAMPLE_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"

PERIOD = "2026-10"
USERS = 40
#: Users whose provider refuses their email for good: each becomes a dead letter.
REFUSED = (7, 19, 33)

#: Exporters that read the same database and Redis serve the same figures: a rolling deploy runs
#: two for a while, and an operator may keep a second for redundancy.
ONE_EXPORTER = ("10.0.0.1:9300",)
TWO_EXPORTERS = ("10.0.0.1:9300", "10.0.0.2:9300")

#: Metrics this run leaves without a single series: no scheduler runs.
#: A dashboard expression on any other metric must return data.
NO_DATA_IN_THIS_RUN = ("reports_scheduler_last_trigger_timestamp_seconds",)

#: Grafana's interval variables ($__rate_interval, ${__interval} ...), which Prometheus does not know.
_GRAFANA_INTERVAL = re.compile(r"\$\{?__\w+\}?")


def binary(name: str) -> str:
    """The path of ``name``; missing, the test fails in CI (``.ci/run`` installs it) and is skipped locally."""
    path = shutil.which(name)
    if path is None:
        missing(f"{name} is not installed (apt-get install prometheus; scripts/test installs it when missing)")
    return path


# --- Where the expressions come from -----------------------------------------------------------


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those inside (collapsed) rows."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", ())


def dashboard_expressions() -> list[tuple[str, str]]:
    """(panel title and refId, expression) of every target, Grafana's interval variables made ``1m``."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in panels(dashboard):
        for target in panel.get("targets", ()):
            expr = _GRAFANA_INTERVAL.sub("1m", target["expr"])
            assert "$" not in expr, f"an unknown Grafana variable in {panel['title']!r}: {expr}"
            found.append((f"panel {panel['title']!r} {target['refId']}", expr))
    return found


def alert_expressions() -> list[tuple[str, str]]:
    """(alert name, expression) of every rule in alerts.yml.

    Read with a few lines of code rather than a YAML library (the project has none): a rule starts
    at ``- alert:`` or ``- record:``, and its ``expr:`` is either on the line or a block scalar
    (``|``, ``>``) of the lines indented deeper. PromQL does not care which whitespace joins them.
    """
    lines = ALERTS.read_text().splitlines()
    found: list[tuple[str, str]] = []
    name = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if match := re.match(r"\s*- (?:alert|record):\s*(\S+)", line):
            name = match[1]
        elif match := re.match(r"(\s*)expr:\s*(.*)$", line):
            indent, value = len(match[1]), match[2].strip()
            assert name is not None, f"an expr before any rule name at line {i + 1}"
            if value[:1] in ("|", ">"):
                block = []
                while i + 1 < len(lines) and (
                    not lines[i + 1].strip() or len(lines[i + 1]) - len(lines[i + 1].lstrip()) > indent
                ):
                    i += 1
                    block.append(lines[i].strip())
                value = "\n".join(part for part in block if part)
            elif value[:1] in ("'", '"'):
                value = value[1:-1]
            found.append((name, value))
            name = None
        i += 1
    return found


def test_the_expression_sources_are_complete_and_the_panels_use_the_datasource_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "datasource"]
    assert (variable["type"], variable["query"]) == ("datasource", "prometheus")
    for panel in panels(dashboard):
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel.get("targets", ()):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
    assert len(dashboard_expressions()) >= 12
    names = [name for name, _ in alert_expressions()]
    assert names == re.findall(r"^\s*- alert:\s*(\S+)", ALERTS.read_text(), flags=re.MULTILINE)
    assert len(names) == 13


# --- promtool ----------------------------------------------------------------------------------


def test_promtool_checks_the_alert_rules():
    result = subprocess.run(
        [binary("promtool"), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 13 rules found" in result.stdout


def test_promtool_accepts_the_example_configuration():
    result = subprocess.run(
        [binary("promtool"), "check", "config", str(EXAMPLE_CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_every_alert():
    result = subprocess.run(
        [binary("promtool"), "test", "rules", str(ALERTS_TEST)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname:\s*(\S+)", ALERTS_TEST.read_text()))
    assert tested == {name for name, _ in alert_expressions()}


@pytest.mark.parametrize("instances", [ONE_EXPORTER, TWO_EXPORTERS], ids=["one exporter", "two exporters"])
def test_promtool_proves_the_period_completion_panel_shows_only_planned_periods(tmp_path, instances):
    """A period whose walk is under way has recorded only some of its users: finished over those
    would read nearly done; a period just triggered has none (0/0). Neither gets a bar. Two
    exporters serving the same figures show the same bars."""
    (expr,) = [
        target["expr"]
        for panel in panels(json.loads(DASHBOARD.read_text()))
        if panel["title"] == "Period completion"
        for target in panel["targets"]
    ]
    series = {
        # Planned: 1000 items, 500 delivered, 100 skipped, 50 dead.
        "2026-09": {"planned": 1, "total": 1000, "delivered": 500, "skipped": 100, "dead": 50},
        # Walk under way: 1000 users recorded of many more, 960 of them delivered.
        "2026-10": {"planned": 0, "total": 1000, "delivered": 960, "skipped": 0, "dead": 0},
        # Just triggered: nothing recorded yet.
        "2026-11": {"planned": 0, "total": 0, "delivered": 0, "skipped": 0, "dead": 0},
        # Planned with no user at all.
        "2026-12": {"planned": 1, "total": 0, "delivered": 0, "skipped": 0, "dead": 0},
    }
    lines = []
    for instance in instances:
        for period, figures in series.items():
            labels = f'job="reports", instance="{instance}", period="{period}"'
            lines.append(
                f"      - series: 'reports_period_planned{{{labels}}}'\n        values: '{figures['planned']}x5'"
            )
            lines.append(f"      - series: 'reports_period_total{{{labels}}}'\n        values: '{figures['total']}x5'")
            for state in ("delivered", "skipped", "dead"):
                lines.append(
                    f"      - series: 'reports_period_items{{{labels}, state=\"{state}\"}}'\n"
                    f"        values: '{figures[state]}x5'"
                )
    tests = tmp_path / "completion_test.yml"
    tests.write_text(
        "rule_files: []\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n"
        + "\n".join(lines)
        + f"\n    promql_expr_test:\n      - expr: {json.dumps(expr)}\n        eval_time: 2m\n"
        + "        exp_samples:\n          - labels: '{period=\"2026-09\"}'\n            value: 0.65\n"
    )
    result = subprocess.run(
        [binary("promtool"), "test", "rules", str(tests)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- Two exporters ------------------------------------------------------------------------------

#: An hour of one fleet's figures, a sample every 15 s.
FLEET_STEPS = 240
FLEET_STEP_SECONDS = 15


def fleet_series(end: int) -> dict[str, list[float]]:
    """One exporter's series (``name{labels}``, without job and instance) and their values at each
    step of the hour up to ``end`` (Unix time). Four periods: one complete; one stuck 8 hours after
    its trigger with 60 items pending that no morning waits for; one 7 hours after its trigger whose
    300 pending items all wait for their users' morning (not stuck); one under way."""
    steps = range(FLEET_STEPS + 1)
    series: dict[str, list[float]] = {}

    def put(name: str, value: Any, **labels: str) -> None:
        values = [float(value(i)) if callable(value) else float(value) for i in steps]
        text = ",".join(f'{key}="{label}"' for key, label in labels.items())
        series[f"{name}{{{text}}}"] = values

    periods = {
        "2026-08": {
            "pending": 0,
            "delivered": 950,
            "skipped": 20,
            "dead": 30,
            "scheduled": 0,
            "planned": 1,
            "hours": 900,
        },
        "2026-09": {
            "pending": 100,
            "delivered": 800,
            "skipped": 50,
            "dead": 50,
            "scheduled": 40,
            "planned": 1,
            "hours": 8,
        },
        "2026-10": {
            "pending": 300,
            "delivered": 650,
            "skipped": 30,
            "dead": 20,
            "scheduled": 300,
            "planned": 1,
            "hours": 7,
        },
    }
    for period, figures in periods.items():
        for state in ("pending", "delivered", "skipped", "dead"):
            put("reports_period_items", figures[state], period=period, state=state)
        put("reports_period_total", 1000, period=period)
        put("reports_period_scheduled", figures["scheduled"], period=period)
        put("reports_period_planned", figures["planned"], period=period)
        put("reports_period_cancelled", 0, period=period)
        put("reports_period_triggered_timestamp_seconds", end - figures["hours"] * 3600, period=period)
    # Under way: the walk records 2 users a step, the workers deliver 1 a step.
    put("reports_period_items", lambda i: i, period="2026-11", state="pending")
    put("reports_period_items", lambda i: i, period="2026-11", state="delivered")
    for state in ("skipped", "dead"):
        put("reports_period_items", 0, period="2026-11", state=state)
    put("reports_period_total", lambda i: 2 * i, period="2026-11")
    put("reports_period_scheduled", 0, period="2026-11")
    put("reports_period_planned", 0, period="2026-11")
    put("reports_period_cancelled", 0, period="2026-11")
    put("reports_period_triggered_timestamp_seconds", end - 3600, period="2026-11")
    for period, complaints, bounces in (("2026-08", 2, 19), ("2026-09", 4, 24)):
        delivered = periods[period]["delivered"]
        put("reports_period_complaints", complaints, period=period)
        put("reports_period_bounces", bounces, period=period)
        put("reports_period_complaint_rate", complaints / delivered, period=period)
        put("reports_period_bounce_rate", bounces / delivered, period=period)
    for queue, ready in (("critical", 150), ("default", 20), ("bulk", 500)):
        put("reports_queue_messages", ready, queue=queue, state="ready")
        put("reports_queue_messages", 3, queue=queue, state="delayed")
        put("reports_queue_messages", 8, queue=queue, state="in_progress")
        put("reports_queue_messages", 1, queue=queue, state="broker_dead")
        put("reports_queue_oldest_message_age_seconds", 700 if queue == "critical" else 30, queue=queue)
    put("reports_dead_letters_stored", 100, replayed="false")
    put("reports_dead_letters_stored", 20, replayed="true")
    put("reports_breaker_state", 2, breaker="mail")
    put("reports_scheduler_last_trigger_timestamp_seconds", end - 3600)
    for source in ("broker", "redis", "database"):
        put("reports_exporter_source_up", 1, source=source)
    # The counts of stored provider events, read from the database.
    put("reports_feedback_events_total", lambda i: 5 * i, provider="ses", kind="delivery")
    put("reports_feedback_events_total", lambda i: i // 4, provider="ses", kind="complaint")
    put("reports_feedback_unmatched_events_total", lambda i: i // 10, provider="ses")
    # The fleet-wide counters the workers keep in Redis.
    put("reports_dead_letters_total", lambda i: i // 4, queue="bulk", actor="build_report", reason="permanent")
    put("reports_breaker_transitions_total", lambda i: i // 40, breaker="mail", state="open")
    for outcome, per_step in (("success", 20), ("retry", 2), ("dead", 1)):
        put("reports_actor_outcomes_total", lambda i, n=per_step: n * i, actor="build_report", outcome=outcome)
    for le, per_step in (("1.0", 10), ("5.0", 18), ("10.0", 22), ("+Inf", 23)):
        put("reports_actor_duration_seconds_bucket", lambda i, n=per_step: n * i, actor="build_report", le=le)
    put("reports_actor_duration_seconds_count", lambda i: 23 * i, actor="build_report")
    put("reports_actor_duration_seconds_sum", lambda i: 60 * i, actor="build_report")
    # A template version without one language's catalog: its users' reports worded in English.
    put("reports_user_fallbacks_total", lambda i: i // 8, fact="catalog")
    put("reports_user_fallbacks_total", lambda i: 3 * i, fact="locale")
    put("up", 1)
    return series


def backfill(data: Path, series: dict[str, list[float]], instances: tuple[str, ...], end: int) -> None:
    """Write ``series`` as scraped from each of ``instances`` (job ``reports``) into a Prometheus
    data directory, with promtool's backfill."""
    start = end - FLEET_STEPS * FLEET_STEP_SECONDS
    lines = []
    for name, values in series.items():
        for instance in instances:
            # OpenMetrics: no space after a label's comma.
            first = "" if name.endswith("{}") else ","
            labelled = name.replace("{", f'{{job="reports",instance="{instance}"{first}', 1)
            lines.extend(f"{labelled} {value} {start + i * FLEET_STEP_SECONDS}" for i, value in enumerate(values))
    source = data.with_suffix(".om")
    source.write_text("\n".join(lines) + "\n# EOF\n")
    result = subprocess.run(
        [binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def without_instance(answer: dict[str, Any], expr: str) -> dict[tuple[tuple[str, str], ...], float]:
    """An answer's series with their ``instance`` label taken off: those an expression keeps per
    exporter (is this exporter up?) then say the same of each."""
    assert answer["status"] == "success", f"{expr}: {answer}"
    data = answer["data"]
    if data["resultType"] == "scalar":
        return {(): float(data["result"][1])}
    found: dict[tuple[tuple[str, str], ...], float] = {}
    for sample in data["result"]:
        labels = tuple(sorted((k, v) for k, v in sample["metric"].items() if k != "instance"))
        value = round(float(sample["value"][1]), 9)
        assert found.setdefault(labels, value) == value, f"{expr}: exporters disagree on {labels}"
    return found


def test_two_exporters_serving_the_same_figures_give_every_panel_and_alert_the_figures_of_one(tmp_path):
    """A real Prometheus answers every dashboard and alert expression over an hour of one fleet's
    figures, once scraped from one exporter and once from two: the answers must be the same."""
    prometheus_binary = binary("prometheus")
    end = int(time.time()) // 60 * 60 - 600
    series = fleet_series(end)
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\n")
    answers: dict[tuple[str, ...], dict[str, dict[tuple[tuple[str, str], ...], float]]] = {}
    expressions = dashboard_expressions() + [(f"alert {name}", expr) for name, expr in alert_expressions()]
    for instances in (ONE_EXPORTER, TWO_EXPORTERS):
        data = tmp_path / f"data-{len(instances)}"
        backfill(data, series, instances, end)
        port = free_port()
        log_path = tmp_path / f"prometheus-{len(instances)}.log"
        with running(
            [
                prometheus_binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                "--storage.tsdb.retention.time=3650d",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            log_path,
        ) as process:
            prometheus = Prometheus(port, process, log_path)
            wait_until(prometheus.ready, timeout=30, what="Prometheus to be ready")
            answers[instances] = {
                source: without_instance(prometheus.api("/api/v1/query", query=expr, time=str(end)), expr)
                for source, expr in expressions
            }
    one, two = answers[ONE_EXPORTER], answers[TWO_EXPORTERS]

    # The figures of one exporter are the fleet's.
    (completion,) = [source for source, _ in expressions if source.startswith("panel 'Period completion'")]
    assert one[completion] == {
        (("period", "2026-08"),): 1.0,
        (("period", "2026-09"),): 0.9,
        (("period", "2026-10"),): 0.7,
    }
    (pending,) = [source for source, expr in expressions if source.startswith("panel 'Periods'") and "pending" in expr]
    assert one[pending] == {
        (("period", "2026-08"),): 0.0,
        (("period", "2026-09"),): 100.0,
        (("period", "2026-10"),): 300.0,
        (("period", "2026-11"),): 240.0,
    }
    # Stuck 8 hours after its trigger; 2026-10's pending items all wait for their users' morning.
    assert one["alert ReportsPeriodIncomplete"] == {(("period", "2026-09"),): 8.0}
    for source, expr in expressions:
        if source != "alert ReportsExporterDown" and source != "alert ReportsExporterSourceDown":
            assert one[source], f"{source}: no data for {expr}"

    # And two exporters change none of them.
    differ = [
        f"{source}:\n  {' '.join(expr.split())}\n  one exporter:  {one[source]}\n  two exporters: {two[source]}"
        for source, expr in expressions
        if one[source] != two[source]
    ]
    assert not differ, "\n".join(differ)


# --- A real Prometheus -------------------------------------------------------------------------


@contextlib.contextmanager
def running(command: list[str], log_path: Path, *, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """Run ``command`` with its output in ``log_path``; terminate it (then kill it) however the block ends."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Prometheus:
    def __init__(self, port: int, process: subprocess.Popen, log_path: Path) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.process = process
        self.log_path = log_path

    def api(self, path: str, **params: str) -> dict[str, Any]:
        status, body = http_get(f"{self.base}{path}?{urllib.parse.urlencode(params)}")
        try:
            return json.loads(body)
        except ValueError:
            raise AssertionError(f"HTTP {status} from {path}: {body[:500]!r}") from None

    def query(self, expr: str) -> dict[str, Any]:
        """An instant query at now: Prometheus's whole answer (status, data or error)."""
        return self.api("/api/v1/query", query=expr, time=f"{time.time():.3f}")

    def vector(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        answer = self.query(expr)
        assert answer["status"] == "success", answer
        return {tuple(sorted(s["metric"].items())): float(s["value"][1]) for s in answer["data"]["result"]}

    def ready(self) -> bool:
        assert self.process.poll() is None, f"Prometheus exited:\n{self.log_path.read_text(errors='replace')}"
        try:
            return http_get(f"{self.base}/-/ready")[0] == 200
        except OSError:
            return False

    def scrapes(self) -> int:
        """How many times Prometheus has scraped each exporter so far (the least of them)."""
        return int(min(self.vector('count_over_time(up{job="reports"}[1h])').values(), default=0))


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_real_prometheus_answers_every_dashboard_and_alert_expression_during_a_real_run(
    settings, sessions, smtp_server, start_workers, tmp_path
):
    prometheus_binary = binary("prometheus")
    settings = replace(settings, smtp_url=smtp_server.url)
    load_users(sessions, count=USERS, period=PERIOD, inactive_every=10_000)
    refused = {f"user{user_id}@example.test" for user_id in REFUSED}
    smtp_server.handler.fault = lambda rcpt, attempt: "550 5.1.1 No such user" if rcpt in refused else None
    # Stretch the run over a few seconds, so Prometheus sees it under way and not only its end.
    smtp_server.handler.delay_seconds = 0.3

    # Two exporters on one database and Redis, as a rolling deploy runs for a while: the
    # dashboard and the alerts must show the figures of one.
    exporter_ports, prometheus_port = (free_port(), free_port()), free_port()
    targets = ", ".join(f'"127.0.0.1:{port}"' for port in exporter_ports)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {json.dumps(str(ALERTS))}\n"
        "scrape_configs:\n  - job_name: reports\n    scrape_interval: 1s\n    scrape_timeout: 1s\n"
        f"    static_configs:\n      - targets: [{targets}]\n"
    )
    with contextlib.ExitStack() as stack:
        for port in exporter_ports:
            stack.enter_context(
                running(
                    [sys.executable, "-m", "reports", "exporter", "--host", "127.0.0.1", "--port", str(port)],
                    # Figures as they are at each 1 s scrape, as the test's timing assumes.
                    tmp_path / f"exporter-{port}.log",
                    env={**os.environ, **settings.as_environ(), "EXPORTER_CACHE_SECONDS": "0"},
                )
            )
        log_path = tmp_path / "prometheus.log"
        process = stack.enter_context(
            running(
                [
                    prometheus_binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prometheus_port}",
                ],
                log_path,
            )
        )
        prometheus = Prometheus(prometheus_port, process, log_path)
        wait_until(prometheus.ready, timeout=30, what="Prometheus to be ready")
        wait_until(
            lambda: len(prometheus.vector('up{job="reports"} == 1')) == len(exporter_ports),
            timeout=30,
            what="Prometheus to scrape both exporters:\n"
            + "\n".join(path.read_text() for path in sorted(tmp_path.glob("exporter-*.log"))),
        )

        start_workers(settings, processes=1, threads=4)
        triggered = run_cli(settings, "trigger", PERIOD)
        assert triggered.returncode == 0, triggered.stderr

        def complete() -> bool:
            with sessions.begin() as session:
                return count(session, Period.parse(PERIOD)).complete

        wait_until(complete, timeout=60, what="the period to complete")

        # Prometheus has the final figures, then a few scrapes more (so rates have samples after the end).
        def scraped_complete() -> bool:
            items: dict[str, dict[str, float]] = {}
            for labels, value in prometheus.vector(f'reports_period_items{{period="{PERIOD}"}}').items():
                items.setdefault(dict(labels)["instance"], {})[dict(labels)["state"]] = value
            planned = prometheus.vector(f'reports_period_planned{{period="{PERIOD}"}}')
            final = {"pending": 0, "delivered": USERS - len(REFUSED), "skipped": 0, "dead": len(REFUSED)}
            return list(planned.values()) == [1.0] * len(exporter_ports) and list(items.values()) == [final] * len(
                exporter_ports
            )

        wait_until(scraped_complete, timeout=15, what="Prometheus to scrape the completed period")
        after = prometheus.scrapes()
        wait_until(lambda: prometheus.scrapes() >= after + 3, timeout=15, what="three more scrapes")

        # The period's figures on the dashboard are those of one exporter (bar the delivery rate,
        # which has no final figure).
        shown = {}
        for source, expr in dashboard_expressions():
            if source != "panel 'Period progress' D" and source.startswith(
                ("panel 'Periods' ", "panel 'Period progress' ", "panel 'Period completion' ")
            ):
                for labels, value in prometheus.vector(expr).items():
                    if dict(labels) == {"period": PERIOD}:
                        shown[source] = value
        assert shown == {
            "panel 'Period progress' A": USERS - len(REFUSED),  # delivered
            "panel 'Period progress' B": len(REFUSED),  # dead
            "panel 'Period progress' C": USERS,  # total
            "panel 'Period progress' E": 0,  # scheduled
            "panel 'Period completion' A": 1.0,
            "panel 'Periods' A": 1,  # planned
            "panel 'Periods' B": 0,  # pending
            "panel 'Periods' C": USERS - len(REFUSED),  # delivered
            "panel 'Periods' D": 0,  # skipped
            "panel 'Periods' E": len(REFUSED),  # dead
            "panel 'Periods' F": USERS,  # total
            "panel 'Periods' G": pytest.approx(time.time() * 1000, abs=120_000),  # triggered (ms)
            "panel 'Periods' H": 0,  # scheduled
        }
        stored = prometheus.vector(
            next(expr for source, expr in dashboard_expressions() if "'Dead letters stored'" in source)
        )
        assert stored == {(("replayed", "false"),): len(REFUSED), (("replayed", "true"),): 0}

        # Every rule is loaded, and every evaluation so far went without an error.
        groups = prometheus.api("/api/v1/rules")["data"]["groups"]
        loaded = {rule["name"]: rule for group in groups for rule in group["rules"]}
        assert sorted(loaded) == sorted(name for name, _ in alert_expressions())
        for name, rule in loaded.items():
            assert rule["health"] == "ok", f"{name}: {rule.get('lastError')}"

        failures = []
        expressions = [
            (source, expr, not any(metric in expr for metric in NO_DATA_IN_THIS_RUN))
            for source, expr in dashboard_expressions()
        ]
        # The alert conditions (bar the failure rate: 3 of 40 died) do not hold in this healthy run,
        # so their expressions may rightly return nothing.
        expressions += [(f"alert {name}", expr, False) for name, expr in alert_expressions()]
        for source, expr, needs_data in expressions:
            answer = prometheus.query(expr)
            data = answer.get("data", {})
            result = data.get("result") or []
            print(
                f"{answer['status']:<8} {data.get('resultType', '-'):<7} {len(result):>3} series  "
                f"{source}: {' '.join(expr.split())}"
            )
            if answer["status"] != "success" or data["resultType"] not in ("vector", "scalar"):
                failures.append(f"{source}: {answer}")
            elif needs_data and not result:
                failures.append(f"{source}: no data for {' '.join(expr.split())}")
        assert not failures, "\n".join(failures)
