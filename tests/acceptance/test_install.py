"""The build the deploy guide gives (`pip install --no-deps .`): the code in site-packages, the
templates in the app's folder, where the platform runs every Procfile line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reports.clock import utcnow
from reports.periods import Period
from tests.support.environment import REPO

pytestmark = pytest.mark.acceptance


def test_built_as_the_deploy_guide_builds_it_the_commands_run_from_the_apps_folder(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(".git", ".venv", "var", "build", "site", "*.egg-info", "__pycache__"),
    )
    installed = tmp_path / "site-packages"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            installed,
            source,
        ],
        check=True,
        timeout=300,
    )
    app = tmp_path / "app"
    shutil.copytree(REPO / "templates", app / "templates")
    (app / "var").mkdir()
    environment = {**os.environ, "PYTHONPATH": str(installed), "DATABASE_URL": f"sqlite:///{app / 'var' / 'r.db'}"}

    def reports(*args: str, cwd: Path = app) -> subprocess.CompletedProcess[str]:
        command = [str(installed / "bin" / "reports"), *args]
        return subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=120)

    upgraded = reports("db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    assert reports("seed", "--users", "3").returncode == 0
    period = str(Period.containing(utcnow()).previous())
    previewed = reports("preview", period, "--sample", "1", "--out", str(tmp_path / "preview"))
    assert previewed.returncode == 0, previewed.stderr
    assert list((tmp_path / "preview").glob("*.eml")), previewed.stdout
    # Elsewhere, no templates: one line that says where it looked.
    elsewhere = reports("progress", period, cwd=tmp_path)
    assert elsewhere.returncode == 2 and elsewhere.stderr.strip().splitlines() == [
        f"error: REPORT_TEMPLATE_VERSION 'v2' is not a folder in TEMPLATES_DIR ({tmp_path / 'templates'})."
    ], elsewhere.stderr
