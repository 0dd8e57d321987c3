"""The docs' Python files (the reference hook, the samples script), loaded by path: they are not packages."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from tests.support.environment import REPO


def load(relative: str) -> ModuleType:
    """The module at ``relative`` (to the repository), run once per call under a name of its own."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(f"docs_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
