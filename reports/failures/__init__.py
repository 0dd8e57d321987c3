"""Messages that failed for good: the dead-letter store, its replay, and the alerts."""
