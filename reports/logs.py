"""How a process of this project that sets up its own logging (the scheduler, the exporter) logs."""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: str) -> None:
    """Log to stderr at ``level`` (LOG_LEVEL, checked with the settings)."""
    logging.basicConfig(stream=sys.stderr, level=level.upper(), format=FORMAT)
    # pika logs each connection it opens and closes at INFO, and the exporter opens one a scrape;
    # its warnings and errors still show (Dramatiq's worker processes keep only its CRITICAL).
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("pika").setLevel(logging.WARNING)
