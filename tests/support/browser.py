"""Debian's Chromium under Playwright (it never downloads a browser of its own)."""

from __future__ import annotations

import os
import shutil
from typing import Any

from tests.support.environment import missing

CHROMIUM = "/usr/bin/chromium"

#: Nothing the browser would fetch on its own: no updates, sync or field trials.
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def chromium_path() -> str:
    """The system's Chromium; skips the test locally (fails it in CI) when it is not installed."""
    path = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    if path is None:
        missing("Chromium is not installed (Debian package chromium; scripts/system-packages installs it)")
    assert path is not None
    return path


def launch(playwright: Any) -> Any:
    return playwright.chromium.launch(executable_path=chromium_path(), args=ARGS)
