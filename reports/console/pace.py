"""A running period's pace: its rate from the progress the console has read lately, and the time
left at that rate. Samples are kept in the web process; a fresh process starts from none."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

#: How far back the rate looks, in seconds: long enough to smooth the workers' bursts.
WINDOW_SECONDS = 60.0

#: Reads kept per period at most, however many operators watch it.
MAX_SAMPLES = 600

#: Shortest span of samples a rate is given for, in seconds.
MIN_SPAN_SECONDS = 1.0


@dataclass(frozen=True)
class Pace:
    #: Items finished per second lately; ``None`` until two reads far enough apart.
    per_second: float | None
    #: Seconds until nothing is pending at that rate; ``None`` without a rate, or a rate of 0.
    eta_seconds: float | None


def pace(samples: list[tuple[float, int]], pending: int) -> Pace:
    """The pace from ``(seconds, finished)`` samples, oldest first, with ``pending`` items left."""
    if len(samples) < 2 or samples[-1][0] - samples[0][0] < MIN_SPAN_SECONDS:
        return Pace(None, None)
    (start, first), (end, last) = samples[0], samples[-1]
    rate = max(last - first, 0) / (end - start)
    if pending == 0:
        return Pace(rate, 0.0)
    return Pace(rate, pending / rate if rate > 0 else None)


class Sampler:
    """The last :data:`WINDOW_SECONDS` of reads of each period's finished count, shared by requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: dict[str, deque[tuple[float, int]]] = {}

    def add(self, period: str, at: float, finished: int, pending: int) -> Pace:
        """Note a read at ``at`` (monotonic seconds) and return the period's pace."""
        with self._lock:
            samples = self._samples.setdefault(period, deque(maxlen=MAX_SAMPLES))
            if samples and finished < samples[-1][1]:
                samples.clear()  # a replay set items back to pending: start over
            samples.append((at, finished))
            while samples and at - samples[0][0] > WINDOW_SECONDS:
                samples.popleft()
            return pace(list(samples), pending)


def describe_eta(seconds: float | None) -> str:
    """``12 s``, ``4 min``, ``2 h 5 min``; ``—`` when unknown."""
    if seconds is None:
        return "—"
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 90 else f"{minutes // 60} h {minutes % 60} min"
