"""The Dramatiq entry point: ``dramatiq actors`` imports this package and nothing else.

The broker must be set before any ``@dramatiq.actor`` runs: an actor binds to the global
broker when it is declared, and without one Dramatiq silently makes a default broker on
localhost whose worker consumes nothing.
"""

from __future__ import annotations

import dramatiq
from dramatiq.middleware import Retries

from actors.runtime import Runtime
from reports.broker import build_broker
from reports.failures import FailedItems
from reports.settings import Settings

runtime = Runtime(Settings.from_env())
broker = build_broker(runtime.settings)
broker.add_middleware(FailedItems(lambda: runtime.context.sessions), before=Retries)
dramatiq.set_broker(broker)

from actors import fanout, report  # noqa: E402,F401  (declared against the broker set above)
