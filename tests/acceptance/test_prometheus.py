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
    assert len(names) == 12


# --- promtool ----------------------------------------------------------------------------------


def test_promtool_checks_the_alert_rules():
    result = subprocess.run(
        [binary("promtool"), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 12 rules found" in result.stdout


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


def test_promtool_proves_the_period_completion_panel_shows_only_planned_periods(tmp_path):
    """A period whose walk is under way has recorded only some of its users: finished over those
    would read nearly done; a period just triggered has none (0/0). Neither gets a bar."""
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
    for period, figures in series.items():
        labels = f'job="reports", instance="localhost:9300", period="{period}"'
        lines.append(f"      - series: 'reports_period_planned{{{labels}}}'\n        values: '{figures['planned']}x5'")
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
        """How many times Prometheus has scraped the exporter so far."""
        return int(sum(self.vector('count_over_time(up{job="reports"}[1h])').values()))


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

    exporter_port, prometheus_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {json.dumps(str(ALERTS))}\n"
        "scrape_configs:\n  - job_name: reports\n    scrape_interval: 1s\n    scrape_timeout: 1s\n"
        f'    static_configs:\n      - targets: ["127.0.0.1:{exporter_port}"]\n'
    )
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            running(
                [sys.executable, "-m", "reports", "exporter", "--host", "127.0.0.1", "--port", str(exporter_port)],
                # Figures as they are at each 1 s scrape, as the test's timing assumes.
                tmp_path / "exporter.log",
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
            lambda: prometheus.vector('up{job="reports"} == 1'),
            timeout=30,
            what=f"Prometheus to scrape the exporter:\n{(tmp_path / 'exporter.log').read_text()}",
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
            items = {
                dict(labels)["state"]: value
                for labels, value in prometheus.vector(f'reports_period_items{{period="{PERIOD}"}}').items()
            }
            planned = prometheus.vector(f'reports_period_planned{{period="{PERIOD}"}}')
            return list(planned.values()) == [1.0] and items == {
                "pending": 0,
                "delivered": USERS - len(REFUSED),
                "skipped": 0,
                "dead": len(REFUSED),
            }

        wait_until(scraped_complete, timeout=15, what="Prometheus to scrape the completed period")
        after = prometheus.scrapes()
        wait_until(lambda: prometheus.scrapes() >= after + 3, timeout=15, what="three more scrapes")

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
