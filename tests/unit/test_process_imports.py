"""What a process imports: the SQS client (boto3, a sixth of a worker's imports) only where
BROKER_URL names SQS, so a worker, the scheduler, the exporter and every `reports` command on
Redis or RabbitMQ start without it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SQS_LIBRARIES = {"boto3", "botocore", "dramatiq_sqs"}
#: What the Procfile's processes import: the workers, the `reports` command, the scheduler, the exporter.
ENTRY_POINTS = ("actors", "reports.cli.app", "scheduler.process", "reports.ops.metrics")


def top_level_modules_after_importing(entry_points: tuple[str, ...], broker_url: str, tmp_path: Path) -> set[str]:
    environ = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "DATABASE_URL": f"sqlite:///{tmp_path}/reports.db",
        "BROKER_URL": broker_url,
        "REDIS_URL": "redis://127.0.0.1:6379/15",
    }
    code = "; ".join(
        [*(f"import {name}" for name in entry_points), "import sys", "print(*{m.split('.')[0] for m in sys.modules})"]
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


@pytest.mark.parametrize("broker_url", ["redis://127.0.0.1:6379/15", "amqp://guest:guest@127.0.0.1:5672/"])
def test_processes_on_redis_or_rabbitmq_never_import_the_sqs_client(broker_url: str, tmp_path: Path) -> None:
    imported = top_level_modules_after_importing(ENTRY_POINTS, broker_url, tmp_path)

    assert "dramatiq" in imported  # the imports did run
    assert not imported & SQS_LIBRARIES


def test_a_worker_on_sqs_imports_the_sqs_client(tmp_path: Path) -> None:
    broker_url = "sqs://us-east-1/reports?endpoint_url=http://127.0.0.1:9"  # nothing listens: nothing is asked

    assert top_level_modules_after_importing(("actors",), broker_url, tmp_path) >= SQS_LIBRARIES
