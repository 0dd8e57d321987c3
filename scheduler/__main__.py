import signal
import sys


def _stop_before_starting(_signum: int, _frame: object) -> None:
    # A deploy's SIGTERM can arrive while the imports below still run (seconds on a busy machine):
    # nothing has started yet, so it is a clean stop, not a kill. The scheduler installs its own
    # handlers before it starts.
    raise SystemExit(0)


signal.signal(signal.SIGTERM, _stop_before_starting)

from scheduler.process import main  # noqa: E402  (after the handler: importing takes the time)

sys.exit(main())
