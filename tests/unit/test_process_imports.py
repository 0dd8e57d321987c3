"""What a process imports: the SQS client (boto3, a sixth of a worker's imports) only where
BROKER_URL names SQS, so a worker, the scheduler, the exporter and every `reports` command on
Redis or RabbitMQ start without it; and a `reports` command only its own module of the CLI's."""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import reports.cli
from reports.cli.app import COMMAND_MODULES, cli

ROOT = Path(__file__).resolve().parents[2]
SQS_LIBRARIES = {"boto3", "botocore", "dramatiq_sqs"}
#: What the Procfile's processes import: the workers, every `reports` command, the scheduler, the exporter.
ENTRY_POINTS = (
    "actors",
    *sorted({f"reports.cli.{module}" for module in COMMAND_MODULES.values()}),
    "scheduler.process",
    "reports.ops.metrics",
)


def modules_after(statements: list[str], broker_url: str, tmp_path: Path) -> set[str]:
    """Every module a fresh interpreter has loaded after running ``statements``."""
    environ = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "DATABASE_URL": f"sqlite:///{tmp_path}/reports.db",
        "BROKER_URL": broker_url,
        "REDIS_URL": "redis://127.0.0.1:6379/15",
    }
    # After a marker: what the statements print (a command's help) comes before it.
    code = "; ".join([*statements, "import sys", "print('---', *sys.modules)"])
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return set(result.stdout.rpartition("---")[2].split())


def top_level_modules_after_importing(entry_points: tuple[str, ...], broker_url: str, tmp_path: Path) -> set[str]:
    loaded = modules_after([f"import {name}" for name in entry_points], broker_url, tmp_path)
    return {name.split(".")[0] for name in loaded}


@pytest.mark.parametrize("broker_url", ["redis://127.0.0.1:6379/15", "amqp://guest:guest@127.0.0.1:5672/"])
def test_processes_on_redis_or_rabbitmq_never_import_the_sqs_client(broker_url: str, tmp_path: Path) -> None:
    imported = top_level_modules_after_importing(ENTRY_POINTS, broker_url, tmp_path)

    assert "dramatiq" in imported  # the imports did run
    assert not imported & SQS_LIBRARIES


def test_a_worker_on_sqs_imports_the_sqs_client(tmp_path: Path) -> None:
    broker_url = "sqs://us-east-1/reports?endpoint_url=http://127.0.0.1:9"  # nothing listens: nothing is asked

    assert top_level_modules_after_importing(("actors",), broker_url, tmp_path) >= SQS_LIBRARIES


def test_a_command_loads_its_own_module_of_the_cli_and_no_other(tmp_path: Path) -> None:
    statements = ["from reports.cli import main", "main(['progress', '--help'])"]
    loaded = modules_after(statements, "redis://127.0.0.1:6379/15", tmp_path)

    assert {name for name in loaded if name.startswith("reports.cli.")} == {"reports.cli.app", "reports.cli.periods"}
    assert not {"reports.web", "reports.ops.demo", "reports.ops.metrics", "prometheus_client"} & loaded


def test_each_command_is_found_in_the_module_that_defines_it() -> None:
    for module in pkgutil.iter_modules(reports.cli.__path__):
        importlib.import_module(f"reports.cli.{module.name}")

    defined_in = {name: command.callback.__module__ for name, command in cli.commands.items() if command.callback}
    assert defined_in == {name: f"reports.cli.{module}" for name, module in COMMAND_MODULES.items()}
